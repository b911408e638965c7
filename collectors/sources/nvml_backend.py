"""The real GPU backend: NVML through `pynvml` (the module shipped by nvidia-ml-py, 12.535 and 13.x).

Every gpu_samples metric is one NVML query; a query the GPU does not support (NVML_ERROR_NOT_SUPPORTED, no
permission, function missing in an older driver or binding) gives None, never an error. NVML_ERROR_GPU_IS_LOST from
any query raises GpuLostError for that GPU. NVML_ERROR_RESET_REQUIRED marks the reading (the source turns it into a
recovery_action event). Xid and recovery-action events arrive through an NVML event set (nvmlEventSetWait).

Counter choices: ECC by location (DRAM, SRAM) reads the volatile counters, so they move together with
ecc_*_volatile; NVLink errors are the totals over all links (field values), summed per link through
nvmlDeviceGetNvLinkErrorCounter when the total fields are not supported; retired pages count the pages per cause.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

from faultlens.collectors.sources.gpu_backend import (
    BackendEvent,
    BackendUnavailable,
    GpuDevice,
    GpuLostError,
    GpuReading,
)
from faultlens.collectors.sources.gpu_deltas import recovery_action_text
from faultlens.collectors.sources.pci import normalize_pci_bus_id

# NVML return codes that mean "this GPU/driver cannot answer this query": the value becomes None quietly
_QUIET_ERRORS = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND",
                 "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "NVML_ERROR_NOT_FOUND")
_MAX_EVENTS_PER_WAIT = 256


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip("\x00").strip() or None


class NvmlBackend:
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

    # -- lifecycle -----------------------------------------------------------------------------------------------
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
            # a lost GPU may refuse a handle: it is still listed so the source reports it (sample() raises)
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
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
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

    # -- sampling ------------------------------------------------------------------------------------------------
    def _code(self, name: str) -> int | None:
        return getattr(self._nvml, name, None)

    def _call(self, reading: GpuReading, device: GpuDevice, column: str, fn: Callable[..., Any] | None,
              *args: Any, **kwargs: Any) -> Any:
        """One NVML query: None when not supported; GpuLostError when the GPU is lost."""
        nvml = self._nvml
        if fn is None:  # the binding lacks the function (older nvidia-ml-py)
            return None
        try:
            return fn(*args, **kwargs)
        except nvml.NVMLError as exc:
            self._classify(exc, reading, device, column)
            return None

    def _classify(self, exc: Exception, reading: GpuReading, device: GpuDevice, column: str) -> None:
        value = getattr(exc, "value", None)
        if value == self._code("NVML_ERROR_GPU_IS_LOST"):
            raise GpuLostError(device, str(exc)) from None
        if value == self._code("NVML_ERROR_RESET_REQUIRED"):
            reading.reset_required = True
            return
        if value in {self._code(name) for name in _QUIET_ERRORS}:
            return
        reading.errors.append(f"{column}: {exc}")

    def sample(self, device: GpuDevice) -> GpuReading:
        handle = self._handles.get(device.index)
        if handle is None:
            raise GpuLostError(device, "no NVML handle (GPU inaccessible)")
        reading = GpuReading(values={})
        self._sample_temperature(reading, device, handle)
        self._sample_power_clocks_memory(reading, device, handle)
        self._sample_ecc(reading, device, handle)
        self._sample_pages_and_rows(reading, device, handle)
        self._sample_links_and_fields(reading, device, handle)
        return reading

    def _fn(self, name: str) -> Callable[..., Any] | None:
        return getattr(self._nvml, name, None)

    def _sample_temperature(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """GPU temperature (a lost GPU raises GpuLostError)."""
        nvml, call, fn, v = self._nvml, self._call, self._fn, reading.values
        temperature_v = fn("nvmlDeviceGetTemperatureV")
        temp = None
        if temperature_v is not None:
            try:
                temp = temperature_v(handle, nvml.NVML_TEMPERATURE_GPU)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == self._code("NVML_ERROR_GPU_IS_LOST"):
                    raise GpuLostError(device, str(exc)) from None
                temp = None
        if temp is None:  # older drivers lack nvmlDeviceGetTemperatureV
            temp = call(reading, device, "temp_c", fn("nvmlDeviceGetTemperature"), handle, nvml.NVML_TEMPERATURE_GPU)
        v["temp_c"] = temp

    def _sample_power_clocks_memory(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """Power, energy, clocks, utilisation, memory and clock-event reasons."""
        nvml, call, fn, v = self._nvml, self._call, self._fn, reading.values
        power_mw = call(reading, device, "power_w", fn("nvmlDeviceGetPowerUsage"), handle)
        v["power_w"] = power_mw / 1000.0 if power_mw is not None else None
        v["energy_mj"] = call(reading, device, "energy_mj", fn("nvmlDeviceGetTotalEnergyConsumption"), handle)
        v["sm_clock_mhz"] = call(reading, device, "sm_clock_mhz", fn("nvmlDeviceGetClockInfo"), handle,
                                 nvml.NVML_CLOCK_SM)
        v["mem_clock_mhz"] = call(reading, device, "mem_clock_mhz", fn("nvmlDeviceGetClockInfo"), handle,
                                  nvml.NVML_CLOCK_MEM)
        util = call(reading, device, "gpu_util_pct", fn("nvmlDeviceGetUtilizationRates"), handle)
        v["gpu_util_pct"] = float(util.gpu) if util is not None else None
        v["mem_util_pct"] = float(util.memory) if util is not None else None

        memory = None
        memory_v2 = getattr(nvml, "nvmlMemory_v2", None)
        if memory_v2 is not None:
            memory = call(reading, device, "mem_used_bytes", fn("nvmlDeviceGetMemoryInfo"), handle, version=memory_v2)
        if memory is None:
            memory = call(reading, device, "mem_used_bytes", fn("nvmlDeviceGetMemoryInfo"), handle)
        v["mem_used_bytes"] = int(memory.used) if memory is not None else None
        v["mem_total_bytes"] = int(memory.total) if memory is not None else None

        reasons_fn = fn("nvmlDeviceGetCurrentClocksEventReasons") or fn("nvmlDeviceGetCurrentClocksThrottleReasons")
        v["clocks_event_reasons"] = call(reading, device, "clocks_event_reasons", reasons_fn, handle)

    def _sample_ecc(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """ECC error counters: totals and by memory location."""
        nvml, call, fn, v = self._nvml, self._call, self._fn, reading.values
        total_ecc = fn("nvmlDeviceGetTotalEccErrors")
        corrected, uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        v["ecc_sbe_volatile"] = call(reading, device, "ecc_sbe_volatile", total_ecc, handle, corrected, volatile)
        v["ecc_dbe_volatile"] = call(reading, device, "ecc_dbe_volatile", total_ecc, handle, uncorrected, volatile)
        v["ecc_sbe_aggregate"] = call(reading, device, "ecc_sbe_aggregate", total_ecc, handle, corrected, aggregate)
        v["ecc_dbe_aggregate"] = call(reading, device, "ecc_dbe_aggregate", total_ecc, handle, uncorrected, aggregate)
        by_location = fn("nvmlDeviceGetMemoryErrorCounter")
        dram, sram = nvml.NVML_MEMORY_LOCATION_DRAM, nvml.NVML_MEMORY_LOCATION_SRAM
        v["ecc_dram_corrected"] = call(reading, device, "ecc_dram_corrected", by_location, handle, corrected,
                                       volatile, dram)
        v["ecc_dram_uncorrected"] = call(reading, device, "ecc_dram_uncorrected", by_location, handle, uncorrected,
                                         volatile, dram)
        v["ecc_sram_corrected"] = call(reading, device, "ecc_sram_corrected", by_location, handle, corrected,
                                       volatile, sram)
        v["ecc_sram_uncorrected"] = call(reading, device, "ecc_sram_uncorrected", by_location, handle, uncorrected,
                                         volatile, sram)

    def _sample_pages_and_rows(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """Retired pages and remapped rows."""
        nvml, call, fn, v = self._nvml, self._call, self._fn, reading.values
        retired = fn("nvmlDeviceGetRetiredPages")
        sbe_pages = call(reading, device, "retired_pages_sbe", retired, handle,
                         nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe_pages = call(reading, device, "retired_pages_dbe", retired, handle,
                         nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        v["retired_pages_sbe"] = len(sbe_pages) if sbe_pages is not None else None
        v["retired_pages_dbe"] = len(dbe_pages) if dbe_pages is not None else None
        pending = call(reading, device, "retired_pages_pending", fn("nvmlDeviceGetRetiredPagesPendingStatus"), handle)
        v["retired_pages_pending"] = (pending == nvml.NVML_FEATURE_ENABLED) if pending is not None else None

        remapped = call(reading, device, "remapped_rows", fn("nvmlDeviceGetRemappedRows"), handle)
        if remapped is not None:
            corr_rows, unc_rows, is_pending, is_failure = remapped
            v["remapped_rows_correctable"] = int(corr_rows)
            v["remapped_rows_uncorrectable"] = int(unc_rows)
            v["remap_pending"] = bool(is_pending)
            v["remap_failure"] = bool(is_failure)
        else:
            v.update(remapped_rows_correctable=None, remapped_rows_uncorrectable=None, remap_pending=None,
                     remap_failure=None)

    def _sample_links_and_fields(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """PCIe replays, field values (HBM temperature, recovery action) and NVLink errors."""
        call, fn, v = self._call, self._fn, reading.values
        v["pcie_replay_count"] = call(reading, device, "pcie_replay_count", fn("nvmlDeviceGetPcieReplayCounter"),
                                      handle)
        fields = self._field_values(reading, device, handle)
        v["hbm_temp_c"] = fields.get("NVML_FI_DEV_MEMORY_TEMP")
        v["recovery_action"] = fields.get("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
        replay = fields.get("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL")
        recovery = fields.get("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
        crc_flit = fields.get("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")
        crc_data = fields.get("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")
        if replay is None and recovery is None and crc_flit is None:
            replay, recovery, crc = self._nvlink_by_link(reading, device, handle)
        else:
            crc = None if crc_flit is None and crc_data is None else int(crc_flit or 0) + int(crc_data or 0)
        v["nvlink_replay_errors"] = int(replay) if replay is not None else None
        v["nvlink_recovery_errors"] = int(recovery) if recovery is not None else None
        v["nvlink_crc_errors"] = crc
        if v["recovery_action"] is not None:
            v["recovery_action"] = int(v["recovery_action"])

    _FIELDS = ("NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
               "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
               "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")

    def _field_values(self, reading: GpuReading, device: GpuDevice, handle: Any) -> dict[str, Any]:
        """One nvmlDeviceGetFieldValues call; per-field nvmlReturn checked (the call itself does not raise per
        field)."""
        nvml = self._nvml
        names = [name for name in self._FIELDS if hasattr(nvml, name)]
        if not names or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return {}
        values = self._call(reading, device, "field_values", nvml.nvmlDeviceGetFieldValues, handle,
                            [getattr(nvml, name) for name in names])
        if values is None:
            return {}
        result: dict[str, Any] = {}
        for name, field in zip(names, values, strict=False):
            status = field.nvmlReturn
            if status != nvml.NVML_SUCCESS:
                self._classify(nvml.NVMLError(status), reading, device, name)
                continue
            result[name] = field_value(nvml, field)
        return result

    def _nvlink_by_link(self, reading: GpuReading, device: GpuDevice,
                        handle: Any) -> tuple[int | None, int | None, int | None]:
        """Sum nvmlDeviceGetNvLinkErrorCounter over the active links (fallback when total fields are missing)."""
        nvml = self._nvml
        links = self._nvlink_links.get(device.index)
        if links is None:
            links = []
            for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                        links.append(link)
                except nvml.NVMLError as exc:
                    if getattr(exc, "value", None) == self._code("NVML_ERROR_GPU_IS_LOST"):
                        raise GpuLostError(device, str(exc)) from None
                    continue
            self._nvlink_links[device.index] = links
        if not links:
            return None, None, None
        totals = {"replay": 0, "recovery": 0, "crc": 0}
        seen = {"replay": False, "recovery": False, "crc": False}
        counters = (("replay", nvml.NVML_NVLINK_ERROR_DL_REPLAY), ("recovery", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                    ("crc", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), ("crc", nvml.NVML_NVLINK_ERROR_DL_CRC_DATA))
        for link in links:
            for key, counter in counters:
                value = self._call(reading, device, f"nvlink_{key}", nvml.nvmlDeviceGetNvLinkErrorCounter,
                                   handle, link, counter)
                if value is not None:
                    totals[key] += int(value)
                    seen[key] = True
        return (totals["replay"] if seen["replay"] else None, totals["recovery"] if seen["recovery"] else None,
                totals["crc"] if seen["crc"] else None)

    # -- events --------------------------------------------------------------------------------------------------
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
        ci_value = ci if ci != getattr(self._nvml, "NVML_COMPUTE_INSTANCE_ID_ANY", 0xFFFFFFFF) else None
        mig = ""
        if gi_value is not None:
            mig = f" (MIG GPU-I {gi_value}" + (f" CI {ci_value})" if ci_value is not None else ")")
        if kind == "xid":
            message = f"NVML Xid event {value}" if value != 999 else "NVML Xid event (unknown Xid, 999)"
            return BackendEvent(index, "xid", value, message + mig, gpu_instance_id=gi_value,
                                compute_instance_id=ci_value)
        if kind == "recovery_action":
            return BackendEvent(index, "recovery_action", value,
                                f"NVML GPU recovery action event: {recovery_action_text(value)}" + mig)
        return BackendEvent(index, kind, None, "NVML single-bit ECC error storm event" + mig)


def field_value(nvml: Any, field: Any) -> int | float | None:
    """Decode the c_nvmlValue_t union of one c_nvmlFieldValue_t by its valueType."""
    kind = int(field.valueType)
    value = field.value
    members = {
        getattr(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }
    member = members.get(kind)
    if member is None:
        return None
    result = getattr(value, member)
    return float(result) if member == "dVal" else int(result)
