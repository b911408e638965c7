"""What `faultlens jobs`, `faultlens incident` and the HTML report read from the store: jobs, one
incident with its decisions, one job's attempts, incidents, step times and GPU signals. Plain dicts
and lists (JSON-ready)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from faultlens.attribution.goodput import GoodputError, GoodputReport, goodput
from faultlens.attribution.reading.queries import (
    decision_rows,
    incident_ids_starting,
    incident_rows,
    latest_deliveries,
)
from faultlens.attribution.reading.store import QueryError, Store
from faultlens.errors import FaultlensError

RUNNING_WITHIN_S = 120.0  # a job whose last telemetry is this recent (to now) is shown as running


class ViewError(ValueError, FaultlensError):
    """What was asked for is not in the store (an unknown job or incident): the message says which.
    """


def job_ids(store: Store) -> list[dict[str, Any]]:
    """Every job with telemetry: id, attempts, first and last telemetry time."""
    sql = """
        WITH t AS (
            SELECT job_id, attempt, ts FROM ranks UNION ALL SELECT job_id, attempt, end_ts FROM steps
            UNION ALL SELECT job_id, attempt, ts FROM process_events
        )
        SELECT job_id, count(DISTINCT coalesce(attempt, 0)) AS attempts, max(coalesce(attempt, 0)) AS last_attempt,
               min(ts) AS first_ts, max(ts) AS last_ts
        FROM t WHERE job_id IS NOT NULL GROUP BY job_id ORDER BY min(ts), job_id"""
    return store.query(sql).to_pylist()


def _state(store: Store, job: dict[str, Any], incidents: list[dict[str, Any]],
           decisions: list[dict[str, Any]], now: dt.datetime) -> str:
    """What happened to the job (attribution/goodput/jobstate.py)."""
    from faultlens.attribution.goodput.jobstate import agent_exits, judge_job_state

    exits, launched = agent_exits(store, job["job_id"])
    return judge_job_state(last_attempt=job["last_attempt"], last_ts=job["last_ts"], exits=exits,
                           launched=launched, incidents=incidents, decisions=decisions, now=now,
                           running_within_s=RUNNING_WITHIN_S).value


@dataclass(frozen=True)
class JobRow:
    job_id: str
    attempts: int
    state: str
    incidents: int
    decisions: str
    ettr: float | None
    first_ts: dt.datetime | None
    last_ts: dt.datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempts": self.attempts,
            "state": self.state,
            "incidents": self.incidents,
            "decisions": self.decisions,
            "ettr": None if self.ettr is None else round(self.ettr, 4),
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
        }


def list_jobs(
    store: Store, *, now: dt.datetime | None = None, with_ettr: bool = True
) -> list[JobRow]:
    now = now or dt.datetime.now(dt.UTC)
    jobs = job_ids(store)
    incidents = incident_rows(store)
    decisions = decision_rows(store)
    rows = []
    for job in jobs:
        jid = job["job_id"]
        mine = [i for i in incidents if i["job_id"] == jid]
        decided = [d for d in decisions if d["job_id"] == jid]
        counts: dict[str, int] = {}
        for d in decided:
            counts[d["action"]] = counts.get(d["action"], 0) + 1
        ettr = None
        if with_ettr:
            try:
                ettr = goodput(store, jid).ettr
            except (GoodputError, QueryError):
                ettr = None
        state = _state(store, job, mine, decided, now)
        rows.append(JobRow(jid, int(job["attempts"]), state, len(mine),
                           ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) or "-", ettr,
                           job["first_ts"], job["last_ts"]))
    return rows


def find_incident_id(store: Store, text: str) -> str:
    """The incident id that `text` names: the id itself, or a unique prefix (with or without
    'inc-').
    """
    candidates = [text, f"inc-{text}"] if not text.startswith("inc-") else [text]
    ids = incident_ids_starting(store, candidates)
    if text in ids:
        return text
    if not ids:
        raise ViewError(f"no incident {text!r} in the store (faultlens incidents lists them)")
    if len(ids) > 1:
        raise ViewError(f"{text!r} names {len(ids)} incidents ({', '.join(ids[:4])}...): give more "
                        "of the id")
    return ids[0]


def load_incident(store: Store, incident_id: str) -> dict[str, Any]:
    """One incident (its first report), its decisions (first row each, with the latest delivery
    status per hook): attribution/reading/queries.py says which rows those are."""
    rows = incident_rows(store, incident_id=incident_id)
    if not rows:
        raise ViewError(f"no incident {incident_id!r} in the store")
    incident = rows[0]
    decisions = decision_rows(store, incident_id=incident_id)
    deliveries = latest_deliveries(store, incident_id)
    for decision in decisions:
        decision["policy_rule"] = _policy_rule(decision)
        decision["deliveries"] = [
            {
                "hook": d["hook"],
                "status": d["delivery_status"],
                "error": d["delivery_error"],
                "attempts": d["delivery_attempts"],
            }
            for d in deliveries
            if d["decision_id"] == decision["decision_id"] and d["hook"]
        ]
    incident["decisions"] = decisions
    return incident


def _policy_rule(decision: dict[str, Any]) -> str | None:
    """The policy rule that chose the action: in the decision's JSON document (the row's `rule` is
    the attribution rule)."""
    import json

    try:
        return json.loads(decision.get("document") or "{}").get("policy_rule")
    except (ValueError, AttributeError):
        return None


def job_goodput(store: Store, job_id: str) -> GoodputReport | None:
    try:
        return goodput(store, job_id)
    except (GoodputError, QueryError):
        return None


def job_data(store: Store, job_id: str) -> dict[str, Any]:
    """Everything the HTML report shows of one job."""
    known = {j["job_id"]: j for j in job_ids(store)}
    if job_id not in known:
        hint = ", ".join(list(known)[:5])
        raise ViewError(
            f"no job {job_id!r} in the store" + (f" (jobs: {hint})" if hint else " (it is empty)")
        )
    params = [job_id]
    attempts = store.query(
        """WITH t AS (SELECT attempt, ts, node FROM ranks WHERE job_id = ?
                      UNION ALL SELECT attempt, start_ts, node FROM steps WHERE job_id = ?
                      UNION ALL SELECT attempt, ts, node FROM process_events WHERE job_id = ?)
           SELECT coalesce(attempt, 0) AS attempt, min(ts) AS start, max(ts) AS end,
                  list(DISTINCT node ORDER BY node) FILTER (WHERE node IS NOT NULL) AS nodes
           FROM t GROUP BY 1 ORDER BY 1""", params * 3).to_pylist()
    incidents = incident_rows(store, job=job_id)
    decisions = decision_rows(store, job=job_id)
    for decision in decisions:
        decision["policy_rule"] = _policy_rule(decision)
    steps = _step_grid(store, job_id)
    job_nodes = sorted({n for a in attempts for n in (a["nodes"] or [])})
    starts = {a["attempt"]: a["start"] for a in attempts}
    around = [_gpu_around(store, incident, job_nodes, starts.get(incident.get("attempt") or 0))
              for incident in incidents]
    report = job_goodput(store, job_id)
    return {"job_id": job_id, "attempts": attempts, "incidents": incidents, "decisions": decisions,
            "steps": steps, "gpu_around": around,
            "goodput": None if report is None else report.to_dict(include_timeline=True)}


MAX_STEP_COLUMNS = 300
MAX_RANK_ROWS = 128
GPU_BEFORE_S = 90.0
GPU_AFTER_S = 30.0
GPU_NODES = 4


def _step_grid(store: Store, job_id: str) -> dict[str, Any]:
    """Mean step time per (attempt, step bucket, rank bucket): at most MAX_STEP_COLUMNS step buckets
    per attempt and MAX_RANK_ROWS rank buckets, so a long job on many ranks still makes a page a
    browser opens at once."""
    span = store.query(
        """SELECT coalesce(attempt, 0) AS attempt, min(step) AS lo, max(step) AS hi, max(rank) AS ranks
                          FROM steps WHERE job_id = ? AND rank IS NOT NULL GROUP BY 1 ORDER BY 1""",
        [job_id],
    ).to_pylist()
    if not span:
        return {"step_bucket": 1, "rank_bucket": 1, "cells": []}
    widest = max(r["hi"] - r["lo"] + 1 for r in span)
    ranks = max(r["ranks"] for r in span) + 1
    step_bucket = max(1, -(-widest // MAX_STEP_COLUMNS))
    rank_bucket = max(1, -(-ranks // MAX_RANK_ROWS))
    cells = store.query(
        f"""SELECT coalesce(attempt, 0) AS attempt, (step // {step_bucket}) * {step_bucket} AS step,
                   (rank // {rank_bucket}) * {rank_bucket} AS rank, avg(duration_s) AS seconds
            FROM steps WHERE job_id = ? AND rank IS NOT NULL AND coalesce(phase, 'train') <> 'checkpoint'
            GROUP BY ALL ORDER BY 1, 2, 3""", [job_id]).to_pylist()
    return {"step_bucket": step_bucket, "rank_bucket": rank_bucket, "cells": cells}


def _gpu_around(store: Store, incident: dict[str, Any], job_nodes: list[str],
                attempt_start: dt.datetime | None = None) -> dict[str, Any]:
    """GPU samples and events of the incident's culprit nodes (else the job's first nodes) from
    GPU_BEFORE_S before its first signal (at the earliest its attempt's start) to GPU_AFTER_S after
    its detection."""
    nodes = list(incident.get("culprit_nodes") or []) or job_nodes[:GPU_NODES]
    first = incident.get("first_signal_ts") or incident.get("detected_ts")
    last = incident.get("detected_ts") or first
    if not nodes or first is None:
        return {"incident_id": incident["incident_id"], "nodes": nodes, "samples": [], "events": []}
    lo, hi = first - dt.timedelta(seconds=GPU_BEFORE_S), last + dt.timedelta(seconds=GPU_AFTER_S)
    if attempt_start is not None and attempt_start < first:
        lo = max(lo, attempt_start - dt.timedelta(seconds=5))
    marks = ", ".join("?" for _ in nodes)
    samples = store.query(
        f"""SELECT ts, node, gpu_index, gpu_uuid, source, temp_c, power_w, sm_clock_mhz, gpu_util_pct
            FROM gpu_samples
            WHERE node IN ({marks}) AND ts BETWEEN ? AND ? ORDER BY ts LIMIT 20000""",
        [*nodes, lo, hi],
    ).to_pylist()
    events = store.query(
        f"""SELECT ts, node, gpu_index, kind, code, message FROM gpu_events
            WHERE node IN ({marks}) AND ts BETWEEN ? AND ? ORDER BY ts LIMIT 200""", [*nodes, lo, hi]).to_pylist()
    return {
        "incident_id": incident["incident_id"],
        "nodes": nodes,
        "from": lo,
        "to": hi,
        "samples": samples,
        "events": events,
    }
