"""Scoring attribution against ground truth: incidents (from the store or the engine) versus fault
labels.

Matching: an incident can stand for a labelled fault when it belongs to the same job and its span
(first signal to newest evidence) or its detection falls inside the fault's window (from its onset
to the end of its effect, with a little slack). Pairs are assigned greedily, best first (same class,
overlapping culprit nodes, compatible cause, closeness in time); each incident stands for at most
one fault. An unassigned incident inside a matched fault's window that agrees with it (same class or
overlapping nodes) is a *duplicate* (reported, not a false alarm); any other unassigned incident is
a *false alarm*, attributed to the benign noise it coincides with when there is one.

Metrics: precision/recall/F1 per incident class and for detection regardless of class; culprit-node
localisation counted per node over faults that have a culprit node (Minder-style: a fault's node
named = TP, a node named that is not the fault's = FP, a fault's node not named = FN; false alarms
add their nodes as FP); cause accuracy (exact, and by family: hardware/software/...); decisions
(from the decisions table, else the decision policy, else the docs/design.md rules, whichever is
available): automatic failovers of software-side faults, healthy nodes excluded, escalation rate,
share of faults handled without a human; detection latency (detected - injected, simulated time).

Modules: report (the public types, the report's JSON and tables, cause families), matching (windows,
pair scores, assignment, duplicates and false alarms, stands_for), metrics (one function per metric
family; evaluate), sources (incidents and decisions to score: tables, the engine, the policy in
order, the docs/design.md rules).
"""

from faultlens.controller.lab.evaluate.matching import (
    AFTER_SLACK,
    BEFORE_SLACK,
    STRAGGLER_LEAD,
    match,
    stands_for,
)
from faultlens.controller.lab.evaluate.metrics import evaluate
from faultlens.controller.lab.evaluate.report import (
    HARDWARE,
    SOFTWARE,
    DecideFn,
    DecisionView,
    EvalReport,
    FalseAlarm,
    Match,
    Score,
    cause_family,
    report_rows,
)
from faultlens.controller.lab.evaluate.sources import (
    EvalError,
    decide_in_order,
    design_rules,
    incidents_from_rows,
    load_decider,
    load_incidents,
)

__all__ = [
    "AFTER_SLACK",
    "BEFORE_SLACK",
    "HARDWARE",
    "SOFTWARE",
    "STRAGGLER_LEAD",
    "DecideFn",
    "DecisionView",
    "EvalError",
    "EvalReport",
    "FalseAlarm",
    "Match",
    "Score",
    "cause_family",
    "decide_in_order",
    "design_rules",
    "evaluate",
    "incidents_from_rows",
    "load_decider",
    "load_incidents",
    "match",
    "report_rows",
    "stands_for",
]
