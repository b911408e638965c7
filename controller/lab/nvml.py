"""Recorded GPU faults for the supervisor's simulated nodes (the one boundary this machine cannot
reach: NVML without a GPU). In the `faultlens run` process of a campaign scenario, the supervisor's
per-node recorded NVML backend (controller/supervisor/gpus.py) gets the campaign's timeline for that
node: healthy until a training process writes <lab>/gpu/<node>.fire, then the entries of the named
timeline from the campaign YAML (Xid 79, double-bit ECC, row-remap failure, thermal slowdown) at
their offsets, through the real NVML source.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from faultlens.controller.lab.plan import InjectionPlan

NODE_PREFIX = "node-"


class MarkerClock:
    """Seconds on a recorded timeline: held below `fault_at` until the marker file appears, then the
    offset from the moment it was seen. The marker is renamed once seen, so a later attempt's
    backend on the same node starts healthy again."""

    def __init__(
        self, marker: Path, fault_at: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.marker = marker
        self.fault_at = fault_at
        self._monotonic = monotonic
        self._start = monotonic()
        self._fired_at: float | None = None
        self.fired_doc: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> float:
        now = self._monotonic()
        with self._lock:
            if self._fired_at is None and self.marker.exists():
                try:
                    self.fired_doc = json.loads(self.marker.read_text())
                    self.marker.rename(self.marker.with_suffix(".fired"))
                except (OSError, ValueError):
                    self.fired_doc = {}
                self._fired_at = now
        if self._fired_at is None:
            return min(now - self._start, self.fault_at - 1.0)
        # a reader that opened at t0 sees the fault from its moment
        return self.fault_at + (now - self._start)


def fault_timeline(
    base: Mapping[str, Any], entries: Sequence[Mapping[str, Any]], gpu: int, fault_at: float
) -> dict[str, Any]:
    """`base` (a node's healthy timeline) with the fault `entries` (offsets `at` from the fault) on
    GPU `gpu`.
    """
    timeline = [
        dict(entry, at=fault_at + float(entry.get("at", 0.0)), gpu=gpu) for entry in entries
    ]
    return {**base, "timeline": [*base.get("timeline", []), *timeline]}


def install_supervisor_gpus(plan: InjectionPlan, lab_dir: Path) -> None:
    """Replace the supervisor's recorded-backend factory with one that reads the campaign's GPU
    faults.
    """
    from faultlens.collectors.sources.recorded_backend import RecordedBackend
    from faultlens.controller.supervisor import gpus

    gpu_faults = {f.node: f for f in plan.faults if f.kind == "gpu" and f.node}
    original = gpus.recorded_backend
    fault_at = getattr(gpus, "FAULT_AT_S", 1_000_000.0)

    def recorded_backend(
        node_index: int, n_gpus: int, clock: Any, *args: Any, **kwargs: Any
    ) -> Any:
        node = f"{NODE_PREFIX}{node_index}"
        fault = gpu_faults.get(node)
        if fault is None:
            return original(node_index, n_gpus, clock, *args, **kwargs)
        entries = plan.gpu_timelines.get(str(fault.params.get("timeline")), ())
        gpu = int(fault.local_rank or 0)
        timeline = fault_timeline(gpus.node_timeline(node_index, n_gpus), entries, gpu, fault_at)
        return RecordedBackend(
            timeline, clock=MarkerClock(lab_dir / "gpu" / f"{node}.fire", fault_at)
        )

    gpus.recorded_backend = recorded_backend
