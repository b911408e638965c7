"""Matching incidents to labelled faults: the fault's window, the pair score, greedy assignment best
first; duplicates and false alarms (with the benign noise they coincide with); whether a replayed
incident stands for a fault."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence

from faultlens.attribution.incident import Incident
from faultlens.controller.lab.evaluate.report import FalseAlarm, Match, cause_family
from faultlens.controller.lab.fault_labels import FaultLabel, LabelClass

BEFORE_SLACK = dt.timedelta(seconds=30)
AFTER_SLACK = dt.timedelta(seconds=300)
STRAGGLER_LEAD = dt.timedelta(seconds=300)


def _window(label: FaultLabel) -> tuple[dt.datetime, dt.datetime]:
    return label.window_start - BEFORE_SLACK, label.effect_end_ts + AFTER_SLACK


def _span(incident: Incident) -> tuple[dt.datetime, dt.datetime]:
    """From the incident's first signal to its newest evidence (a straggler's first signal is the
    start of the scoring window, which can begin before the slowdown; its evidence lies inside it).
    """
    stamps = [
        e.ts for e in incident.evidence if e.ts is not None and e.ts >= incident.first_signal_ts
    ]
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
    """Whether an incident reported during a live replay is the system's report of a labelled fault:
    it started in the fault's window (a straggler's scoring window may begin a few minutes before
    the slowdown) and, when both name nodes, they share one."""
    if label.job_id and incident.job_id and label.job_id != incident.job_id:
        return False
    before = STRAGGLER_LEAD if label.label_class is LabelClass.STRAGGLER else BEFORE_SLACK
    if (
        not label.window_start - before
        <= incident.first_signal_ts
        <= label.effect_end_ts + AFTER_SLACK
    ):
        return False
    if label.culprit_nodes and incident.culprit_nodes:
        return bool(set(incident.culprit_nodes) & set(label.culprit_nodes))
    return True


def _assign(faults: Sequence[FaultLabel], incidents: Sequence[Incident]) -> dict[int, int]:
    """Fault index -> incident index: pairs in a fault's window, best pair score first, each at most
    once.
    """
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
    return incident_of


def _owner(incident: Incident, faults: Sequence[FaultLabel], incidents: Sequence[Incident],
           incident_of: dict[int, int]) -> int | None:
    """The matched fault an unassigned incident duplicates (in its window, the same class or
    overlapping nodes).
    """
    for li, label in enumerate(faults):
        if li not in incident_of or not _in_window(incident, label):
            continue
        matched = incidents[incident_of[li]]
        if (incident.incident_class == matched.incident_class
                or set(incident.culprit_nodes) & set(label.culprit_nodes)
                or (not label.culprit_nodes and not incident.culprit_nodes)):
            return li
    return None


def match(
    labels: Sequence[FaultLabel], incidents: Sequence[Incident]
) -> tuple[list[Match], list[FalseAlarm]]:
    faults = [label for label in labels if label.is_fault]
    benign = [label for label in labels if not label.is_fault]
    incident_of = _assign(faults, incidents)
    assigned = set(incident_of.values())
    duplicates: dict[int, list[Incident]] = defaultdict(list)
    false_alarms: list[FalseAlarm] = []
    for ii, incident in enumerate(incidents):
        if ii in assigned:
            continue
        owner = _owner(incident, faults, incidents, incident_of)
        if owner is not None:
            duplicates[owner].append(incident)
            continue
        noise = next(
            (
                b.kind
                for b in benign
                if _in_window(incident, b)
                and (not b.culprit_nodes or set(b.culprit_nodes) & set(incident.culprit_nodes))
            ),
            None,
        )
        false_alarms.append(FalseAlarm(incident, noise))
    matches = [Match(label, incidents[incident_of[li]] if li in incident_of else None,
                     duplicates=tuple(duplicates.get(li, ()))) for li, label in enumerate(faults)]
    return matches, false_alarms
