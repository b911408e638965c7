"""Kernel-log GPU events: the event a line yields (KernelGpuEvent), the parse counts, the bad-line
error and the check that the store can hold an event."""

from __future__ import annotations

from dataclasses import dataclass, field

from faultlens.errors import FaultlensError

MAX_PID = 2**31 - 1  # Linux pids are at most 2^22 (PID_MAX_LIMIT); anything past int32 is not a pid
MIN_TS_NS, MAX_TS_NS = 0, 2**63 - 1  # what the store's timestamp[ns] column holds (1970 .. 2262)


@dataclass(frozen=True)
class KernelGpuEvent:
    """One GPU event read from the kernel log (a gpu_events row before identity is added)."""

    # xid, sxid, gpu_lost, ecc_dbe, remap_pending, remap_failure, retired_page_pending,
    # recovery_action
    kind: str
    code: int | None
    pci_bus_id: str | None  # NVML form 00000000:BB:DD.F
    message: str
    raw: str
    pid: int | None = None
    process_name: str | None = None
    ts_ns: int | None = None
    host: str | None = None
    gpu_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    caused_by_xid: int | None = None
    device: str | None = None  # nvidia-nvswitchN for SXid
    line_no: int | None = None


@dataclass
class ParseStats:
    lines: int = 0
    events: int = 0
    bad_lines: int = 0
    ignored: int = 0
    # (line number, reason), first 10
    bad_examples: list[tuple[int, str]] = field(default_factory=list)


class BadLine(ValueError, FaultlensError):
    pass


def _check_text(what: str, value: str | None) -> None:
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadLine(f"{what} is not valid text ({exc.reason} at character {exc.start})") from None


def check_event(event: KernelGpuEvent) -> None:
    """Refuse an event the store cannot hold (so that one bad line never fails the whole poll's
    batch).
    """
    if event.ts_ns is not None and not MIN_TS_NS <= event.ts_ns <= MAX_TS_NS:
        raise BadLine("time out of range (the store holds 1970..2262)")
    if event.pid is not None and not 0 <= event.pid <= MAX_PID:
        raise BadLine(f"pid out of range: {event.pid}")
    for what in ("message", "raw", "process_name", "host", "gpu_uuid", "device"):
        _check_text(what, getattr(event, what))
