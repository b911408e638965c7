"""The dcgm-exporter vocabulary: metric names (old and new DCGM field names) -> gpu_samples columns
and scales, the event metrics and DCGM_FR_* health codes -> gpu_events kinds, DCGM's blank
sentinels, and each column's value range (BadValue when a sample does not fit)."""

from __future__ import annotations

import math
from typing import Any

from faultlens.errors import FaultlensError

# DCGM_INT64_BLANK and the NOT_FOUND / NOT_SUPPORTED / ... sentinels above it
DCGM_BLANK_MIN = 9223372036854775792
MIB = 1024 * 1024
# what fetch_scrape reads of a response; a real scrape is ~100 KB per node
MAX_SCRAPE_CHARS = 64 * MIB

# metric name (without the DCGM_FI_DEV_ prefix) -> (gpu_samples column, scale)
SAMPLE_METRICS: dict[str, tuple[str, float]] = {
    "GPU_TEMP": ("temp_c", 1),
    "MEMORY_TEMP": ("hbm_temp_c", 1),
    "POWER_USAGE": ("power_w", 1),
    "TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1),
    "SM_CLOCK": ("sm_clock_mhz", 1),
    "MEM_CLOCK": ("mem_clock_mhz", 1),
    "GPU_UTIL": ("gpu_util_pct", 1),
    "MEM_COPY_UTIL": ("mem_util_pct", 1),
    "FB_USED": ("mem_used_bytes", MIB),
    "FB_TOTAL": ("mem_total_bytes", MIB),
    "CLOCK_THROTTLE_REASONS": ("clocks_event_reasons", 1),
    "CLOCKS_EVENT_REASONS": ("clocks_event_reasons", 1),
    "ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile", 1),
    "ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile", 1),
    "ECC_SBE_AGG_TOTAL": ("ecc_sbe_aggregate", 1),
    "ECC_DBE_AGG_TOTAL": ("ecc_dbe_aggregate", 1),
    "RETIRED_SBE": ("retired_pages_sbe", 1),
    "PAGE_RETIRED_SBE": ("retired_pages_sbe", 1),
    "RETIRED_DBE": ("retired_pages_dbe", 1),
    "PAGE_RETIRED_DBE": ("retired_pages_dbe", 1),
    "RETIRED_PENDING": ("retired_pages_pending", 1),
    "PAGE_RETIRED_PENDING": ("retired_pages_pending", 1),
    "CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", 1),
    "UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", 1),
    "ROW_REMAP_PENDING": ("remap_pending", 1),
    "ROW_REMAP_FAILURE": ("remap_failure", 1),
    "ROW_REMAP_FAILED": ("remap_failure", 1),
    "GET_GPU_RECOVERY_ACTION": ("recovery_action", 1),
    "PCIE_REPLAY_COUNTER": ("pcie_replay_count", 1),
    "NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("nvlink_replay_errors", 1),
    "NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("nvlink_recovery_errors", 1),
    "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_crc_errors", 1),
    "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("nvlink_crc_errors", 1),  # added to the flit count
}
ADDITIVE_COLUMNS = {"nvlink_crc_errors"}
_BOOLEAN = {"retired_pages_pending", "remap_pending", "remap_failure"}
_INTEGER = {
    "energy_mj",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "mem_used_bytes",
    "mem_total_bytes",
    "clocks_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "recovery_action",
    "pcie_replay_count",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_errors",
}
XID_LAST_METRICS = ("XID_ERRORS", "XID_ERROR")
XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"
HEALTH_METRIC = "DCGM_EXP_GPU_HEALTH_STATUS"

