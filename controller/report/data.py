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
    """What was asked for is not in the store (an unknown job, attempt or incident): the message
    says which."""


def job_ids(store: Store) -> list[dict[str, Any]]:
    """Every job with telemetry: id, attempts, first and last telemetry time."""
    sql = """
        WITH t AS (
            SELECT job_id, attempt, ts FROM ranks
            UNION ALL SELECT job_id, attempt, end_ts FROM steps
            UNION ALL SELECT job_id, attempt, ts FROM process_events
        )
        SELECT job_id, count(DISTINCT coalesce(attempt, 0)) AS attempts,
               max(coalesce(attempt, 0)) AS last_attempt, min(ts) AS first_ts, max(ts) AS last_ts
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
        raise ViewError(
            f"{text!r} names {len(ids)} incidents ({', '.join(ids[:4])}...): give more of the id"
        )
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


def numerics_observations(store: Store, job_id: str) -> list[dict[str, Any]]:
    """What the numerics detector saw of the job that is no incident (a loss spike that came
    back, one step's gradient-norm outlier: attribution/detectors/numerics.py), for its
    timeline: from the steps' mean loss per step and the job's numerics rows."""
    from faultlens.attribution.detectors.numerics import NumericsJudge
    from faultlens.attribution.rules import load_thresholds

    try:
        steps = store.query(
            "SELECT job_id, attempt, step, phase, avg(loss) FILTER (WHERE isfinite(loss)) AS "
            "loss, max(ts) AS ts FROM steps WHERE job_id = ? AND loss IS NOT NULL "
            "GROUP BY job_id, attempt, step, phase",
            [job_id],
        ).to_pandas()
        numerics = store.query(
            "SELECT * FROM numerics WHERE job_id = ? "
            "AND (grad_norm IS NOT NULL OR loss IS NOT NULL)",
            [job_id],
        ).to_pandas()
    except QueryError:
        return []
    if steps.empty and numerics.empty:
        return []
    judge = NumericsJudge(load_thresholds().loss)
    return [
        {
            "attempt": o.attempt,
            "step": o.step,
            "kind": o.kind,
            "ranks": list(o.ranks),
            "text": o.text,
            "ts": o.ts,
        }
        for o in judge.observations_of(steps, numerics)
    ]


def job_data(store: Store, job_id: str, *, attempt: int | None = None) -> dict[str, Any]:
    """Everything the HTML report shows of one job (of one of its attempts, when `attempt` is
    given)."""
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
           FROM t GROUP BY 1 ORDER BY 1""",
        params * 3,
    ).to_pylist()
    incidents = incident_rows(store, job=job_id)
    decisions = decision_rows(store, job=job_id)
    if attempt is not None:
        if attempt not in {a["attempt"] for a in attempts}:
            shown = ", ".join(str(a["attempt"]) for a in attempts) or "none"
            raise ViewError(f"job {job_id!r} has no attempt {attempt} (its attempts: {shown})")
        attempts = [a for a in attempts if a["attempt"] == attempt]
        incidents = [i for i in incidents if (i.get("attempt") or 0) == attempt]
        decisions = [d for d in decisions if (d.get("attempt") or 0) == attempt]
    for decision in decisions:
        decision["policy_rule"] = _policy_rule(decision)
    by_attempt = {a["attempt"]: a for a in attempts}
    culprits: dict[int, set[int]] = {}
    for incident in incidents:
        culprits.setdefault(incident.get("attempt") or 0, set()).update(
            int(r) for r in incident.get("culprit_ranks") or []
        )
    steps = step_grid(store, job_id, [a["attempt"] for a in attempts], culprits)
    around = [
        gpu_around(store, incident, by_attempt.get(incident.get("attempt") or 0))
        for incident in incidents
    ]
    report = job_goodput(store, job_id)
    seen = numerics_observations(store, job_id)
    if attempt is not None:
        seen = [o for o in seen if o["attempt"] == attempt]
    return {
        "job_id": job_id,
        "attempts": attempts,
        "incidents": incidents,
        "decisions": decisions,
        "steps": steps,
        "gpu_around": around,
        "only_attempt": attempt,
        "observations": seen,
        "goodput": None if report is None else report.to_dict(include_timeline=True),
    }


