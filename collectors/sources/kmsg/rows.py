"""Kernel-log events into gpu_events rows (source kmsg), with the GPU index and UUID of the node's
devices.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.kmsg.events import KernelGpuEvent
from faultlens.collectors.sources.source import NodeIdentity


def device_directory(devices: Iterable[GpuDevice]) -> dict[str, GpuDevice]:
    return {device.pci_bus_id: device for device in devices if device.pci_bus_id}


def events_to_rows(events: Iterable[KernelGpuEvent], identity: NodeIdentity, *,
                   devices: Mapping[str, GpuDevice] | None = None, default_ts_ns: int | None = None,
                   host_from_line: bool = False) -> list[dict[str, Any]]:
    """gpu_events rows (source kmsg). `devices` maps NVML bus ids to GPUs so rows carry gpu_index
    and uuid; `host_from_line` takes the node from the line's hostname (syslog, journal) when it has
    one."""
    rows = []
    now = default_ts_ns if default_ts_ns is not None else time.time_ns()
    for event in events:
        device = devices.get(event.pci_bus_id) if devices and event.pci_bus_id else None
        columns = identity.columns()
        if host_from_line and event.host:
            columns["node"] = event.host
        rows.append(
            {
                "ts": event.ts_ns if event.ts_ns is not None else now,
                **columns,
                "gpu_index": device.index if device else None,
                "gpu_uuid": (device.uuid if device else None) or event.gpu_uuid,
                "pci_bus_id": event.pci_bus_id,
                "source": "kmsg",
                "kind": event.kind,
                "code": event.code,
                "message": event.message,
                "pid": event.pid,
                "process_name": event.process_name,
                "raw": event.raw,
            }
        )
    return rows
