"""The metrics of an evaluation, one function per family: per-class and detection scores,
culprit-node localisation, cause accuracy, decisions, detection latency, and the per-fault-kind
table; `evaluate` assembles them into an EvalReport."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from faultlens.attribution.incident import Incident
from faultlens.controller.lab.evaluate.matching import match
from faultlens.controller.lab.evaluate.report import (
    DecideFn,
    DecisionView,
    EvalReport,
    FalseAlarm,
    Match,
    Score,
    cause_family,
)
from faultlens.controller.lab.evaluate.sources import design_rules
from faultlens.controller.lab.fault_labels import ExpectedAction, FaultLabel, LabelClass

CLASSES = tuple(
    c.value
    for c in (
        LabelClass.CRASH,
        LabelClass.COLLECTIVE_HANG,
        LabelClass.STRAGGLER,
        LabelClass.HEALTH,
        LabelClass.NUMERICS,
    )
)


def _latency_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "median": round(statistics.median(values), 3),
        "p90": round(p90, 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
        "values": [round(v, 3) for v in values],
    }


def _class_scores(matches: list[Match], false_alarms: list[FalseAlarm]) -> dict[str, Any]:
    """Precision/recall per incident class, and for detection regardless of class."""
    per_class: dict[str, Score] = {}
    for cls in CLASSES:
        tp = sum(1 for m in matches if m.label.label_class.value == cls and m.incident
                 and m.incident.incident_class.value == cls)
        fn = sum(1 for m in matches if m.label.label_class.value == cls) - tp
        fp = sum(1 for fa in false_alarms if fa.incident.incident_class.value == cls)
        fp += sum(1 for m in matches if m.incident and m.incident.incident_class.value == cls
                  and m.label.label_class.value != cls)
        per_class[cls] = Score(tp, fp, fn)
    detected = sum(1 for m in matches if m.incident)
    return {
        "per_class": per_class,
        "detection": Score(detected, len(false_alarms), len(matches) - detected),
    }


def _culprit_node_scores(matches: list[Match], false_alarms: list[FalseAlarm]) -> dict[str, Any]:
    """Culprit nodes counted per node over faults that have one (false alarms and duplicates add
    their nodes as FP); the nodes named for faults without a culprit node."""
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
    return {
        "culprit_nodes": Score(node_tp, node_fp, node_fn),
        "nodes_named_for_no_culprit_faults": named_for_none,
    }


def _cause_accuracy(matched: list[Match]) -> dict[str, Any]:
    """The share of detected faults whose cause is right, exactly and by family."""
    cause_exact = (sum(1 for m in matched if m.incident.cause.value == m.label.cause) / len(matched)
                   if matched else None)
    cause_fam = (
        sum(
            1
            for m in matched
            if cause_family(m.incident.cause.value) == cause_family(m.label.cause)
        )
        / len(matched)
        if matched
        else None
    )
    return {"cause_exact": cause_exact, "cause_family": cause_fam}


def _handled(m: Match) -> bool:
    """Handled without a human: failed over or drained as expected, every culprit node excluded."""
    if m.incident is None or m.decision is None:
        return False
    if (
        m.decision.action not in ("failover", "drain")
        or m.decision.action != m.label.expected_action.value
    ):
        return False
    return set(m.label.culprit_nodes) <= set(m.decision.exclude_nodes)


def _decision_metrics(matches: list[Match], matched: list[Match], false_alarms: list[FalseAlarm],
                      decisions: list[DecisionView]) -> dict[str, Any]:
    """Automatic failovers of software-side faults, healthy nodes excluded, escalation rate, and the
    share of faults handled without a human (all, and those not expected to escalate)."""
    software_failovers = sum(
        1
        for m in matched
        if m.label.expected_action is ExpectedAction.ESCALATE
        and m.decision
        and m.decision.action == "failover"
    )
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
    escalation_rate = (
        (sum(1 for d in decisions if d.action == "escalate") / len(decisions))
        if decisions
        else None
    )
    handled_all = sum(1 for m in matches if _handled(m)) / len(matches) if matches else None
    automatable = [m for m in matches if m.label.expected_action is not ExpectedAction.ESCALATE]
    handled_auto = (
        (sum(1 for m in automatable if _handled(m)) / len(automatable)) if automatable else None
    )
    return {
        "software_failovers": software_failovers,
        "healthy_nodes_excluded": healthy_excluded,
        "healthy_exclusion_incidents": healthy_incidents,
        "escalation_rate": escalation_rate,
        "handled_without_human": handled_all,
        "handled_without_human_non_software": handled_auto,
    }


def _latency(matches: list[Match], matched: list[Match],
             replay: Mapping[str, dt.datetime | None] | None) -> dict[str, dict[str, Any]]:
    """Detection latency per class (from the replay's detection times when one ran, else the
    incidents' detected_ts), hangs also after progress stopped, and the basis of the figures."""
    latency: dict[str, dict[str, Any]] = {}
    timed = (
        [m for m in matches if m.replay_detected_at is not None] if replay is not None else matched
    )
    for cls in CLASSES:
        values = [
            m.latency_s
            for m in timed
            if m.label.label_class.value == cls and m.latency_s is not None
        ]
        latency[cls] = _latency_stats(values)
    stops = [
        m.latency_after_progress_stop_s
        for m in timed
        if m.label.label_class is LabelClass.COLLECTIVE_HANG
        and m.latency_after_progress_stop_s is not None
    ]
    latency["collective_hang after progress stops"] = _latency_stats(stops)
    if replay is not None:
        basis = "live replay (engine Follower on the simulated clock)"
        latency["basis"] = {"source": basis, "replayed": len(replay),
                            "detected": sum(1 for v in replay.values() if v is not None)}
    else:
        values = [m.latency_s for m in matched if m.latency_s is not None]
        plausible = all(-60 <= v <= 7 * 86400 for v in values)
        latency["basis"] = {"source": "incident detected_ts" + ("" if plausible else
                            " (not in simulated time: the engine stamped the wall clock; run eval "
                            "--replay)")}
    return latency


def _by_kind(matches: list[Match]) -> dict[str, dict[str, Any]]:
    """Per fault kind: faults, detected, and how many got the class, nodes, cause family and action
    right.
    """
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({m.label.kind for m in matches}):
        ms = [m for m in matches if m.label.kind == kind]
        got = [m for m in ms if m.incident]
        by_kind[kind] = {
            "faults": len(ms),
            "detected": len(got),
            "class_ok": sum(
                1 for m in got if m.incident.incident_class.value == m.label.label_class.value
            ),
            "nodes_exact": sum(
                1 for m in got if set(m.incident.culprit_nodes) == set(m.label.culprit_nodes)
            ),
            "cause_family_ok": sum(
                1
                for m in got
                if cause_family(m.incident.cause.value) == cause_family(m.label.cause)
            ),
            "action_ok": sum(
                1 for m in got if m.decision and m.decision.action == m.label.expected_action.value
            ),
        }
    return by_kind


def evaluate(
    labels: Sequence[FaultLabel],
    incidents: Sequence[Incident],
    *,
    decide: DecideFn | None = None,
    decisions_source: str = "design-rules",
    replay: Mapping[str, dt.datetime | None] | None = None,
) -> EvalReport:
    """Score `incidents` against `labels`. `decide` gives the decision for an incident (default:
    docs/design.md rules); `decisions_source` names where decisions come from, for the report.
    `replay` (fault id -> simulated detection time from faultlens.controller.lab.replay) replaces
    the incidents' detected_ts for latency."""
    decide = decide or design_rules
    matches, false_alarms = match(labels, incidents)
    replay_times = replay or {}
    matches = [Match(m.label, m.incident, decide(m.incident) if m.incident else None, m.duplicates,
                     replay_times.get(m.label.fault_id)) for m in matches]
    false_alarms = [
        FalseAlarm(fa.incident, fa.benign_kind, decide(fa.incident)) for fa in false_alarms
    ]
    matched = [m for m in matches if m.incident]
    decisions = [m.decision for m in matched if m.decision] + [
        fa.decision for fa in false_alarms if fa.decision
    ]
    fa_causes = Counter(fa.benign_kind or "no labelled noise" for fa in false_alarms)
    decision_rules = Counter(f"{d.action}: {d.rule or '?'}" for d in decisions)
    return EvalReport(
        matches=matches,
        false_alarms=false_alarms,
        **_class_scores(matches, false_alarms),
        **_culprit_node_scores(matches, false_alarms),
        **_cause_accuracy(matched),
        decisions_source=decisions_source,
        **_decision_metrics(matches, matched, false_alarms, decisions),
        latency=_latency(matches, matched, replay),
        by_kind=_by_kind(matches),
        false_alarms_by_cause=dict(sorted(fa_causes.items())),
        incidents_total=len(incidents),
        decision_rules=dict(sorted(decision_rules.items())),
    )
