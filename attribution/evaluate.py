"""Scoring attribution against ground truth: incidents (from the store or the engine) versus fault labels.

Matching: an incident can stand for a labelled fault when it belongs to the same job and its span (first signal to
newest evidence) or its detection falls inside the fault's window (from its onset to the end of its effect, with a
little slack). Pairs
are assigned greedily, best first (same class, overlapping culprit nodes, compatible cause, closeness in time);
each incident stands for at most one fault. An unassigned incident inside a matched fault's window that agrees
with it (same class or overlapping nodes) is a *duplicate* (reported, not a false alarm); any other unassigned
incident is a *false alarm*, attributed to the benign noise it coincides with when there is one.

Metrics: precision/recall/F1 per incident class and for detection regardless of class; culprit-node localisation
counted per node over faults that have a culprit node (Minder-style: a fault's node named = TP, a node named that
is not the fault's = FP, a fault's node not named = FN; false alarms add their nodes as FP); cause accuracy (exact,
and by family: hardware/software/...); decisions (from the decisions table, else the decision policy, else the
docs/design.md rules, whichever is available): automatic failovers of software-side faults, healthy nodes excluded,
escalation rate, share of faults handled without a human; detection latency (detected - injected, simulated time).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.collectors.errors import FaultlensError
from faultlens.controller.lab.fault_labels import ExpectedAction, FaultLabel, LabelClass

BEFORE_SLACK = dt.timedelta(seconds=30)
AFTER_SLACK = dt.timedelta(seconds=300)
STRAGGLER_LEAD = dt.timedelta(seconds=300)

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


def design_rules(incident: Incident) -> DecisionView:
    """The decision policy as docs/design.md words it, for when no policy module or decisions table is available:
    escalate software-side causes and anything without exactly one culprit node; drain on health events; fail
    over otherwise (excluding the culprit node)."""
    if incident.incident_class is IncidentClass.HEALTH:
        return DecisionView("drain", tuple(incident.culprit_nodes), "design-health")
    if incident.cause in (Cause.SOFTWARE, Cause.OOM, Cause.WORKLOAD_IMBALANCE):
        return DecisionView("escalate", (), "design-software")
    if len(set(incident.culprit_nodes)) == 1:
        return DecisionView("failover", tuple(incident.culprit_nodes), "design-one-node")
    return DecisionView("escalate", (), "design-no-single-culprit")


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
    replay_detected_at: dt.datetime | None = None  # from a live replay (faultlens.controller.lab.replay), when one ran

    @property
    def detected_at(self) -> dt.datetime | None:
        if self.replay_detected_at is not None:
            return self.replay_detected_at
        return self.incident.detected_ts if self.incident is not None else None

    @property
    def latency_s(self) -> float | None:
        """Detection time minus the fault's onset (its first symptom; the injection time for most faults)."""
        detected = self.detected_at
        return None if detected is None else (detected - self.label.window_start).total_seconds()

    @property
    def latency_after_progress_stop_s(self) -> float | None:
        """Detection time minus the end of the last step completed before the fault (hangs: 'progress stops')."""
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
            "cause_accuracy": {"exact": _round(self.cause_exact), "family": _round(self.cause_family)},
            "decisions": {
                "source": self.decisions_source,
                "software_failovers": self.software_failovers,
                "healthy_nodes_excluded": self.healthy_nodes_excluded,
                "healthy_exclusion_incidents": self.healthy_exclusion_incidents,
                "escalation_rate": _round(self.escalation_rate),
                "handled_without_human": _round(self.handled_without_human),
                "handled_without_human_non_software": _round(self.handled_without_human_non_software),
                "by_rule": self.decision_rules,
            },
            "latency_s": self.latency,
            "by_kind": self.by_kind,
            "false_alarms": {"total": len(self.false_alarms), "by_cause": self.false_alarms_by_cause},
            "missed": sorted(m.label.fault_id for m in self.matches if m.incident is None),
            "fault_details": [_fault_json(m) for m in self.matches],
        }


