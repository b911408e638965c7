"""The incident type: one attributed failure, its class, cause, culprits, evidence and the rule that
fired.

Shared by the engine (which produces incidents) and the policy (which turns them into decisions);
the row form is the `incidents` table of collectors/store/schema.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any


class IncidentClass(StrEnum):
    CRASH = "crash"
    COLLECTIVE_HANG = "collective_hang"
    STRAGGLER = "straggler"
    HEALTH = "health"  # a critical GPU health event with no failure yet (proactive drain)
    # NaN/Inf loss or a loss spike: the model state went bad (restore from before it)
    NUMERICS = "numerics"
    UNKNOWN = "unknown"


class Cause(StrEnum):
    GPU_HARDWARE = "gpu_hardware"
    HBM = "hbm"
    NVLINK = "nvlink"
    PCIE = "pcie"
    NETWORK = "network"
    THERMAL = "thermal"
    HOST = "host"
    SOFTWARE = "software"
    OOM = "oom"
    DATA_CORRUPTION = "data_corruption"  # SDC / NaN: restore from before the incident
    WORKLOAD_IMBALANCE = "workload_imbalance"
    UNKNOWN = "unknown"

    @property
    def is_hardware(self) -> bool:
        return self in {
            Cause.GPU_HARDWARE,
            Cause.HBM,
            Cause.NVLINK,
            Cause.PCIE,
            Cause.NETWORK,
            Cause.THERMAL,
            Cause.HOST,
        }


@dataclass(frozen=True)
class Evidence:
    """One row of telemetry that supports an incident: which table, when, and what it says."""

    table: str
    ts: dt.datetime | None
    text: str

    def to_row(self) -> dict[str, Any]:
        return {"table": self.table, "ts": self.ts, "text": self.text}


@dataclass(frozen=True)
class Incident:
    incident_id: str
    incident_class: IncidentClass
    cause: Cause
    first_signal_ts: dt.datetime
    detected_ts: dt.datetime
    confidence: float
    rule: str
    summary: str
    job_id: str | None = None
    attempt: int | None = None
    cluster: str | None = None
    culprit_nodes: tuple[str, ...] = ()
    culprit_ranks: tuple[int, ...] = ()
    culprit_gpus: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    fingerprint: str | None = None
    step: int | None = None
    details: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @staticmethod
    def make_id(*parts: object) -> str:
        """A deterministic id from what identifies the failure, so re-running attribution over the
        same telemetry yields the same incident (idempotent writes, one decision per incident)."""
        digest = hashlib.sha256(
            "|".join("" if p is None else str(p) for p in parts).encode()
        ).hexdigest()
        return f"inc-{digest[:16]}"

    def to_row(self) -> dict[str, Any]:
        """The incidents-table row."""
        return {
            "ts": self.detected_ts,
            "cluster": self.cluster,
            "node": self.culprit_nodes[0] if len(self.culprit_nodes) == 1 else None,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "rank": self.culprit_ranks[0] if len(self.culprit_ranks) == 1 else None,
            "gpu_uuid": self.culprit_gpus[0] if len(self.culprit_gpus) == 1 else None,
            "incident_id": self.incident_id,
            "class": self.incident_class.value,
            "cause": self.cause.value,
            "culprit_nodes": list(self.culprit_nodes),
            "culprit_ranks": list(self.culprit_ranks),
            "culprit_gpus": list(self.culprit_gpus),
            "first_signal_ts": self.first_signal_ts,
            "detected_ts": self.detected_ts,
            "confidence": float(self.confidence),
            "evidence": [e.to_row() for e in self.evidence],
            "rule": self.rule,
            "summary": self.summary,
            "fingerprint": self.fingerprint,
            "step": self.step,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Incident:
        """Rebuild an incident from an incidents-table row (as returned by
        Store.query(...).to_pylist()).
        """
        def _enum(enum_type: type[Enum], value: Any) -> Any:
            try:
                return enum_type(value)
            except ValueError:
                return enum_type("unknown")

        return cls(
            incident_id=row["incident_id"],
            incident_class=_enum(IncidentClass, row.get("class")),
            cause=_enum(Cause, row.get("cause")),
            first_signal_ts=row.get("first_signal_ts") or row["ts"],
            detected_ts=row.get("detected_ts") or row["ts"],
            confidence=float(row.get("confidence") or 0.0),
            rule=row.get("rule") or "",
            summary=row.get("summary") or "",
            job_id=row.get("job_id"),
            attempt=row.get("attempt"),
            cluster=row.get("cluster"),
            culprit_nodes=tuple(row.get("culprit_nodes") or ()),
            culprit_ranks=tuple(row.get("culprit_ranks") or ()),
            culprit_gpus=tuple(row.get("culprit_gpus") or ()),
            evidence=tuple(
                Evidence(e["table"], e.get("ts"), e["text"]) for e in (row.get("evidence") or ())
            ),
            fingerprint=row.get("fingerprint"),
            step=row.get("step"),
        )
