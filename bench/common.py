"""Small helpers shared by the benchmarks: timing, peak memory, machine description, result printing."""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float


def timed(fn: Callable[[], Any]) -> tuple[Any, Timing]:
    """Run fn once; wall and process CPU seconds."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    return result, Timing(time.perf_counter() - wall0, time.process_time() - cpu0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def emit(name: str, result: dict[str, Any]) -> None:
    """Print one benchmark's result as a JSON line (collected by bench/run_all.py)."""
    print(json.dumps({"benchmark": name, **result}, default=str))