def _fault_json(m: Match) -> dict[str, Any]:
    incident = m.incident
    return {
        "fault_id": m.label.fault_id, "kind": m.label.kind, "class": m.label.label_class.value,
        "cause": m.label.cause, "culprit_nodes": list(m.label.culprit_nodes),
        "expected_action": m.label.expected_action.value, "injected_ts": m.label.injected_ts.isoformat(),
        "incident": None if incident is None else {
            "incident_id": incident.incident_id, "class": incident.incident_class.value,
            "cause": incident.cause.value, "culprit_nodes": list(incident.culprit_nodes), "rule": incident.rule},
        "decision": None if m.decision is None else {"action": m.decision.action,
                                                     "exclude_nodes": list(m.decision.exclude_nodes),
                                                     "rule": m.decision.rule},
        "duplicates": len(m.duplicates),
        "latency_s": _round(m.latency_s, 3),
        "replay_detected_ts": m.replay_detected_at.isoformat() if m.replay_detected_at else None,
    }


# --- matching -------------------------------------------------------------------------------------------------

def _window(label: FaultLabel) -> tuple[dt.datetime, dt.datetime]:
    return label.window_start - BEFORE_SLACK, label.effect_end_ts + AFTER_SLACK


def _span(incident: Incident) -> tuple[dt.datetime, dt.datetime]:
    """From the incident's first signal to its newest evidence (a straggler's first signal is the start of the
    scoring window, which can begin before the slowdown; its evidence lies inside it)."""
    stamps = [e.ts for e in incident.evidence if e.ts is not None and e.ts >= incident.first_signal_ts]
    return incident.first_signal_ts, max([incident.first_signal_ts, *stamps])


def _in_window(incident: Incident, label: FaultLabel) -> bool:
    if label.job_id and incident.job_id and label.job_id != incident.job_id:
        return False
    low, high = _window(label)
    first, last = _span(incident)
    return (first <= high and last >= low) or low <= incident.detected_ts <= high


def _jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    a, b = set(a), set(b)
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b) if a | b else 0.0


def _pair_score(label: FaultLabel, incident: Incident) -> float:
    score = 0.0
    if incident.incident_class.value == label.label_class.value:
        score += 2.0
    score += 2.0 * _jaccard(label.culprit_nodes, incident.culprit_nodes)
    if cause_family(incident.cause.value) == cause_family(label.cause):
        score += 1.0
    gap = abs((incident.first_signal_ts - label.window_start).total_seconds())
    return score - min(gap, 3600.0) / 3600.0


def stands_for(incident: Incident, label: FaultLabel) -> bool:
    """Whether an incident reported during a live replay is the system's report of a labelled fault: it started
    in the fault's window (a straggler's scoring window may begin a few minutes before the slowdown) and, when both
    name nodes, they share one."""
    if label.job_id and incident.job_id and label.job_id != incident.job_id:
        return False
    before = STRAGGLER_LEAD if label.label_class is LabelClass.STRAGGLER else BEFORE_SLACK
    if not label.window_start - before <= incident.first_signal_ts <= label.effect_end_ts + AFTER_SLACK:
        return False
    if label.culprit_nodes and incident.culprit_nodes:
        return bool(set(incident.culprit_nodes) & set(label.culprit_nodes))
    return True


def match(labels: Sequence[FaultLabel], incidents: Sequence[Incident]) -> tuple[list[Match], list[FalseAlarm]]:
    faults = [label for label in labels if label.is_fault]
    benign = [label for label in labels if not label.is_fault]
    pairs = []
    for li, label in enumerate(faults):
        for ii, incident in enumerate(incidents):
            if _in_window(incident, label):
                pairs.append((_pair_score(label, incident), li, ii))
    pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
    label_of: dict[int, int] = {}
    incident_of: dict[int, int] = {}
    for _, li, ii in pairs:
        if li in incident_of or ii in label_of:
            continue
        incident_of[li] = ii
        label_of[ii] = li
    duplicates: dict[int, list[Incident]] = defaultdict(list)
    false_alarms: list[FalseAlarm] = []
    for ii, incident in enumerate(incidents):
        if ii in label_of:
            continue
        owner = None
        for li, label in enumerate(faults):
            if li not in incident_of or not _in_window(incident, label):
                continue
            matched = incidents[incident_of[li]]
            if (incident.incident_class == matched.incident_class
                    or set(incident.culprit_nodes) & set(label.culprit_nodes)
                    or (not label.culprit_nodes and not incident.culprit_nodes)):
                owner = li
                break
        if owner is not None:
            duplicates[owner].append(incident)
            continue
        noise = next((b.kind for b in benign if _in_window(incident, b)
                      and (not b.culprit_nodes or set(b.culprit_nodes) & set(incident.culprit_nodes))), None)
        false_alarms.append(FalseAlarm(incident, noise))
    matches = [Match(label, incidents[incident_of[li]] if li in incident_of else None,
                     duplicates=tuple(duplicates.get(li, ()))) for li, label in enumerate(faults)]
    return matches, false_alarms


