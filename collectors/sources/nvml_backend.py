"""The real GPU backend: NVML through `pynvml` (the module shipped by nvidia-ml-py, 12.535 and
13.x).

Every gpu_samples metric is one NVML query; a query the GPU does not support
(NVML_ERROR_NOT_SUPPORTED, no permission, function missing in an older driver or binding) gives
None, never an error. NVML_ERROR_GPU_IS_LOST from any query raises GpuLostError for that GPU.
NVML_ERROR_RESET_REQUIRED marks the reading (the source turns it into a recovery_action event). Xid
and recovery-action events arrive through an NVML event set (nvmlEventSetWait).

Counter choices: ECC by location (DRAM, SRAM) reads the volatile counters, so they move together
with ecc_*_volatile; NVLink errors are the totals over all links (field values), summed per link
through nvmlDeviceGetNvLinkErrorCounter when the total fields are not supported; retired pages count
the pages per cause.

The sampling queries are NvmlBackend's base class, NvmlSampling
(collectors/sources/nvml_sampling.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from faultlens.collectors.sources.gpu_backend import BackendEvent, BackendUnavailable, GpuDevice
from faultlens.collectors.sources.gpu_deltas import recovery_action_text
from faultlens.collectors.sources.nvml_sampling import NvmlSampling, field_value
from faultlens.collectors.sources.pci import normalize_pci_bus_id

_MAX_EVENTS_PER_WAIT = 256


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip("\x00").strip() or None


class NvmlBackend(NvmlSampling):
    """GpuBackend over pynvml. `nvml` is the pynvml module (imported on open() when not given)."""

    name = "nvml"
    sample_source = "nvml"
    event_source = "nvml_event"
    delta_source = "nvml_sample"

    def __init__(self, nvml: Any = None, *, register_events: bool = True) -> None:
        self._nvml = nvml
        self._register_events = register_events
        self._handles: dict[int, Any] = {}
        self._by_address: dict[int, int] = {}
        self._event_set: Any = None
        self._initialised = False
        self._lock = threading.Lock()
        self._nvlink_links: dict[int, list[int]] = {}
        self._event_types: dict[int, str] = {}

    # -- lifecycle
    # ----------------------------------------------------------------------------------------------
    def open(self) -> Sequence[GpuDevice]:
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError as exc:
                raise BackendUnavailable(f"pynvml (nvidia-ml-py) is not installed: {exc}") from None
            self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendUnavailable(str(exc) or type(exc).__name__) from None
        except OSError as exc:  # a broken libnvidia-ml
            raise BackendUnavailable(f"cannot load libnvidia-ml: {exc}") from None
        self._initialised = True
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"nvmlDeviceGetCount: {exc}") from None
        devices = []
        for index in range(count):
            devices.append(self._describe(index))
        if self._register_events:
            self._setup_events(devices)
        return devices

    def _describe(self, index: int) -> GpuDevice:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            # a lost GPU may refuse a handle: it is still listed so the source reports it (sample()
            # raises)
            return GpuDevice(index=index)
        self._handles[index] = handle
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if address is not None:
            self._by_address[address] = index
        uuid = pci = name = None
        with contextlib.suppress(nvml.NVMLError):
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        with contextlib.suppress(nvml.NVMLError):
            pci = normalize_pci_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        with contextlib.suppress(nvml.NVMLError):
            name = _text(nvml.nvmlDeviceGetName(handle))
        return GpuDevice(index=index, uuid=uuid, pci_bus_id=pci, name=name)

    def _setup_events(self, devices: Sequence[GpuDevice]) -> None:
        nvml = self._nvml
        wanted = {nvml.nvmlEventTypeXidCriticalError: "xid"}
        recovery = getattr(nvml, "nvmlEventTypeGpuRecoveryAction", None)  # 13.x bindings
        if recovery is not None:
            wanted[recovery] = "recovery_action"
        storm = getattr(nvml, "nvmlEventTypeSingleBitEccErrorStorm", None)
        if storm is not None:
            wanted[storm] = "ecc_sbe_storm"
        self._event_types = wanted
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return
        registered = 0
        for device in devices:
            handle = self._handles.get(device.index)
            if handle is None:
                continue
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            except nvml.NVMLError:
                supported = nvml.nvmlEventTypeXidCriticalError
            mask = 0
            for bit in wanted:
                if supported & bit:
                    mask |= bit
            if not mask:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                registered += 1
            except nvml.NVMLError:
                # e.g. NOT_SUPPORTED for one type on this GPU: fall back to Xid only
                try:
                    nvml.nvmlDeviceRegisterEvents(
                        handle, nvml.nvmlEventTypeXidCriticalError, event_set
                    )
                    registered += 1
                except nvml.NVMLError:
                    continue
        if registered:
            self._event_set = event_set
        else:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)

    def close(self) -> None:
        nvml = self._nvml
        with self._lock:
            if self._event_set is not None:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            if self._initialised:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlShutdown()
                self._initialised = False
            self._handles.clear()

    # -- events
    # ----------------------------------------------------------------------------------------------
    def supports_events(self) -> bool:
        return self._event_set is not None

    def wait_events(self, timeout_s: float) -> list[BackendEvent]:
        nvml = self._nvml
        event_set = self._event_set
        if event_set is None:
            return []
        events: list[BackendEvent] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        while len(events) < _MAX_EVENTS_PER_WAIT:
            try:
                data = nvml.nvmlEventSetWait(event_set, timeout_ms)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == self._code("NVML_ERROR_TIMEOUT"):
                    break
                if not events:
                    raise
                break
            event = self._event(data)
            if event is not None:
                events.append(event)
            timeout_ms = 0  # drain what is already queued, then return
        return events

    def _event(self, data: Any) -> BackendEvent | None:
        address = ctypes.cast(data.device, ctypes.c_void_p).value
        index = self._by_address.get(address) if address is not None else None
        if index is None:
            try:
                index = self._nvml.nvmlDeviceGetIndex(data.device)
            except self._nvml.NVMLError:
                index = None
        kind = self._event_types.get(int(data.eventType))
        if kind is None:
            return None
        value = int(data.eventData)
        any_instance = getattr(self._nvml, "NVML_GPU_INSTANCE_ID_ANY", 0xFFFFFFFF)
        gi = int(data.gpuInstanceId)
        ci = int(data.computeInstanceId)
        gi_value = gi if gi != any_instance else None
        ci_value = (
            ci if ci != getattr(self._nvml, "NVML_COMPUTE_INSTANCE_ID_ANY", 0xFFFFFFFF) else None
        )
        mig = ""
        if gi_value is not None:
            mig = f" (MIG GPU-I {gi_value}" + (f" CI {ci_value})" if ci_value is not None else ")")
        if kind == "xid":
            message = (
                f"NVML Xid event {value}" if value != 999 else "NVML Xid event (unknown Xid, 999)"
            )
            return BackendEvent(index, "xid", value, message + mig, gpu_instance_id=gi_value,
                                compute_instance_id=ci_value)
        if kind == "recovery_action":
            return BackendEvent(
                index,
                "recovery_action",
                value,
                f"NVML GPU recovery action event: {recovery_action_text(value)}" + mig,
            )
        return BackendEvent(index, kind, None, "NVML single-bit ECC error storm event" + mig)


__all__ = ["NvmlBackend", "field_value"]
