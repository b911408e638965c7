"""GPU events as evidence: which hardware events on a node (or on one GPU) fall near a failure, and
what they mean.

Used by crash attribution (a rank died: was its GPU at fault?) and by hang attribution (a rank never
joined a collective: did its GPU fall off the bus?). XID meanings come from the XID catalog
(collectors/sources/xid_catalog.py, a contract like the schema); which event kinds count and the
time window come from rules/crash.yaml.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from faultlens.attribution.incident import Cause, Evidence
from faultlens.attribution.reading.telemetry import Placement
from faultlens.attribution.rules import CrashRules


class XidInfoLike(Protocol):
    code: int
    name: str
    component: Any
    action: str
    leave: Any


class XidCatalogLike(Protocol):
    def get(self, code: int) -> XidInfoLike: ...


def default_xid_catalog() -> XidCatalogLike:
    """The catalog in rules/xid.yaml, through collectors/sources/xid_catalog.py."""
    from faultlens.collectors.sources.xid_catalog import load_xid_catalog

    return load_xid_catalog()


@dataclass(frozen=True)
class HardwareFinding:
    """One GPU event that implicates hardware near a failure."""

    ts: dt.datetime
    node: str | None
    kind: str
    code: int | None
    cause: Cause
    confidence: float
    gpu: str | None  # uuid, else NVML PCI bus id, else node:gpuN
    same_gpu: bool  # the event is on the failing rank's own GPU (not merely its node)
    text: str

    def evidence(self) -> Evidence:
        return Evidence("gpu_events", self.ts, self.text)


def as_datetime(value: Any) -> dt.datetime | None:
    """A pandas/arrow/python timestamp as an aware python datetime (None for nulls)."""
    if value is None or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        if pd.isna(value):
            return None
        value = value.to_pydatetime(warn=False)
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return None


def _get(row: pd.Series | dict[str, Any], key: str) -> Any:
    value = row.get(key) if isinstance(row, dict) else (row[key] if key in row.index else None)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value


def _gpu_label(row: pd.Series) -> str | None:
    uuid = _get(row, "gpu_uuid")
    if uuid:
        return str(uuid)
    bus = _get(row, "pci_bus_id")
    if bus:
        return str(bus)
    index = _get(row, "gpu_index")
    node = _get(row, "node")
    # an index, never an invented name
    return str(int(index)) if index is not None and node else None


def same_gpu(row: pd.Series, placement: Placement | None) -> bool:
    """Whether a gpu_events/gpu_samples row is about the GPU of `placement` (uuid, else PCI bus id,
    else index).
    """
    if placement is None:
        return False
    for column, mine in (("gpu_uuid", placement.gpu_uuid), ("pci_bus_id", placement.pci_bus_id)):
        theirs = _get(row, column)
        if mine and theirs:
            return str(mine).upper() == str(theirs).upper()
    theirs_index = _get(row, "gpu_index")
    return (
        placement.gpu_index is not None
        and theirs_index is not None
        and int(theirs_index) == placement.gpu_index
    )


def row_identifies_gpu(row: pd.Series) -> bool:
    return any(_get(row, c) is not None for c in ("gpu_uuid", "pci_bus_id", "gpu_index"))


def describe_gpu_event(row: pd.Series, xid: XidInfoLike | None = None) -> str:
    kind = _get(row, "kind") or "event"
    code = _get(row, "code")
    where = " ".join(part for part in (
        f"on {_get(row, 'node')}" if _get(row, "node") else "",
        f"GPU {int(_get(row, 'gpu_index'))}" if _get(row, "gpu_index") is not None else "",
        f"(PCI {_get(row, 'pci_bus_id')})" if _get(row, "pci_bus_id") else "",
    ) if part)
    if kind in {"xid", "sxid"} and code is not None:
        label = f"{'SXid' if kind == 'sxid' else 'Xid'} {int(code)}"
        if xid is not None:
            component = getattr(xid.component, "value", xid.component)
            label += f" {xid.name} (component {component}; action {xid.action})"
    else:
        label = str(kind) + (f" {int(code)}" if code is not None else "")
    message = _get(row, "message")
    text = f"{label} {where}".strip()
    return f"{text}: {message}" if message else text


def hardware_cause(row: pd.Series, rules: CrashRules, catalog: XidCatalogLike | None
                   ) -> tuple[Cause, float, XidInfoLike | None] | None:
    """The cause and confidence a gpu_events row implies, or None when it is not hardware evidence.
    """
    kind = _get(row, "kind")
    rule = next((r for r in rules.hardware_event_kinds if r.kind == kind), None)
    if rule is None:
        return None
    if rule.cause != "from_xid_catalog":
        return Cause(rule.cause), rule.confidence, None
    code = _get(row, "code")
    if code is None:
        return Cause.GPU_HARDWARE, rule.confidence * 0.8, None
    info = catalog.get(int(code)) if catalog is not None else None
    component = (
        str(getattr(info.component, "value", info.component)) if info is not None else "unknown"
    )
    mapped = rules.xid_component_causes.get(
        component, rules.xid_component_causes.get("unknown", "not_hardware")
    )
    if mapped == "not_hardware":
        return None
    confidence = rule.confidence * (0.8 if component == "unknown" else 1.0)
    return Cause(mapped), confidence, info


def hardware_findings(
    gpu_events: pd.DataFrame,
    node: str | None,
    at: dt.datetime,
    rules: CrashRules,
    catalog: XidCatalogLike | None,
    placement: Placement | None = None,
) -> list[HardwareFinding]:
    """Hardware-implicating GPU events on `node` within the rules' window around `at`, best first
    (own GPU before other GPUs of the node, then confidence, then closeness in time)."""
    if gpu_events.empty or node is None:
        return []
    start = at - dt.timedelta(seconds=rules.hardware_window.before_s)
    end = at + dt.timedelta(seconds=rules.hardware_window.after_s)
    rows = gpu_events[
        (gpu_events["node"] == node) & (gpu_events["ts"] >= start) & (gpu_events["ts"] <= end)
    ]
    findings = []
    for _, row in rows.iterrows():
        implied = hardware_cause(row, rules, catalog)
        if implied is None:
            continue
        cause, confidence, info = implied
        ts = as_datetime(row["ts"])
        if ts is None:
            continue
        findings.append(HardwareFinding(
            ts=ts, node=node, kind=str(_get(row, "kind")), code=_get(row, "code"), cause=cause,
            confidence=confidence, gpu=_gpu_label(row), same_gpu=same_gpu(row, placement),
            text=describe_gpu_event(row, info)))
    # own GPU first; then the strongest; an Xid before the event kinds derived from the same line
    # (the catalog's component is more specific); then the closest in time
    findings.sort(key=lambda f: (not f.same_gpu, -round(f.confidence, 3), f.kind != "xid",
                                 abs((f.ts - at).total_seconds())))
    return findings