# --- metrics --------------------------------------------------------------------------------------------------

def _latency_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"n": len(values), "median": round(statistics.median(values), 3), "p90": round(p90, 3),
            "min": round(ordered[0], 3), "max": round(ordered[-1], 3), "values": [round(v, 3) for v in values]}


def evaluate(labels: Sequence[FaultLabel], incidents: Sequence[Incident], *, decide: DecideFn | None = None,
             decisions_source: str = "design-rules",
             replay: Mapping[str, dt.datetime | None] | None = None) -> EvalReport:
    """Score `incidents` against `labels`. `decide` gives the decision for an incident (default: docs/design.md
    rules); `decisions_source` names where decisions come from, for the report. `replay` (fault id -> simulated
    detection time from faultlens.controller.lab.replay) replaces the incidents' detected_ts for latency."""
    decide = decide or design_rules
    matches, false_alarms = match(labels, incidents)
    replay_times = replay or {}
    matches = [Match(m.label, m.incident, decide(m.incident) if m.incident else None, m.duplicates,
                     replay_times.get(m.label.fault_id)) for m in matches]
    false_alarms = [FalseAlarm(fa.incident, fa.benign_kind, decide(fa.incident)) for fa in false_alarms]

    classes = [c.value for c in (LabelClass.CRASH, LabelClass.COLLECTIVE_HANG, LabelClass.STRAGGLER,
                                 LabelClass.HEALTH)]
    per_class: dict[str, Score] = {}
    for cls in classes:
        tp = sum(1 for m in matches if m.label.label_class.value == cls and m.incident
                 and m.incident.incident_class.value == cls)
        fn = sum(1 for m in matches if m.label.label_class.value == cls) - tp
        fp = sum(1 for fa in false_alarms if fa.incident.incident_class.value == cls)
        fp += sum(1 for m in matches if m.incident and m.incident.incident_class.value == cls
                  and m.label.label_class.value != cls)
        per_class[cls] = Score(tp, fp, fn)
    detected = sum(1 for m in matches if m.incident)
    detection = Score(detected, len(false_alarms), len(matches) - detected)

    node_tp = node_fp = node_fn = 0
    named_for_none = 0
    for m in matches:
        truth = set(m.label.culprit_nodes)
        if not truth:
            if m.incident:
                named_for_none += len(set(m.incident.culprit_nodes))
            continue
        if m.incident is None:
            node_fn += len(truth)
            continue
        named = set(m.incident.culprit_nodes)
        node_tp += len(named & truth)
        node_fp += len(named - truth)
        node_fn += len(truth - named)
        for dup in m.duplicates:
            node_fp += len(set(dup.culprit_nodes) - truth)
    for fa in false_alarms:
        node_fp += len(set(fa.incident.culprit_nodes))
    culprit_nodes = Score(node_tp, node_fp, node_fn)

    matched = [m for m in matches if m.incident]
    cause_exact = (sum(1 for m in matched if m.incident.cause.value == m.label.cause) / len(matched)
                   if matched else None)
    cause_fam = (sum(1 for m in matched if cause_family(m.incident.cause.value) == cause_family(m.label.cause))
                 / len(matched) if matched else None)

    software_failovers = sum(1 for m in matched if m.label.expected_action is ExpectedAction.ESCALATE
                             and m.decision and m.decision.action == "failover")
    healthy_excluded = 0
    healthy_incidents = 0
    for m in matched:
        extra = set(m.decision.exclude_nodes if m.decision else ()) - set(m.label.culprit_nodes)
        healthy_excluded += len(extra)
        healthy_incidents += bool(extra)
    for fa in false_alarms:
        extra = set(fa.decision.exclude_nodes if fa.decision else ())
        healthy_excluded += len(extra)
        healthy_incidents += bool(extra)
    decisions = [m.decision for m in matched if m.decision] + [fa.decision for fa in false_alarms if fa.decision]
    escalation_rate = (sum(1 for d in decisions if d.action == "escalate") / len(decisions)) if decisions else None

    def handled(m: Match) -> bool:
        if m.incident is None or m.decision is None:
            return False
        if m.decision.action not in ("failover", "drain") or m.decision.action != m.label.expected_action.value:
            return False
        return set(m.label.culprit_nodes) <= set(m.decision.exclude_nodes)

    handled_all = sum(1 for m in matches if handled(m)) / len(matches) if matches else None
    automatable = [m for m in matches if m.label.expected_action is not ExpectedAction.ESCALATE]
    handled_auto = (sum(1 for m in automatable if handled(m)) / len(automatable)) if automatable else None

    latency: dict[str, dict[str, Any]] = {}
    timed = [m for m in matches if m.replay_detected_at is not None] if replay is not None else matched
    for cls in classes:
        values = [m.latency_s for m in timed if m.label.label_class.value == cls and m.latency_s is not None]
        latency[cls] = _latency_stats(values)
    stops = [m.latency_after_progress_stop_s for m in timed if m.label.label_class is LabelClass.COLLECTIVE_HANG
             and m.latency_after_progress_stop_s is not None]
    latency["collective_hang after progress stops"] = _latency_stats(stops)
    if replay is not None:
        basis = "live replay (engine Follower on the simulated clock)"
        latency["basis"] = {"source": basis, "replayed": len(replay_times),
                            "detected": sum(1 for v in replay_times.values() if v is not None)}
    else:
        values = [m.latency_s for m in matched if m.latency_s is not None]
        plausible = all(-60 <= v <= 7 * 86400 for v in values)
        latency["basis"] = {"source": "incident detected_ts" + ("" if plausible else
                            " (not in simulated time: the engine stamped the wall clock; run eval --replay)")}

    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({m.label.kind for m in matches}):
        ms = [m for m in matches if m.label.kind == kind]
        got = [m for m in ms if m.incident]
        by_kind[kind] = {
            "faults": len(ms), "detected": len(got),
            "class_ok": sum(1 for m in got if m.incident.incident_class.value == m.label.label_class.value),
            "nodes_exact": sum(1 for m in got if set(m.incident.culprit_nodes) == set(m.label.culprit_nodes)),
            "cause_family_ok": sum(1 for m in got
                                   if cause_family(m.incident.cause.value) == cause_family(m.label.cause)),
            "action_ok": sum(1 for m in got if m.decision and m.decision.action == m.label.expected_action.value),
        }
    fa_causes = Counter(fa.benign_kind or "no labelled noise" for fa in false_alarms)
    decision_rules = Counter(f"{d.action}: {d.rule or '?'}" for d in decisions)
    return EvalReport(matches=matches, false_alarms=false_alarms, per_class=per_class, detection=detection,
                      culprit_nodes=culprit_nodes, nodes_named_for_no_culprit_faults=named_for_none,
                      cause_exact=cause_exact, cause_family=cause_fam, decisions_source=decisions_source,
                      software_failovers=software_failovers, healthy_nodes_excluded=healthy_excluded,
                      healthy_exclusion_incidents=healthy_incidents, escalation_rate=escalation_rate,
                      handled_without_human=handled_all, handled_without_human_non_software=handled_auto,
                      latency=latency, by_kind=by_kind, false_alarms_by_cause=dict(sorted(fa_causes.items())),
                      incidents_total=len(incidents), decision_rules=dict(sorted(decision_rules.items())))


