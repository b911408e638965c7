"""The small interface every GPU telemetry backend implements (the real pynvml one, the recorded
timeline one).

A backend enumerates GPUs, reads one sample of one GPU as gpu_samples columns, and waits for GPU
events (Xid, recovery-action changes). It raises only the exceptions defined here:
BackendUnavailable from open() (no driver, no library, no permission) and GpuLostError from sample()
(the GPU fell off the bus). Everything else a backend cannot read becomes None in the reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from faultlens.collectors.store.schema import IDENTITY_FIELDS, TABLES
from faultlens.errors import FaultlensError

_NOT_METRICS = {f.name for f in IDENTITY_FIELDS} | {"source", "gpu_name"}
SAMPLE_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in TABLES["gpu_samples"] if f.name not in _NOT_METRICS
)
"""The metric columns of gpu_samples a backend fills (identity, source and name are filled by the
source)."""

EVENT_KINDS: frozenset[str] = frozenset(
    {
        "xid",
        "sxid",
        "ecc_dbe",
        "ecc_sbe_storm",
        "remap_pending",
        "remap_failure",
        "retired_page_pending",
        "recovery_action",
        "gpu_lost",
        "thermal_slowdown_start",
        "thermal_slowdown_end",
        "power_slowdown_start",
        "power_slowdown_end",
        "nvlink_error",
        "pcie_replay",
    }
)
"""gpu_events.kind values (interface 2 of the helper brief)."""

EVENT_SOURCES: frozenset[str] = frozenset({"nvml_event", "nvml_sample", "kmsg", "dcgm", "recorded"})

RECOVERY_ACTIONS: dict[int, str] = {
    0: "None",
    1: "GPU Reset Required",
    2: "Node Reboot Required",
    3: "Drain P2P",
    4: "Drain and Reset",
    5: "Recover IMEX Domain",
    6: "Bus Reset",
    7: "System Reboot",
}
"""NVML_GPU_RECOVERY_ACTION_* values and the words the driver prints for them."""


class BackendUnavailable(FaultlensError):
    """The backend cannot be used on this machine; str() is the reason (said once by the source)."""


class GpuLostError(FaultlensError):
    """The GPU is lost (NVML_ERROR_GPU_IS_LOST: fallen off the bus or otherwise inaccessible)."""

    def __init__(self, device: GpuDevice, reason: str = "GPU is lost") -> None:
        super().__init__(f"GPU {device.index} ({device.pci_bus_id or device.uuid}): {reason}")
        self.device = device
        self.reason = reason


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None  # NVML form 00000000:BB:DD.F
    name: str | None = None


@dataclass
class GpuReading:
    """One sample of one GPU: gpu_samples metric columns (None = not supported / not readable)."""

    values: dict[str, Any]
    reset_required: bool = False  # NVML_ERROR_RESET_REQUIRED answered some query
    errors: list[str] = field(default_factory=list)  # unexpected per-field errors, for diagnostics


@dataclass(frozen=True)
class BackendEvent:
    """An event a backend delivered: kind is a gpu_events kind (xid, recovery_action,
    ecc_sbe_storm...).
    """

    gpu_index: int | None
    kind: str
    code: int | None
    message: str
    # when the backend knows it; otherwise the source stamps the time of receipt
    ts_ns: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@runtime_checkable
class GpuBackend(Protocol):
    name: str
    sample_source: str  # gpu_samples.source of its samples
    event_source: str  # gpu_events.source of events from wait_events()
    delta_source: str  # gpu_events.source of events derived from sample changes

    def open(self) -> Sequence[GpuDevice]:
        """Initialise and enumerate GPUs; raises BackendUnavailable."""
        ...

    def sample(self, device: GpuDevice) -> GpuReading:
        """Read every gpu_samples metric of one GPU; raises GpuLostError."""
        ...

    def supports_events(self) -> bool:
        """Whether wait_events() can deliver anything (after open())."""
        ...

    def wait_events(self, timeout_s: float) -> list[BackendEvent]:
        """Block up to timeout_s for events; [] on timeout. Called from one thread only."""
        ...

    def close(self) -> None: ...
