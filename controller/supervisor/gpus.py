"""Simulated GPUs of the supervisor's nodes: a recorded NVML backend per node, sampled by the real
NVML source.

The demo has no GPU. Each simulated node gets a RecordedBackend
(collectors/sources/recorded_backend.py) with one GPU per local rank; its timeline is held at
"nothing happened" until a fault fires, then jumps to the fault's entries (Xid 79, then GPU lost),
so the hardware event lands in gpu_events at the moment the fault is injected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from faultlens.collectors.sources.recorded_backend import RecordedBackend

FAULT_AT_S = 1_000_000.0  # where a node's fault entries sit on its timeline


class FaultClock:
    """Seconds since start for a recorded timeline, held below FAULT_AT_S until `fire()`."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._start = monotonic()
        self._fired_at: float | None = None
        self._lock = threading.Lock()

    def fire(self) -> None:
        with self._lock:
            if self._fired_at is None:
                self._fired_at = self._monotonic()

    @property
    def fired(self) -> bool:
        return self._fired_at is not None

    def __call__(self) -> float:
        now = self._monotonic()
        if self._fired_at is None:
            return min(now - self._start, FAULT_AT_S - 1.0)
        return FAULT_AT_S + (now - self._fired_at)


def node_timeline(node_index: int, gpus: int, fault_gpu: int | None = None, fault: str | None = None
                  ) -> dict[str, Any]:
    """A timeline for one simulated node: healthy H100s; at the fault, GPU `fault_gpu` either falls
    off the bus (`fault="lost"`: Xid 79, then GPU lost) or overheats (`fault="hot"`: HW thermal
    slowdown, clocks down)."""
    devices = []
    for index in range(gpus):
        bus = 0x18 + 0x10 * index + node_index
        devices.append({
            "index": index,
            "uuid": f"GPU-{node_index:04x}{index:04x}-5a1e-4c0d-9f00-{node_index:06x}{index:06x}",
            "pci_bus_id": f"00000000:{bus:02X}:00.0",
            "name": "NVIDIA H100 80GB HBM3 (simulated)",
        })
    timeline: list[dict[str, Any]] = []
    if fault_gpu is not None and fault == "lost":
        timeline = [
            {
                "at": FAULT_AT_S,
                "gpu": fault_gpu,
                "event": {"kind": "xid", "code": 79, "message": "GPU has fallen off the bus."},
            },
            {
                "at": FAULT_AT_S + 0.05,
                "gpu": fault_gpu,
                "lost": "GPU is lost (NVML_ERROR_GPU_IS_LOST)",
            },
        ]
    elif fault_gpu is not None and fault == "hot":
        timeline = [
            {
                "at": FAULT_AT_S,
                "gpu": fault_gpu,
                "set": {
                    "temp_c": 93,
                    "hbm_temp_c": 96,
                    "clocks_event_reasons": 0x40,
                    "sm_clock_mhz": 1095,
                    "power_w": 301.0,
                },
            }
        ]
    return {
        "format_version": 1,
        "description": f"simulated node {node_index} of the faultlens demo",
        "defaults": {
            "temp_c": 61,
            "hbm_temp_c": 70,
            "power_w": 412.0,
            "sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619,
            "gpu_util_pct": 97,
            "mem_util_pct": 41,
            "mem_used_bytes": 61 * 2**30,
            "mem_total_bytes": 80 * 2**30,
            "clocks_event_reasons": 0,
            "ecc_sbe_volatile": 0,
            "ecc_dbe_volatile": 0,
            "remap_pending": False,
            "remap_failure": False,
            "recovery_action": 0,
        },
        "gpus": devices,
        "timeline": timeline,
    }


def recorded_backend(node_index: int, gpus: int, clock: FaultClock, fault_gpu: int | None = None,
                     fault: str | None = None) -> RecordedBackend:
    return RecordedBackend(node_timeline(node_index, gpus, fault_gpu, fault), clock=clock)