def report_rows(report: EvalReport) -> dict[str, list[dict[str, Any]]]:
    """The report as small tables (for the CLI's rich output)."""
    scores = [{"metric": name, **score.to_json()} for name, score in
              [*((f"class {k}", v) for k, v in report.per_class.items()), ("detection (any class)", report.detection),
               ("culprit node", report.culprit_nodes)]]
    data = report.to_json()
    decisions = [{"metric": k, "value": v} for k, v in data["decisions"].items() if k != "by_rule"]
    decisions += [{"metric": f"decisions {rule}", "value": n} for rule, n in report.decision_rules.items()]
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
        latency = [{"class": "all", "n": None, "median": None, "p90": None, "min": None, "max": None}]
    return {"scores": scores, "decisions": decisions, f"detection latency (s, simulated) from {basis}": latency,
            "by fault kind": kinds}


def incidents_from_rows(rows: Iterable[dict[str, Any]]) -> list[Incident]:
    return [Incident.from_row(row) for row in rows]


class EvalError(RuntimeError, FaultlensError):
    """Incidents or decisions cannot be obtained: the message says what is missing."""


def load_incidents(store: Any, *, job: str | None = None, rerun: bool = False) -> tuple[list[Incident], str]:
    """The incidents to score: the store's incidents table when it has rows (and rerun is False), else what the
    engine (faultlens.attribution.engine.attribute) finds now. Returns (incidents, where they came from)."""
    if not rerun:
        where = " WHERE job_id = ?" if job else ""
        table = store.query(f'SELECT * FROM "incidents"{where}', [job] if job else None)
        if table.num_rows:
            return incidents_from_rows(table.to_pylist()), "incidents table"
    try:
        from faultlens.attribution.engine import attribute
    except ImportError as exc:
        raise EvalError("the store has no incidents and the attribution engine is not available "
                        f"(faultlens.attribution.engine: {exc})") from None
    return list(attribute(store, job=job)), "engine run"


