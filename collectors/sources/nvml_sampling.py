"""The sampling half of NvmlBackend (its base class; opening, closing and events are in
nvml_backend.py): one NVML query per gpu_samples metric, with NVML's errors mapped (not supported:
None; GPU lost: GpuLostError; reset
required: marked on the reading), field values decoded and NVLink errors summed per link when the
totals are missing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faultlens.collectors.sources.gpu_backend import GpuDevice, GpuLostError, GpuReading

# NVML return codes that mean "this GPU/driver cannot answer this query": the value becomes None
# quietly
_QUIET_ERRORS = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_NOT_FOUND",
)


class NvmlSampling:
    """Base class of NvmlBackend: sample() and the NVML queries behind it. NvmlBackend.__init__ sets
    the attributes below: the pynvml module (once open() has imported it), the device handles and
    the active NVLink links per GPU (found on the first fallback read)."""

    _nvml: Any
    _handles: dict[int, Any]
    _nvlink_links: dict[int, list[int]]

    # -- sampling
    # ----------------------------------------------------------------------------------------------
    def _code(self, name: str) -> int | None:
        return getattr(self._nvml, name, None)

    def _call(
        self,
        reading: GpuReading,
        device: GpuDevice,
        column: str,
        fn: Callable[..., Any] | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """One NVML query: None when not supported; GpuLostError when the GPU is lost."""
        nvml = self._nvml
        if fn is None:  # the binding lacks the function (older nvidia-ml-py)
            return None
        try:
            return fn(*args, **kwargs)
        except nvml.NVMLError as exc:
            self._classify(exc, reading, device, column)
            return None

    def _classify(
        self, exc: Exception, reading: GpuReading, device: GpuDevice, column: str
    ) -> None:
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
            temp = call(
                reading,
                device,
                "temp_c",
                fn("nvmlDeviceGetTemperature"),
                handle,
                nvml.NVML_TEMPERATURE_GPU,
            )
        v["temp_c"] = temp

    def _sample_power_clocks_memory(
        self, reading: GpuReading, device: GpuDevice, handle: Any
    ) -> None:
        """Power, energy, clocks, utilisation, memory and clock-event reasons."""
        nvml, call, fn, v = self._nvml, self._call, self._fn, reading.values
        power_mw = call(reading, device, "power_w", fn("nvmlDeviceGetPowerUsage"), handle)
        v["power_w"] = power_mw / 1000.0 if power_mw is not None else None
        v["energy_mj"] = call(
            reading, device, "energy_mj", fn("nvmlDeviceGetTotalEnergyConsumption"), handle
        )
        v["sm_clock_mhz"] = call(
            reading,
            device,
            "sm_clock_mhz",
            fn("nvmlDeviceGetClockInfo"),
            handle,
            nvml.NVML_CLOCK_SM,
        )
        v["mem_clock_mhz"] = call(
            reading,
            device,
            "mem_clock_mhz",
            fn("nvmlDeviceGetClockInfo"),
            handle,
            nvml.NVML_CLOCK_MEM,
        )
        util = call(reading, device, "gpu_util_pct", fn("nvmlDeviceGetUtilizationRates"), handle)
        v["gpu_util_pct"] = float(util.gpu) if util is not None else None
        v["mem_util_pct"] = float(util.memory) if util is not None else None

        memory = None
        memory_v2 = getattr(nvml, "nvmlMemory_v2", None)
        if memory_v2 is not None:
            memory = call(
                reading,
                device,
                "mem_used_bytes",
                fn("nvmlDeviceGetMemoryInfo"),
                handle,
                version=memory_v2,
            )
        if memory is None:
            memory = call(reading, device, "mem_used_bytes", fn("nvmlDeviceGetMemoryInfo"), handle)
        v["mem_used_bytes"] = int(memory.used) if memory is not None else None
        v["mem_total_bytes"] = int(memory.total) if memory is not None else None

        reasons_fn = fn("nvmlDeviceGetCurrentClocksEventReasons") or fn(
            "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        v["clocks_event_reasons"] = call(
            reading, device, "clocks_event_reasons", reasons_fn, handle
        )

    def _sample_ecc(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """ECC error counters: totals and by memory location."""
        nvml, call, fn, v = self._nvml, self._call, self._fn, reading.values
        total_ecc = fn("nvmlDeviceGetTotalEccErrors")
        corrected, uncorrected = (
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        )
        volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        v["ecc_sbe_volatile"] = call(
            reading, device, "ecc_sbe_volatile", total_ecc, handle, corrected, volatile
        )
        v["ecc_dbe_volatile"] = call(
            reading, device, "ecc_dbe_volatile", total_ecc, handle, uncorrected, volatile
        )
        v["ecc_sbe_aggregate"] = call(
            reading, device, "ecc_sbe_aggregate", total_ecc, handle, corrected, aggregate
        )
        v["ecc_dbe_aggregate"] = call(
            reading, device, "ecc_dbe_aggregate", total_ecc, handle, uncorrected, aggregate
        )
        by_location = fn("nvmlDeviceGetMemoryErrorCounter")
        dram, sram = nvml.NVML_MEMORY_LOCATION_DRAM, nvml.NVML_MEMORY_LOCATION_SRAM
        v["ecc_dram_corrected"] = call(
            reading, device, "ecc_dram_corrected", by_location, handle, corrected, volatile, dram
        )
        v["ecc_dram_uncorrected"] = call(
            reading,
            device,
            "ecc_dram_uncorrected",
            by_location,
            handle,
            uncorrected,
            volatile,
            dram,
        )
        v["ecc_sram_corrected"] = call(
            reading, device, "ecc_sram_corrected", by_location, handle, corrected, volatile, sram
        )
        v["ecc_sram_uncorrected"] = call(
            reading,
            device,
            "ecc_sram_uncorrected",
            by_location,
            handle,
            uncorrected,
            volatile,
            sram,
        )

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
        pending = call(
            reading,
            device,
            "retired_pages_pending",
            fn("nvmlDeviceGetRetiredPagesPendingStatus"),
            handle,
        )
        v["retired_pages_pending"] = (
            (pending == nvml.NVML_FEATURE_ENABLED) if pending is not None else None
        )

        remapped = call(reading, device, "remapped_rows", fn("nvmlDeviceGetRemappedRows"), handle)
        if remapped is not None:
            corr_rows, unc_rows, is_pending, is_failure = remapped
            v["remapped_rows_correctable"] = int(corr_rows)
            v["remapped_rows_uncorrectable"] = int(unc_rows)
            v["remap_pending"] = bool(is_pending)
            v["remap_failure"] = bool(is_failure)
        else:
            v.update(
                remapped_rows_correctable=None,
                remapped_rows_uncorrectable=None,
                remap_pending=None,
                remap_failure=None,
            )

    def _sample_links_and_fields(self, reading: GpuReading, device: GpuDevice, handle: Any) -> None:
        """PCIe replays, field values (HBM temperature, recovery action) and NVLink errors."""
        call, fn, v = self._call, self._fn, reading.values
        v["pcie_replay_count"] = call(
            reading, device, "pcie_replay_count", fn("nvmlDeviceGetPcieReplayCounter"), handle
        )
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
            crc = (
                None
                if crc_flit is None and crc_data is None
                else int(crc_flit or 0) + int(crc_data or 0)
            )
        v["nvlink_replay_errors"] = int(replay) if replay is not None else None
        v["nvlink_recovery_errors"] = int(recovery) if recovery is not None else None
        v["nvlink_crc_errors"] = crc
        if v["recovery_action"] is not None:
            v["recovery_action"] = int(v["recovery_action"])

    _FIELDS = (
        "NVML_FI_DEV_MEMORY_TEMP",
        "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    )

    def _field_values(self, reading: GpuReading, device: GpuDevice, handle: Any) -> dict[str, Any]:
        """One nvmlDeviceGetFieldValues call; per-field nvmlReturn checked (the call itself does not
        raise per field)."""
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
        """Sum nvmlDeviceGetNvLinkErrorCounter over the active links (fallback when total fields are
        missing).
        """
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
        counters = (
            ("replay", nvml.NVML_NVLINK_ERROR_DL_REPLAY),
            ("recovery", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
            ("crc", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            ("crc", nvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
        )
        for link in links:
            for key, counter in counters:
                value = self._call(
                    reading,
                    device,
                    f"nvlink_{key}",
                    nvml.nvmlDeviceGetNvLinkErrorCounter,
                    handle,
                    link,
                    counter,
                )
                if value is not None:
                    totals[key] += int(value)
                    seen[key] = True
        return (
            totals["replay"] if seen["replay"] else None,
            totals["recovery"] if seen["recovery"] else None,
            totals["crc"] if seen["crc"] else None,
        )


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