# DCGM_FR_* health error codes -> (gpu_events kind, code)
HEALTH_KINDS: dict[str, tuple[str, int | None]] = {
    "DCGM_FR_VOLATILE_DBE_DETECTED": ("ecc_dbe", None),
    "DCGM_FR_DBE_VIOLATION": ("ecc_dbe", None),
    "DCGM_FR_VOLATILE_SBE_DETECTED": ("ecc_sbe_storm", None),
    "DCGM_FR_PENDING_PAGE_RETIREMENTS": ("retired_page_pending", None),
    "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS": ("retired_page_pending", None),
    "DCGM_FR_PENDING_ROW_REMAP": ("remap_pending", None),
    "DCGM_FR_ROW_REMAP_FAILURE": ("remap_failure", None),
    "DCGM_FR_FALLEN_OFF_BUS": ("gpu_lost", None),
    "DCGM_FR_UNCONTAINED_ERROR": ("xid", 95),
    "DCGM_FR_XID_ERROR": ("xid", None),
    "DCGM_FR_SXID_ERROR": ("sxid", None),
    "DCGM_FR_NVLINK_ERROR_THRESHOLD": ("nvlink_error", None),
    "DCGM_FR_NVLINK_ERROR_CRITICAL": ("nvlink_error", None),
    "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD": ("nvlink_error", None),
    "DCGM_FR_NVLINK_DOWN": ("nvlink_error", None),
    "DCGM_FR_PCI_REPLAY_RATE": ("pcie_replay", None),
    "DCGM_FR_CLOCK_THROTTLE_THERMAL": ("thermal_slowdown_start", None),
    "DCGM_FR_CLOCKS_EVENT_THERMAL": ("thermal_slowdown_start", None),
    "DCGM_FR_CLOCK_THROTTLE_POWER": ("power_slowdown_start", None),
    "DCGM_FR_CLOCKS_EVENT_POWER": ("power_slowdown_start", None),
    "DCGM_FR_GPU_RECOVERY_RESET": ("recovery_action", 1),
    "DCGM_FR_GPU_RECOVERY_REBOOT": ("recovery_action", 2),
    "DCGM_FR_GPU_RECOVERY_DRAIN_P2P": ("recovery_action", 3),
    "DCGM_FR_GPU_RECOVERY_DRAIN_RESET": ("recovery_action", 4),
}
HEALTH_WORDS = {10: "WARN", 20: "FAIL"}
_INT32_COLUMNS = {"sm_clock_mhz", "mem_clock_mhz", "recovery_action"}
INT32_MAX, INT64_MAX, _FLOAT32_MAX = 2**31 - 1, 2**63 - 1, 3.4e38
MAX_TS_NS = 2**63 - 1


class BadValue(ValueError, FaultlensError):
    """A sample value its column cannot hold (3e9 MHz in an int32, -1e303 MiB): the sample is left
    out.
    """


def column_value(column: str, value: float | int) -> Any:
    """`value` (already scaled) as `column` stores it, or BadValue."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if column in _BOOLEAN:
            return bool(value)
        limit = INT32_MAX if column in _INT32_COLUMNS else INT64_MAX
        if column in _INTEGER and not -limit <= value <= limit:
            raise BadValue(f"{column}: {value} is out of range")
        if column not in _INTEGER and abs(value) > _FLOAT32_MAX:
            raise BadValue(f"{column}: {value} is out of range")
        return value if column in _INTEGER else float(value)
    if not math.isfinite(value):
        raise BadValue(f"{column}: {value} is not a finite number")
    if column in _BOOLEAN:
        return bool(value)
    if column in _INTEGER:
        limit = INT32_MAX if column in _INT32_COLUMNS else INT64_MAX
        if not -limit <= value <= limit:
            raise BadValue(f"{column}: {value:g} is out of range")
        return int(value)
    if abs(value) > _FLOAT32_MAX:
        raise BadValue(f"{column}: {value:g} is out of range")
    return float(value)


def no_data(value: Any) -> bool:
    """No value: none, NaN, or one of DCGM's blank sentinels."""
    if value is None:
        return True
    try:
        if isinstance(value, float) and math.isnan(value):
            return True
        return value >= DCGM_BLANK_MIN
    except TypeError:
        return True


def short_name(name: str) -> str:
    """A metric's name without DCGM_FI_DEV_ / DCGM_FI_ (and the _total prometheus_client adds to
    counters).
    """
    if name.endswith("_total"):  # prometheus_client adds _total to the samples of a counter family
        name = name[: -len("_total")]
    for prefix in ("DCGM_FI_DEV_", "DCGM_FI_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