def load_decider(store: Any, incidents: Sequence[Incident] = ()) -> tuple[DecideFn, str]:
    """Decisions for incidents: the decisions table when it holds some, else the decision policy
    (faultlens.attribution.policy.DecisionPolicy with rules/policy.yaml, applied to the incidents in the order they
    began, each seeing the ones before it as the job's history), else the docs/design.md rules."""
    table = store.query('SELECT incident_id, action, exclude_nodes, rule FROM "decisions" ORDER BY ts')
    if table.num_rows:
        recorded = {row["incident_id"]: DecisionView(row["action"], tuple(row["exclude_nodes"] or ()),
                                                     row["rule"] or "")
                    for row in table.to_pylist()}

        def from_table(incident: Incident) -> DecisionView:
            return recorded.get(incident.incident_id, DecisionView("none"))

        return from_table, "decisions table"
    try:
        from faultlens.attribution.policy import DecisionPolicy
    except ImportError:
        return design_rules, "design-rules (no decision policy available)"
    decided = decide_in_order(DecisionPolicy, incidents)
    return (lambda incident: decided.get(incident.incident_id, DecisionView("none"))), "faultlens.attribution.policy"


class _EvalHistory:
    """The PolicyHistory a live policy would have had: the incidents decided before, and their failovers."""

    def __init__(self) -> None:
        self.seen: list[tuple[Incident, str]] = []  # (incident, action), in decision order

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        return sum(1 for incident, action in self.seen if incident.job_id == job_id and incident.cause == cause
                   and (incident_class is None or incident.incident_class == incident_class)
                   and action == "failover" and incident.incident_id != exclude_incident_id)

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        return [i for i, _ in self.seen if i.job_id == job_id and i.incident_id != exclude_incident_id]

    def lemon_nodes(self, rule: Any, now: dt.datetime) -> list[Any]:
        return []  # one simulated job: no cross-job history

    def job_nodes(self, job_id: str | None) -> set[str]:
        return set()


def decide_in_order(policy_type: Any, incidents: Sequence[Incident]) -> dict[str, DecisionView]:
    """Apply a DecisionPolicy to incidents in the order they began, each seeing the earlier ones as history."""
    history = _EvalHistory()
    current = {"now": dt.datetime.now(dt.UTC)}
    policy = policy_type(history=history, clock=lambda: current["now"])
    decided: dict[str, DecisionView] = {}
    for incident in sorted(incidents, key=lambda i: (i.first_signal_ts, i.incident_id)):
        current["now"] = incident.first_signal_ts
        decision = policy.decide(incident)
        action = getattr(decision.action, "value", str(decision.action))
        decided[incident.incident_id] = DecisionView(action, tuple(decision.exclude_nodes),
                                                     getattr(decision, "policy_rule", ""))
        history.seen.append((incident, action))
    return decided
