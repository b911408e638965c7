"""Health changes between two samples of one GPU -> gpu_events kinds.

Counters and flags are diffed: a new double-bit ECC error, a single-bit storm, row remap pending /
failure, page retirement pending, a recovery action other than NONE, thermal or power slowdown
starting or ending (clocks-event reason bits; "power" is the hardware power brake, SwPowerCap stays
in the samples only because it is normal at full load), NVLink replay/recovery errors (any increase)
or CRC errors (rate), PCIe replays. On the first sample of a GPU only the states that need action
now are reported (volatile DBE > 0, pending/failed remap, pending retirement, recovery action,
slowdown active); lifetime counters are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faultlens.collectors.sources.gpu_backend import RECOVERY_ACTIONS

# clocks-event reason bits (nvmlClocksEventReason*)
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THERMAL_MASK = SW_THERMAL | HW_THERMAL
POWER_MASK = HW_POWER_BRAKE  # SwPowerCap is normal at full load: kept in samples, not an event


@dataclass(frozen=True)
class DeltaThresholds:
    sbe_storm_per_sample: int = 1000  # new volatile SBEs between two samples that make a storm
    nvlink_crc_per_s: float = 100.0  # DCGM: >= 100 CRC errors per second fails


@dataclass(frozen=True)
class HealthChange:
    kind: str
    code: int | None
    message: str


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _increase(prev: Mapping[str, Any] | None, cur: Mapping[str, Any], column: str) -> int:
    now = _int(cur.get(column))
    before = _int(prev.get(column)) if prev is not None else None
    if now is None or before is None or now <= before:
        return 0
    return now - before


def _flag_set(prev: Mapping[str, Any] | None, cur: Mapping[str, Any], column: str) -> bool:
    if not cur.get(column):
        return False
    return prev is None or not prev.get(column)


def _reason_names(bits: int) -> str:
    names = [
        name
        for bit, name in (
            (SW_POWER_CAP, "SwPowerCap"),
            (HW_SLOWDOWN, "HwSlowdown"),
            (SW_THERMAL, "SwThermalSlowdown"),
            (HW_THERMAL, "HwThermalSlowdown"),
            (HW_POWER_BRAKE, "HwPowerBrakeSlowdown"),
        )
        if bits & bit
    ]
    return "+".join(names) or "none"


def recovery_action_text(code: int | None) -> str:
    if code is None:
        return "unknown"
    return f"0x{code:x} ({RECOVERY_ACTIONS.get(code, 'unknown action')})"


def sample_changes(
    prev: Mapping[str, Any] | None,
    cur: Mapping[str, Any],
    elapsed_s: float | None = None,
    thresholds: DeltaThresholds = DeltaThresholds(),
) -> list[HealthChange]:
    """The gpu_events a new sample implies, given the previous sample of the same GPU (None: first
    sample).
    """
    changes: list[HealthChange] = []
    first = prev is None

    # double-bit ECC: volatile counter first, then aggregate, then the by-location uncorrected
    # counters
    for column in (
        "ecc_dbe_volatile",
        "ecc_dbe_aggregate",
        "ecc_dram_uncorrected",
        "ecc_sram_uncorrected",
    ):
        if _int(cur.get(column)) is None:
            continue
        if first:
            count = _int(cur.get(column)) or 0
            if column == "ecc_dbe_volatile" and count > 0:
                changes.append(HealthChange("ecc_dbe", None, f"{count} volatile double-bit ECC "
                                                             "error(s) since the "
                                                               "last GPU reset (present at first "
                                                               "sample)"))
            if column == "ecc_dbe_volatile":
                break
            continue
        delta = _increase(prev, cur, column)
        if delta:
            where = _dbe_location(prev, cur)
            changes.append(HealthChange("ecc_dbe", None,
                                        f"{delta} new double-bit ECC error(s) ({column} "
                                        f"{prev.get(column)} -> "
                                        f"{cur.get(column)}){where}"))
        break

    if not first:
        sbe = _increase(prev, cur, "ecc_sbe_volatile")
        if sbe >= thresholds.sbe_storm_per_sample:
            changes.append(HealthChange("ecc_sbe_storm", None, f"{sbe} new single-bit ECC errors "
                                                               "in one sample"))

    if _flag_set(prev, cur, "remap_pending"):
        changes.append(HealthChange("remap_pending", None, "row remap pending: reset the GPU to "
                                                           "activate"
                                    + (" (present at first sample)" if first else "")))
    if _flag_set(prev, cur, "remap_failure"):
        changes.append(HealthChange("remap_failure", None, "row remapping failed: escalate, do not "
                                                           "re-admit the GPU"
                                    + (" (present at first sample)" if first else "")))
    if _flag_set(prev, cur, "retired_pages_pending"):
        changes.append(HealthChange("retired_page_pending", None, "page retirement pending: reset "
                                                                  "the GPU to activate"
                                    + (" (present at first sample)" if first else "")))

    action = _int(cur.get("recovery_action"))
    before_action = _int(prev.get("recovery_action")) if prev is not None else None
    if action is not None and action != 0 and action != before_action:
        source = (
            "present at first sample"
            if first
            else f"changed from {recovery_action_text(before_action)}"
        )
        changes.append(
            HealthChange(
                "recovery_action",
                action,
                f"GPU recovery action {recovery_action_text(action)} ({source})",
            )
        )

    reasons = _int(cur.get("clocks_event_reasons"))
    before_reasons = _int(prev.get("clocks_event_reasons")) if prev is not None else None
    if reasons is not None:
        was = before_reasons or 0
        for mask, kind in ((THERMAL_MASK, "thermal_slowdown"), (POWER_MASK, "power_slowdown")):
            if reasons & mask and not was & mask:
                temp = cur.get("temp_c")
                detail = f", GPU {temp:.0f} C" if isinstance(temp, (int, float)) else ""
                changes.append(HealthChange(f"{kind}_start", None,
                                            f"clocks-event reasons 0x{reasons:x} "
                                            f"({_reason_names(reasons)}){detail}"))
            elif not first and before_reasons is not None and was & mask and not reasons & mask:
                changes.append(HealthChange(f"{kind}_end", None, "clocks-event reasons "
                                                                 f"0x{reasons:x} "
                                                                 f"({_reason_names(reasons)})"))

    if not first:
        replay = _increase(prev, cur, "nvlink_replay_errors")
        recovery = _increase(prev, cur, "nvlink_recovery_errors")
        if replay or recovery:
            changes.append(HealthChange("nvlink_error", None,
                                        f"NVLink errors: +{replay} replay, +{recovery} recovery"))
        crc = _increase(prev, cur, "nvlink_crc_errors")
        if crc and elapsed_s and elapsed_s > 0 and crc / elapsed_s >= thresholds.nvlink_crc_per_s:
            changes.append(HealthChange("nvlink_error", None,
                                        f"NVLink CRC errors at {crc / elapsed_s:.0f}/s (+{crc})"))
        pcie = _increase(prev, cur, "pcie_replay_count")
        if pcie:
            total = cur.get("pcie_replay_count")
            changes.append(
                HealthChange("pcie_replay", None, f"+{pcie} PCIe replays (total {total})")
            )
    return changes


def _dbe_location(prev: Mapping[str, Any], cur: Mapping[str, Any]) -> str:
    places = [
        name
        for column, name in (("ecc_dram_uncorrected", "DRAM/HBM"), ("ecc_sram_uncorrected", "SRAM"))
        if _increase(prev, cur, column)
    ]
    return f" in {', '.join(places)}" if places else ""
