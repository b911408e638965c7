"""A job's facts from the store: steps, attempts, incidents, decisions (one read per table)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from faultlens.attribution.goodput.buckets import GoodputError
from faultlens.attribution.reading.queries import decision_table, incident_table
from faultlens.attribution.reading.store import Store

_CHECKPOINT_PHASE = "checkpoint"  # the step timer's phase of a blocking checkpoint save

# ----------------------------------------------------------------------------------------------
# facts


@dataclass(frozen=True)
class IncidentFact:
    incident_id: str
    attempt: int | None
    incident_class: str | None
    cause: str | None
    first_signal_ns: int | None
    detected_ns: int | None


@dataclass(frozen=True)
class DecisionFact:
    decision_id: str
    incident_id: str | None
    attempt: int | None
    action: str | None
    issued_ns: int


@dataclass(frozen=True, eq=False)
class JobFacts:
    """What goodput needs from the store for one job, times in ns since the epoch (UTC)."""

    job_id: str
    step_attempt: np.ndarray  # int64, one entry per (attempt, step, phase)
    step_number: np.ndarray  # int64
    step_is_checkpoint: np.ndarray  # bool
    step_start_ns: np.ndarray  # int64
    step_end_ns: np.ndarray  # int64
    observed_starts: Mapping[int, int]  # attempt -> start (ns) as the store shows it
    incidents: tuple[IncidentFact, ...]
    decisions: tuple[DecisionFact, ...]
    last_telemetry_ns: int | None  # the job's latest step end, process event or ranks row


def _column_ns(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64())
    return column.to_numpy(zero_copy_only=False).astype(np.int64)


def _scalar_ns(table: pa.Table, name: str) -> list[int | None]:
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64())
    return column.to_pylist()


def load_job_facts(store: Store, job_id: str) -> JobFacts:
    """Read the facts of `job_id` from an open Store. Raises GoodputError when the store has no
    steps, ranks or process events for the job."""
    steps = store.query(
        "SELECT coalesce(attempt, 0)::BIGINT AS attempt, step, coalesce(phase, 'train') = ? AS "
        "is_checkpoint, "
        "min(start_ts) AS start_ts, max(end_ts) AS end_ts FROM steps WHERE job_id = ? AND start_ts "
        "IS NOT NULL "
        "AND end_ts IS NOT NULL AND step IS NOT NULL GROUP BY ALL ORDER BY start_ts",
        [_CHECKPOINT_PHASE, job_id],
    )
    starts = store.query(
        "SELECT attempt, min(ts) AS ts FROM (SELECT coalesce(attempt, 0)::BIGINT AS attempt, ts "
        "FROM process_events "
        "WHERE job_id = ? AND kind = 'start' UNION ALL SELECT coalesce(attempt, 0)::BIGINT, ts "
        "FROM ranks "
        "WHERE job_id = ?) GROUP BY attempt", [job_id, job_id])
    # a 'start' row beats the ranks row of the same attempt (it is the earlier, truer start): take
    # the min each incident as its first report, each decision as issued
    # (attribution/reading/queries.py)
    incidents = incident_table(store, job=job_id)
    decisions = decision_table(store, job=job_id)
    decisions = decisions.filter(decisions.column("issued_ts").is_valid())
    last = store.query(
        "SELECT max(t) AS t FROM (SELECT max(end_ts) AS t FROM steps WHERE job_id = $1 "
        "UNION ALL SELECT max(ts) FROM process_events WHERE job_id = $1 UNION ALL SELECT max(ts) "
        "FROM ranks "
        "WHERE job_id = $1)", [job_id])
    if not steps.num_rows and not starts.num_rows and not last.column(0)[0].is_valid:
        raise GoodputError(f"job {job_id!r}: no steps, ranks or process events in store "
                           f"{store.location.url!r}")
    observed = dict(
        zip(starts.column("attempt").to_pylist(), _scalar_ns(starts, "ts"), strict=True)
    )
    names = ("incident_id", "attempt", "class", "cause")
    incident_facts = tuple(
        IncidentFact(
            incident_id=i,
            attempt=a,
            incident_class=c,
            cause=cause,
            first_signal_ns=f,
            detected_ns=d,
        )
        for i, a, c, cause, f, d in zip(
            *(incidents.column(n).to_pylist() for n in names),
            _scalar_ns(incidents, "first_signal_ts"),
            _scalar_ns(incidents, "detected_ts"),
            strict=True,
        )
    )
    names = ("decision_id", "incident_id", "attempt", "action")
    decision_facts = tuple(
        DecisionFact(decision_id=d, incident_id=i, attempt=a, action=act, issued_ns=t)
        for d, i, a, act, t in zip(*(decisions.column(n).to_pylist() for n in names),
                                   _scalar_ns(decisions, "issued_ts"), strict=True))
    return JobFacts(
        job_id=job_id,
        step_attempt=_column_ns(steps, "attempt"),
        step_number=_column_ns(steps, "step"),
        step_is_checkpoint=steps.column("is_checkpoint")
        .to_numpy(zero_copy_only=False)
        .astype(bool),
        step_start_ns=_column_ns(steps, "start_ts"),
        step_end_ns=_column_ns(steps, "end_ts"),
        observed_starts=observed,
        incidents=incident_facts,
        decisions=decision_facts,
        last_telemetry_ns=_scalar_ns(last, "t")[0],
    )


