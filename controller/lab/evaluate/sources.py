"""Where the evaluation's incidents and decisions come from: the store's incidents table or an
engine run; the decisions table, the decision policy applied in order, or the docs/design.md rules.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.controller.lab.evaluate.report import DecideFn, DecisionView
from faultlens.errors import FaultlensError


class EvalError(RuntimeError, FaultlensError):
    """Incidents or decisions cannot be obtained: the message says what is missing."""


def design_rules(incident: Incident) -> DecisionView:
    """The decision policy as docs/design.md words it, for when no policy module or decisions table
    is available: escalate software-side causes and anything without exactly one culprit node; drain
    on health events; fail over otherwise (excluding the culprit node)."""
    if incident.incident_class is IncidentClass.HEALTH:
        return DecisionView("drain", tuple(incident.culprit_nodes), "design-health")
    if incident.cause in (Cause.SOFTWARE, Cause.OOM, Cause.WORKLOAD_IMBALANCE):
        return DecisionView("escalate", (), "design-software")
    if len(set(incident.culprit_nodes)) == 1:
        return DecisionView("failover", tuple(incident.culprit_nodes), "design-one-node")
    return DecisionView("escalate", (), "design-no-single-culprit")


def incidents_from_rows(rows: Iterable[dict[str, Any]]) -> list[Incident]:
    return [Incident.from_row(row) for row in rows]


def load_incidents(
    store: Any, *, job: str | None = None, rerun: bool = False
) -> tuple[list[Incident], str]:
    """The incidents to score: the store's incidents table when it has rows (and rerun is False),
    else what the engine (faultlens.attribution.engine.attribute) finds now. Returns (incidents,
    where they came from)."""
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
    (faultlens.attribution.policy.DecisionPolicy with rules/policy.yaml, applied to the incidents in
    the order they began, each seeing the ones before it as the job's history), else the
    docs/design.md rules."""
    table = store.query('SELECT incident_id, action, exclude_nodes, rule FROM "decisions" ORDER BY '
                        'ts')
    if table.num_rows:
        recorded = {
            row["incident_id"]: DecisionView(
                row["action"], tuple(row["exclude_nodes"] or ()), row["rule"] or ""
            )
            for row in table.to_pylist()
        }

        def from_table(incident: Incident) -> DecisionView:
            return recorded.get(incident.incident_id, DecisionView("none"))

        return from_table, "decisions table"
    try:
        from faultlens.attribution.policy import DecisionPolicy
    except ImportError:
        return design_rules, "design-rules (no decision policy available)"
    decided = decide_in_order(DecisionPolicy, incidents)
    return (
        lambda incident: decided.get(incident.incident_id, DecisionView("none"))
    ), "faultlens.attribution.policy"


class _EvalHistory:
    """The PolicyHistory a live policy would have had: the incidents decided before, and their
    failovers.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[Incident, str]] = []  # (incident, action), in decision order

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        return sum(
            1
            for incident, action in self.seen
            if incident.job_id == job_id
            and incident.cause == cause
            and (incident_class is None or incident.incident_class == incident_class)
            and action == "failover"
            and incident.incident_id != exclude_incident_id
        )

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        return [
            i for i, _ in self.seen if i.job_id == job_id and i.incident_id != exclude_incident_id
        ]

    def lemon_nodes(self, rule: Any, now: dt.datetime) -> list[Any]:
        return []  # one simulated job: no cross-job history

    def job_nodes(self, job_id: str | None) -> set[str]:
        return set()


def decide_in_order(policy_type: Any, incidents: Sequence[Incident]) -> dict[str, DecisionView]:
    """Apply a DecisionPolicy to incidents in the order they began, each seeing the earlier ones as
    history.
    """
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
