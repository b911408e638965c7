"""What the policy knows of the past: the PolicyHistory protocol, NoHistory (nothing in it) and
StoreHistory (the incidents, decisions and ranks tables of a faultlens store), and the lemon nodes
they report."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.policy.config import LemonRule
from faultlens.attribution.reading.queries import FIRST_REPORTS_SQL, stored_incidents

_CAUSES = [c.value for c in Cause]


@dataclass(frozen=True)
class LemonNode:
    node: str
    incidents: int
    jobs: int


class PolicyHistory(Protocol):
    """What the policy needs to know about the past."""

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        """Failover decisions already issued for this job with this root cause (other incidents)."""
        ...

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        """Other incidents of the same job (every attempt)."""
        ...

    def lemon_nodes(self, rule: LemonRule, now: dt.datetime) -> list[LemonNode]:
        """Nodes implicated repeatedly across jobs within the rule's window."""
        ...

    def job_nodes(self, job_id: str | None) -> set[str]:
        """Nodes the job runs on (from the ranks table)."""
        ...


class NoHistory:
    """A policy history with nothing in it (a first incident, no store)."""

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        return 0

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        return []

    def lemon_nodes(self, rule: LemonRule, now: dt.datetime) -> list[LemonNode]:
        return []

    def job_nodes(self, job_id: str | None) -> set[str]:
        return set()


class StoreHistory:
    """PolicyHistory over a faultlens store (faultlens.attribution.reading.store.Store):
    incidents, decisions and ranks tables (incidents as their first reports:
    attribution/reading/queries.py). Every call refreshes the listing of the tables it reads, so a
    live policy sees rows written since."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _query(self, tables: Iterable[str], sql: str, params: list[Any]) -> list[dict[str, Any]]:
        self.store.refresh(tuple(tables))
        return self.store.query(sql, params).to_pylist()

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        if job_id is None:
            return 0
        rows = self._query(["decisions"], """
            SELECT count(DISTINCT decision_id) AS n FROM decisions
            WHERE job_id = ? AND action = 'failover' AND cause = ? AND incident_id <> ?
              AND (? IS NULL OR "class" = ?)""",
                           [job_id, cause.value, exclude_incident_id,
                            *(2 * [incident_class.value if incident_class is not None else None])])
        return int(rows[0]["n"]) if rows else 0

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        if job_id is None:
            return []
        self.store.refresh(("incidents",))
        return stored_incidents(self.store, job=job_id, exclude_id=exclude_incident_id)

    def lemon_nodes(self, rule: LemonRule, now: dt.datetime) -> list[LemonNode]:
        since = now - dt.timedelta(days=rule.window_days)
        causes = sorted(c.value for c in rule.causes) if rule.causes is not None else _CAUSES
        placeholders = ", ".join("?" for _ in causes)
        rows = self._query(["incidents"], f"""
            WITH implicated AS (
                SELECT DISTINCT incident_id, job_id, unnest(culprit_nodes) AS node
                FROM ({FIRST_REPORTS_SQL})
                WHERE ts >= ? AND cause IN ({placeholders}) AND class <> 'health')
            SELECT node, count(DISTINCT incident_id) AS incidents, count(DISTINCT job_id) AS jobs
            FROM implicated WHERE node IS NOT NULL GROUP BY node
            HAVING count(DISTINCT incident_id) >= ? AND count(DISTINCT job_id) >= ?
            ORDER BY node""", [since, *causes, rule.min_incidents, rule.min_jobs])
        return [LemonNode(r["node"], int(r["incidents"]), int(r["jobs"])) for r in rows]

    def job_nodes(self, job_id: str | None) -> set[str]:
        if job_id is None:
            return set()
        rows = self._query(["ranks"], "SELECT DISTINCT node FROM ranks WHERE job_id = ? AND node "
                                      "IS NOT NULL",
                           [job_id])
        return {r["node"] for r in rows}