MAX_STEP_COLUMNS = 300
MAX_RANK_ROWS = 128
#: ranks shown in each attempt's own-compute-per-section table: the culprits and those with the
#: most excess
SECTION_TABLE_RANKS = 4
GPU_BEFORE_S = 90.0
GPU_AFTER_S = 30.0
#: the job's nodes are sampled for it while its attempt runs: the GPU window ends this long after
#: the attempt's last telemetry (and starts at the attempt's start at the earliest)
GPU_TAIL_S = 0.5
GPU_NODES = 4
#: time buckets per GPU series: a window of any length and sampling rate is drawn from at most this
#: many points (each the bucket's mean), never cut short by a row limit
GPU_POINTS = 240
MAX_SECTION_NAMES = 400


def _own_work_map(store: Store, job_id: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """(section name, own-work section it counts in, +1 or -1) for the job's section names, and
    the names the vocabulary does not know. Own work is what the straggler analysis scores
    (attribution/detectors/straggler/vocab.py, rules/comm_ops.yaml): compute and data, a nested
    section left to its timed parent, communication nested in an own-work section taken out of it
    (a stage waiting in `forward/recv` has not computed for longer)."""
    from faultlens.attribution.detectors.straggler.vocab import (
        SectionKind,
        VocabularyError,
        load_vocabulary,
    )

    names = [
        r["n"]
        for r in store.query(
            "SELECT DISTINCT unnest(map_keys(sections)) AS n FROM steps WHERE job_id = ? "
            f"ORDER BY 1 LIMIT {MAX_SECTION_NAMES}",
            [job_id],
        ).to_pylist()
        if r["n"] is not None
    ]
    if not names:
        return [], []
    try:
        chosen, classes = load_vocabulary().scored(names)
    except VocabularyError:
        return [], names
    comm = [n for n, c in classes.items() if c.kind is SectionKind.COMM]
    mapping: list[tuple[str, str, int]] = []
    for name in chosen:
        mapping.append((name, name, 1))
        inner = [n for n in comm if n.startswith(name + "/")]
        # only the outermost communication below the section (an inner one is inside it already)
        for n in inner:
            if not any(n.startswith(o + "/") for o in inner if o != n):
                mapping.append((n, name, -1))
    unknown = [n for n, c in classes.items() if c.kind is SectionKind.UNKNOWN]
    return mapping, unknown


def _grid_sql(mapping: list[tuple[str, str, int]]) -> tuple[str, list[Any]]:
    """The CTEs the step grid and the section table read: each row's own work per section, its
    peers' median (ranks of the same pipeline stage, same step and phase; the lower median, an
    actual rank's time, so that of two peers the slower is measured against the faster), and the
    step's median time."""
    if mapping:
        values = ", ".join("(?, ?, ?)" for _ in mapping)
        m = f"m(name, target, sign) AS (VALUES {values})"
        m_params: list[Any] = [v for row in mapping for v in row]
    else:
        m = "m AS (SELECT NULL::VARCHAR AS name, NULL::VARCHAR AS target, 0 AS sign WHERE false)"
        m_params = []
    sql = f"""
        WITH stage AS (
            SELECT coalesce(attempt, 0) AS attempt, rank, coalesce(max(pp_rank), -1) AS pp
            FROM ranks WHERE job_id = ? AND rank IS NOT NULL GROUP BY ALL),
        rows AS (
            SELECT coalesce(s.attempt, 0) AS attempt, s.step, s.rank,
                   coalesce(s.phase, 'train') AS phase, s.duration_s, s.sections,
                   coalesce(g.pp, -1) AS pp
            FROM steps s LEFT JOIN stage g ON coalesce(s.attempt, 0) = g.attempt AND s.rank = g.rank
            WHERE s.job_id = ? AND s.rank IS NOT NULL AND s.step IS NOT NULL
              AND coalesce(s.phase, 'train') <> 'checkpoint'),
        {m},
        parts AS (
            SELECT attempt, step, rank, phase, pp, e.key AS name, e.value AS seconds
            FROM (SELECT attempt, step, rank, phase, pp, unnest(map_entries(sections)) AS e
                  FROM rows)),
        own AS (
            SELECT attempt, step, rank, phase, pp, m.target AS name,
                   greatest(sum(m.sign * p.seconds), 0) AS own_s
            FROM parts p JOIN m ON p.name = m.name
            WHERE p.seconds IS NOT NULL AND isfinite(p.seconds) GROUP BY ALL),
        med AS (
            SELECT attempt, step, phase, pp, name, quantile_disc(own_s, 0.5) AS med_s
            FROM own GROUP BY ALL),
        cell_own AS (
            SELECT o.attempt, o.step, o.rank, o.phase, sum(o.own_s) AS own_s,
                   sum(greatest(o.own_s - d.med_s, 0)) AS excess_s
            FROM own o JOIN med d USING (attempt, step, phase, pp, name) GROUP BY ALL),
        step_med AS (
            SELECT attempt, step, phase, median(duration_s) AS step_med_s FROM rows GROUP BY ALL)
    """
    return sql, [None, None, *m_params]  # the two job ids are filled in by the caller


def step_grid(
    store: Store, job_id: str, attempts: list[int], culprits: dict[int, set[int]] | None = None
) -> dict[str, Any]:
    """Per (attempt, step bucket, rank bucket): the mean step time and the rank's own work beyond
    its peers' (the sum over own-work sections of what it spent above the median rank of its stage
    at that step; the bucket's worst rank). Step time alone cannot tell a straggler apart: in a
    synchronous job its peers wait for it inside the step, so every rank's step takes as long.

    At most MAX_STEP_COLUMNS step buckets per attempt and MAX_RANK_ROWS rank buckets, so a long job
    on many ranks still makes a page a browser opens at once. Also: per attempt, the ranks with the
    most own-work excess (and the incident's culprits) section by section; ranks that reached steps
    with no step row (the heartbeats' last completed step: a rank killed between the timer's
    flushes lost its last rows with it) and the ranks that exited abnormally."""
    culprits = culprits or {}
    empty = {
        "step_bucket": 1,
        "rank_bucket": 1,
        "cells": [],
        "basis": "step",
        "sections": {},
        "ranks": {},
        "reached": [],
        "exits": [],
        "unknown_sections": [],
    }
    if not attempts:
        return empty
    marks = ", ".join("?" for _ in attempts)
    span = store.query(
        f"""SELECT coalesce(attempt, 0) AS attempt, min(step) AS lo, max(step) AS hi,
                   max(rank) AS ranks
            FROM steps WHERE job_id = ? AND rank IS NOT NULL AND coalesce(attempt, 0) IN ({marks})
            GROUP BY 1 ORDER BY 1""",
        [job_id, *attempts],
    ).to_pylist()
    known = _attempt_ranks(store, job_id, attempts)
    widest = max((r["hi"] - r["lo"] + 1 for r in span), default=1)
    top_rank = max([r["ranks"] for r in span] + [max(v) for v in known.values() if v] + [0])
    step_bucket = max(1, -(-widest // MAX_STEP_COLUMNS))
    rank_bucket = max(1, -(-(top_rank + 1) // MAX_RANK_ROWS))
    mapping, unknown = _own_work_map(store, job_id)
    ctes, params = _grid_sql(mapping)
    params[0:2] = [job_id, job_id]
    cells = []
    if span:
        cells = store.query(
            f"""{ctes},
            joined AS (
                SELECT r.attempt, r.step, r.rank, r.duration_s, c.own_s, c.excess_s, sm.step_med_s
                FROM rows r LEFT JOIN cell_own c USING (attempt, step, rank, phase)
                JOIN step_med sm USING (attempt, step, phase))
            SELECT attempt, (step // {step_bucket}) * {step_bucket} AS step,
                   (rank // {rank_bucket}) * {rank_bucket} AS rank, avg(duration_s) AS seconds,
                   avg(own_s) AS own_s, max(excess_s) AS excess_s,
                   avg(step_med_s) AS step_median_s,
                   arg_max(rank, coalesce(excess_s, duration_s - step_med_s)) AS worst_rank
            FROM joined WHERE attempt IN ({marks}) GROUP BY ALL ORDER BY 1, 2, 3""",
            [*params, *attempts],
        ).to_pylist()
    sections = _section_table(store, ctes, params, attempts, culprits) if mapping else {}
    reached, exits = _reached_and_exits(store, job_id, attempts)
    ranks = {
        a: sorted(
            {(r // rank_bucket) * rank_bucket for r in known.get(a, set())}
            | {c["rank"] for c in cells if c["attempt"] == a}
        )
        for a in attempts
    }
    return {
        "step_bucket": step_bucket,
        "rank_bucket": rank_bucket,
        "cells": cells,
        "basis": "own" if any(c["excess_s"] is not None for c in cells) else "step",
        "sections": sections,
        "ranks": ranks,
        "reached": reached,
        "exits": exits,
        "unknown_sections": unknown,
    }


def _attempt_ranks(store: Store, job_id: str, attempts: list[int]) -> dict[int, set[int]]:
    """Every rank each attempt knew of: its step rows, its heartbeats and its placement rows (a rank
    with no step row at all still gets its row in the report)."""
    marks = ", ".join("?" for _ in attempts)
    rows = store.query(
        f"""WITH t AS (SELECT attempt, rank FROM steps WHERE job_id = ?
                      UNION ALL SELECT attempt, rank FROM heartbeats WHERE job_id = ?
                      UNION ALL SELECT attempt, rank FROM ranks WHERE job_id = ?)
            SELECT DISTINCT coalesce(attempt, 0) AS attempt, rank FROM t
            WHERE rank IS NOT NULL AND coalesce(attempt, 0) IN ({marks})""",
        [job_id, job_id, job_id, *attempts],
    ).to_pylist()
    found: dict[int, set[int]] = {}
    for row in rows:
        found.setdefault(row["attempt"], set()).add(int(row["rank"]))
    return found


def _section_table(
    store: Store, ctes: str, params: list[Any], attempts: list[int], culprits: dict[int, set[int]]
) -> dict[int, dict[str, Any]]:
    """Per attempt: the median own seconds per section of its median rank and of the ranks with the
    most excess over their peers (SECTION_TABLE_RANKS of them, the incidents' culprits always)."""
    marks = ", ".join("?" for _ in attempts)
    rows = store.query(
        f"""{ctes},
        per AS (
            SELECT o.attempt, o.rank, o.name, median(o.own_s) AS own_s, median(d.med_s) AS peer_s
            FROM own o JOIN med d USING (attempt, step, phase, pp, name)
            WHERE o.attempt IN ({marks}) GROUP BY ALL),
        tot AS (
            SELECT attempt, rank, sum(greatest(own_s - peer_s, 0)) AS ex FROM per GROUP BY ALL),
        ranked AS (
            SELECT attempt, rank, ex,
                   row_number() OVER (PARTITION BY attempt ORDER BY ex DESC, rank) AS n
            FROM tot)
        SELECT per.attempt, per.rank, per.name, per.own_s, per.peer_s, ranked.ex, ranked.n
        FROM per JOIN ranked USING (attempt, rank)
        ORDER BY per.attempt, ranked.n, per.name""",
        [*params, *attempts],
    ).to_pylist()
    table: dict[int, dict[str, Any]] = {}
    for row in rows:
        attempt = row["attempt"]
        entry = table.setdefault(attempt, {"names": [], "median": {}, "ranks": {}})
        if row["name"] not in entry["names"]:
            entry["names"].append(row["name"])
        if row["n"] == 1 or row["name"] not in entry["median"]:
            entry["median"][row["name"]] = row["peer_s"]
        if row["n"] <= SECTION_TABLE_RANKS or row["rank"] in culprits.get(attempt, set()):
            rank = entry["ranks"].setdefault(row["rank"], {"excess_s": row["ex"], "seconds": {}})
            rank["seconds"][row["name"]] = row["own_s"]
    for entry in table.values():
        entry["ranks"] = [{"rank": r, **v} for r, v in entry["ranks"].items()]
    return table


def _reached_and_exits(
    store: Store, job_id: str, attempts: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    marks = ", ".join("?" for _ in attempts)
    reached = store.query(
        f"""WITH rows AS (
                SELECT coalesce(attempt, 0) AS attempt, rank, max(step) AS row_step
                FROM steps WHERE job_id = ? AND rank IS NOT NULL GROUP BY ALL),
            beats AS (
                SELECT coalesce(attempt, 0) AS attempt, rank, max(step) AS beat_step,
                       arg_max(current_step, ts) AS current_step
                FROM heartbeats WHERE job_id = ? AND rank IS NOT NULL GROUP BY ALL)
            SELECT b.attempt, b.rank, r.row_step, b.beat_step, b.current_step
            FROM beats b LEFT JOIN rows r USING (attempt, rank)
            WHERE b.attempt IN ({marks})
              AND b.beat_step IS NOT NULL AND (r.row_step IS NULL OR b.beat_step > r.row_step)
            ORDER BY 1, 2""",
        [job_id, job_id, *attempts],
    ).to_pylist()
    exits = store.query(
        f"""SELECT coalesce(attempt, 0) AS attempt, rank, min(ts) AS ts,
                   arg_min(signal, ts) AS signal, arg_min(exit_code, ts) AS exit_code,
                   arg_min(node, ts) AS node
            FROM process_events
            WHERE job_id = ? AND rank IS NOT NULL AND kind = 'exit'
              AND (signal IS NOT NULL OR coalesce(exit_code, 0) <> 0)
              AND coalesce(attempt, 0) IN ({marks})
            GROUP BY ALL ORDER BY 1, 3, 2""",
        [job_id, *attempts],
    ).to_pylist()
    return reached, exits


def gpu_around(
    store: Store, incident: dict[str, Any], attempt: dict[str, Any] | None = None
) -> dict[str, Any]:
    """GPU samples and events of the incident's culprit nodes (else the nodes of ITS attempt) from
    GPU_BEFORE_S before its first signal to GPU_AFTER_S after its detection, within its attempt
    (from its start to GPU_TAIL_S after its last telemetry: the nodes are not sampled for the job
    outside it, and a chart running on past it stops part way across). The samples
    come in GPU_POINTS time buckets per GPU."""
    attempt = attempt or {}
    nodes = list(incident.get("culprit_nodes") or []) or list(attempt.get("nodes") or [])
    nodes = nodes[:GPU_NODES]
    first = incident.get("first_signal_ts") or incident.get("detected_ts")
    last = incident.get("detected_ts") or first
    if not nodes or first is None:
        return {"incident_id": incident["incident_id"], "nodes": nodes, "samples": [], "events": []}
    lo, hi = first - dt.timedelta(seconds=GPU_BEFORE_S), last + dt.timedelta(seconds=GPU_AFTER_S)
    start, end = attempt.get("start"), attempt.get("end")
    if start is not None and start < first:
        lo = max(lo, start)
    if end is not None:
        hi = max(min(hi, end + dt.timedelta(seconds=GPU_TAIL_S)), first + dt.timedelta(seconds=1))
    width = max((hi - lo).total_seconds() / GPU_POINTS, 1e-3)
    marks = ", ".join("?" for _ in nodes)
    samples = store.query(
        f"""SELECT min(ts) AS ts, node, gpu_index, gpu_uuid, any_value(source) AS source,
                   avg(temp_c) AS temp_c, avg(power_w) AS power_w,
                   avg(sm_clock_mhz) AS sm_clock_mhz, avg(gpu_util_pct) AS gpu_util_pct
            FROM gpu_samples
            WHERE node IN ({marks}) AND ts BETWEEN ? AND ?
            GROUP BY node, gpu_index, gpu_uuid, floor((epoch(ts) - ?) / ?)
            ORDER BY ts""",
        [*nodes, lo, hi, lo.timestamp(), width],
    ).to_pylist()
    events = store.query(
        f"""SELECT ts, node, gpu_index, kind, code, message FROM gpu_events
            WHERE node IN ({marks}) AND ts BETWEEN ? AND ? ORDER BY ts LIMIT 200""",
        [*nodes, lo, hi],
    ).to_pylist()
    return {
        "incident_id": incident["incident_id"],
        "nodes": nodes,
        "from": lo,
        "to": hi,
        "samples": samples,
        "events": events,
    }
