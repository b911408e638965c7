"""The evaluation's types: a decision as scored, a precision/recall score, a fault's match, a false
alarm, the report and its JSON and table forms; cause families."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faultlens.attribution.incident import Incident
from faultlens.controller.lab.fault_labels import FaultLabel

HARDWARE = {"gpu_hardware", "hbm", "nvlink", "pcie", "network", "thermal", "host"}
SOFTWARE = {"software", "oom"}


def cause_family(cause: str) -> str:
    if cause in HARDWARE:
        return "hardware"
    if cause in SOFTWARE:
        return "software"
    if cause in ("data_corruption", "workload_imbalance", "none"):
        return cause
    return "unknown"


@dataclass(frozen=True)
class DecisionView:
    """What was (or would be) decided for one incident."""

    action: str  # failover, escalate, drain, none
    exclude_nodes: tuple[str, ...] = ()
    rule: str = ""  # the policy rule that chose it, when known


DecideFn = Callable[[Incident], DecisionView]


@dataclass(frozen=True)
class Score:
    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None:
            return None
        return 2 * p * r / (p + r) if p + r else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn, "precision": _round(self.precision),
                "recall": _round(self.recall), "f1": _round(self.f1)}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class Match:
    label: FaultLabel
    incident: Incident | None
    decision: DecisionView | None = None
    duplicates: tuple[Incident, ...] = ()
    # from a live replay (faultlens.controller.lab.replay), when one ran
    replay_detected_at: dt.datetime | None = None

    @property
    def detected_at(self) -> dt.datetime | None:
        if self.replay_detected_at is not None:
            return self.replay_detected_at
        return self.incident.detected_ts if self.incident is not None else None

    @property
    def latency_s(self) -> float | None:
        """Detection time minus the fault's onset (its first symptom; the injection time for most
        faults).
        """
        detected = self.detected_at
        return None if detected is None else (detected - self.label.window_start).total_seconds()

    @property
    def latency_after_progress_stop_s(self) -> float | None:
        """Detection time minus the end of the last step completed before the fault (hangs:
        'progress stops').
        """
        detected = self.detected_at
        stopped = self.label.extra.get("last_step_end_ts")
        if detected is None or not stopped:
            return None
        return (detected - dt.datetime.fromisoformat(stopped)).total_seconds()


@dataclass(frozen=True)
class FalseAlarm:
    incident: Incident
    benign_kind: str | None  # the benign noise it coincides with, if any
    decision: DecisionView | None = None


@dataclass
class EvalReport:
    matches: list[Match]
    false_alarms: list[FalseAlarm]
    per_class: dict[str, Score]
    detection: Score
    culprit_nodes: Score
    nodes_named_for_no_culprit_faults: int
    cause_exact: float | None
    cause_family: float | None
    decisions_source: str
    software_failovers: int
    healthy_nodes_excluded: int
    healthy_exclusion_incidents: int
    escalation_rate: float | None
    handled_without_human: float | None
    handled_without_human_non_software: float | None
    latency: dict[str, dict[str, Any]]
    by_kind: dict[str, dict[str, Any]]
    false_alarms_by_cause: dict[str, int] = field(default_factory=dict)
    incidents_total: int = 0
    decision_rules: dict[str, int] = field(default_factory=dict)  # "action: policy rule" -> count

    def to_json(self) -> dict[str, Any]:
        return {
            "faults": len(self.matches),
            "incidents": self.incidents_total,
            "per_class": {k: v.to_json() for k, v in self.per_class.items()},
            "detection": self.detection.to_json(),
            "culprit_nodes": self.culprit_nodes.to_json(),
            "nodes_named_for_no_culprit_faults": self.nodes_named_for_no_culprit_faults,
            "cause_accuracy": {
                "exact": _round(self.cause_exact),
                "family": _round(self.cause_family),
            },
            "decisions": {
                "source": self.decisions_source,
                "software_failovers": self.software_failovers,
                "healthy_nodes_excluded": self.healthy_nodes_excluded,
                "healthy_exclusion_incidents": self.healthy_exclusion_incidents,
                "escalation_rate": _round(self.escalation_rate),
                "handled_without_human": _round(self.handled_without_human),
                "handled_without_human_non_software": _round(
                    self.handled_without_human_non_software
                ),
                "by_rule": self.decision_rules,
            },
            "latency_s": self.latency,
            "by_kind": self.by_kind,
            "false_alarms": {
                "total": len(self.false_alarms),
                "by_cause": self.false_alarms_by_cause,
            },
            "missed": sorted(m.label.fault_id for m in self.matches if m.incident is None),
            "fault_details": [_fault_json(m) for m in self.matches],
        }


def _fault_json(m: Match) -> dict[str, Any]:
    incident = m.incident
    return {
        "fault_id": m.label.fault_id,
        "kind": m.label.kind,
        "class": m.label.label_class.value,
        "cause": m.label.cause,
        "culprit_nodes": list(m.label.culprit_nodes),
        "expected_action": m.label.expected_action.value,
        "injected_ts": m.label.injected_ts.isoformat(),
        "incident": None
        if incident is None
        else {
            "incident_id": incident.incident_id,
            "class": incident.incident_class.value,
            "cause": incident.cause.value,
            "culprit_nodes": list(incident.culprit_nodes),
            "rule": incident.rule,
        },
        "decision": None
        if m.decision is None
        else {
            "action": m.decision.action,
            "exclude_nodes": list(m.decision.exclude_nodes),
            "rule": m.decision.rule,
        },
        "duplicates": len(m.duplicates),
        "latency_s": _round(m.latency_s, 3),
        "replay_detected_ts": m.replay_detected_at.isoformat() if m.replay_detected_at else None,
    }


def report_rows(report: EvalReport) -> dict[str, list[dict[str, Any]]]:
    """The report as small tables (for the CLI's rich output)."""
    scores = [
        {"metric": name, **score.to_json()}
        for name, score in [
            *((f"class {k}", v) for k, v in report.per_class.items()),
            ("detection (any class)", report.detection),
            ("culprit node", report.culprit_nodes),
        ]
    ]
    data = report.to_json()
    decisions = [{"metric": k, "value": v} for k, v in data["decisions"].items() if k != "by_rule"]
    decisions += [
        {"metric": f"decisions {rule}", "value": n} for rule, n in report.decision_rules.items()
    ]
    decisions += [{"metric": "cause accuracy (exact)", "value": data["cause_accuracy"]["exact"]},
                  {"metric": "cause accuracy (family)", "value": data["cause_accuracy"]["family"]},
                  {"metric": "nodes named for faults without a culprit node",
                   "value": report.nodes_named_for_no_culprit_faults},
                  {"metric": "false alarms", "value": len(report.false_alarms)}]
    latency = [{"class": k, **{key: v.get(key) for key in ("n", "median", "p90", "min", "max")}}
               for k, v in report.latency.items() if k != "basis"]
    kinds = [{"kind": k, **v} for k, v in report.by_kind.items()]
    basis = report.latency.get("basis", {}).get("source", "")
    if "not in simulated time" in basis:
        latency = [
            {"class": "all", "n": None, "median": None, "p90": None, "min": None, "max": None}
        ]
    return {"scores": scores, "decisions": decisions, "detection latency (s, simulated) from "
                                                      f"{basis}": latency,
            "by fault kind": kinds}
