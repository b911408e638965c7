"""The store's answers about incidents and decisions: the queries the engine and the follower, the
CLI (controller/cli), the reports (controller/report), goodput (attribution/goodput) and the
policy's history share, each asked in one place here.

Which incident row counts. The incidents table may hold several rows of one incident id: ids are
deterministic (Incident.make_id over what identifies the failure), so a follower racing a batch
pass, or a pass re-run before the first one's rows were listed, writes the same incident again.
Every query here reads an incident as its first report: the row of the earliest detection
(detected_ts; ts where a row has none, as Incident.from_row reads it), then the earliest ts, then
the row's text (any fixed order would do there: such rows are one incident reported twice at the
same moment). Why that row: the id names one failure, and its first report is what was known first
and what the first decision was made from; it does not move when a later pass writes the id again,
and, unlike the first row scanned, it does not depend on how segments are listed or compacted. It is
also the row `faultlens incidents` and the reports have always shown: they took the earliest ts, and
ts is detected_ts on every row Incident.to_row writes. (Before this module `faultlens decide` and
the policy's history took the newest row, goodput the minimum of each column, the follower the first
row scanned, the lemon-node count any row: for an incident written twice with the same content, the
same rows; the follower's failures, listed in scan order then, are listed as below now.) A row
without an incident id is no incident's report. The choice is made among all rows of an id, then the
filters (a job, an id, classes) apply to the chosen row. Listings are in order of that detection,
then id.

Which decision row counts. The decisions table is append-only: a decision's first row (earliest ts)
is its issue, as the DecisionLog keeps the first document persisted; the later rows record
deliveries. A decision reads as its first row (ties: the row's text), listed in order of issued_ts,
then decision id; its delivery status for a hook is the latest row of that hook.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from faultlens.attribution.incident import Incident, IncidentClass

if TYPE_CHECKING:  # types only: the policy's history imports this module and stays free of DuckDB
    import pyarrow as pa

    from faultlens.attribution.reading.store import Store

#: each incident once, as its first report (the module's rule); every column of the incidents table
FIRST_REPORTS_SQL = """
    SELECT i.* FROM incidents i WHERE i.incident_id IS NOT NULL
    QUALIFY row_number() OVER (
        PARTITION BY i.incident_id
        ORDER BY coalesce(i.detected_ts, i.ts), i.ts, CAST(i AS VARCHAR)) = 1"""
#: each decision once, as its first row (its issue); every column of the decisions table
FIRST_DECISIONS_SQL = """
    SELECT d.* FROM decisions d WHERE d.decision_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY d.decision_id ORDER BY d.ts, CAST(d AS VARCHAR)) = 1"""


def existing_incident_ids(store: Store) -> set[str]:
    """Every incident id in the store (what a pass must not write again)."""
    table = store.query("SELECT DISTINCT incident_id FROM incidents WHERE incident_id IS NOT NULL")
    return set(table.column("incident_id").to_pylist()) if table.num_rows else set()


def incident_ids_starting(store: Store, prefixes: Sequence[str]) -> list[str]:
    """The incident ids that start with any of `prefixes`, sorted."""
    if not prefixes:
        return []
    rows = store.query("SELECT DISTINCT incident_id FROM incidents WHERE "
                       + " OR ".join("starts_with(incident_id, ?)" for _ in prefixes),
                       list(prefixes)).to_pylist()
    return sorted(r["incident_id"] for r in rows)


def incident_table(store: Store, *, job: str | None = None, incident_id: str | None = None,
                   classes: Sequence[str] | None = None, exclude_id: str | None = None) -> pa.Table:
    """Each incident once, as its first report (module docstring), in order of detection, then
    id; only those of `job`, the one `incident_id`, those of `classes`, all but `exclude_id`, as
    given."""
    conditions: list[str] = []
    params: list[Any] = []
    if job is not None:
        conditions.append("job_id = ?")
        params.append(job)
    if incident_id is not None:
        conditions.append("incident_id = ?")
        params.append(incident_id)
    if exclude_id is not None:
        conditions.append("incident_id <> ?")
        params.append(exclude_id)
    if classes is not None:
        if not classes:
            conditions.append("FALSE")
        else:
            conditions.append(f'"class" IN ({", ".join("?" for _ in classes)})')
            params.extend(classes)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    return store.query(f"SELECT * FROM ({FIRST_REPORTS_SQL}) {where} "
                       "ORDER BY coalesce(detected_ts, ts), incident_id", params or None)


def incident_rows(store: Store, **filters: Any) -> list[dict[str, Any]]:
    """incident_table's rows as dicts (JSON-ready after the caller's formatting)."""
    return incident_table(store, **filters).to_pylist()


def stored_incidents(store: Store, **filters: Any) -> list[Incident]:
    """incident_table's rows as Incidents."""
    return [Incident.from_row(row) for row in incident_rows(store, **filters)]


def existing_failures(store: Store) -> list[Incident]:
    """Crash and hang incidents already in the store (they explain GPU events: no health incident
    for those), each once, as its first report."""
    classes = (IncidentClass.CRASH.value, IncidentClass.COLLECTIVE_HANG.value)
    return stored_incidents(store, classes=classes)


def decision_table(store: Store, *, job: str | None = None,
                   incident_id: str | None = None) -> pa.Table:
    """Each decision once, as its first row (module docstring), in order of issued_ts, then
    decision id; only those of `job`, of `incident_id`, as given."""
    conditions: list[str] = []
    params: list[Any] = []
    if job is not None:
        conditions.append("job_id = ?")
        params.append(job)
    if incident_id is not None:
        conditions.append("incident_id = ?")
        params.append(incident_id)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    return store.query(f"SELECT * FROM ({FIRST_DECISIONS_SQL}) {where} "
                       "ORDER BY issued_ts, decision_id", params or None)


def decision_rows(store: Store, **filters: Any) -> list[dict[str, Any]]:
    """decision_table's rows as dicts."""
    return decision_table(store, **filters).to_pylist()


def latest_deliveries(store: Store, incident_id: str) -> list[dict[str, Any]]:
    """The latest row of each (decision, hook) of `incident_id`'s decisions (the row of no hook
    counts as one hook), in order of ts: what each hook last reported (status, error, attempts)."""
    return store.query("""
        SELECT * FROM (
            SELECT d.* FROM decisions d WHERE d.decision_id IS NOT NULL
            QUALIFY row_number() OVER (PARTITION BY d.decision_id, coalesce(d.hook, '')
                                       ORDER BY d.ts DESC, CAST(d AS VARCHAR)) = 1)
        WHERE incident_id = ? ORDER BY ts, decision_id, hook""", [incident_id]).to_pylist()


def decided_incident_ids(store: Store) -> set[str]:
    """The incident ids some decision is for."""
    rows = store.query("SELECT DISTINCT incident_id FROM decisions WHERE incident_id IS NOT NULL")
    return set(rows.column("incident_id").to_pylist())
