"""A job's facts from the store: steps, attempts, incidents, decisions (one read per table)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.attribution.goodput.buckets import _CHECKPOINT_PHASE, _EPOCH, _NS, GoodputError
from faultlens.attribution.reading.store import Store

# ---------------------------------------------------------------------------------------------- facts


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


def _ns(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise GoodputError(f"naive datetime {value.isoformat()}: give a timezone (UTC)")
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * _NS + delta.microseconds * 1000
    return int(value)


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
    """Read the facts of `job_id` from an open Store. Raises GoodputError when the store has no steps, ranks or
    process events for the job."""
    steps = store.query(
        "SELECT coalesce(attempt, 0)::BIGINT AS attempt, step, coalesce(phase, 'train') = ? AS is_checkpoint, "
        "min(start_ts) AS start_ts, max(end_ts) AS end_ts FROM steps WHERE job_id = ? AND start_ts IS NOT NULL "
        "AND end_ts IS NOT NULL AND step IS NOT NULL GROUP BY ALL ORDER BY start_ts", [_CHECKPOINT_PHASE, job_id])
    starts = store.query(
        "SELECT attempt, min(ts) AS ts FROM (SELECT coalesce(attempt, 0)::BIGINT AS attempt, ts FROM process_events "
        "WHERE job_id = ? AND kind = 'start' UNION ALL SELECT coalesce(attempt, 0)::BIGINT, ts FROM ranks "
        "WHERE job_id = ?) GROUP BY attempt", [job_id, job_id])
    # a 'start' row beats the ranks row of the same attempt (it is the earlier, truer start): take the min
    incidents = store.query(
        'SELECT incident_id, min(attempt)::BIGINT AS attempt, any_value("class") AS cls, any_value(cause) AS cause, '
        "min(first_signal_ts) AS first_signal, min(detected_ts) AS detected FROM incidents WHERE job_id = ? "
        "AND incident_id IS NOT NULL GROUP BY incident_id ORDER BY detected", [job_id])
    decisions = store.query(
        "SELECT decision_id, any_value(incident_id) AS incident_id, min(attempt)::BIGINT AS attempt, "
        "arg_min(action, ts) AS action, min(issued_ts) AS issued FROM decisions WHERE job_id = ? "
        "AND decision_id IS NOT NULL AND issued_ts IS NOT NULL GROUP BY decision_id ORDER BY issued", [job_id])
    last = store.query(
        "SELECT max(t) AS t FROM (SELECT max(end_ts) AS t FROM steps WHERE job_id = $1 "
        "UNION ALL SELECT max(ts) FROM process_events WHERE job_id = $1 UNION ALL SELECT max(ts) FROM ranks "
        "WHERE job_id = $1)", [job_id])
    if not steps.num_rows and not starts.num_rows and not last.column(0)[0].is_valid:
        raise GoodputError(f"job {job_id!r}: no steps, ranks or process events in store {store.location.url!r}")
    observed = dict(zip(starts.column("attempt").to_pylist(), _scalar_ns(starts, "ts"), strict=True))
    incident_facts = tuple(
        IncidentFact(incident_id=i, attempt=a, incident_class=c, cause=cause, first_signal_ns=f, detected_ns=d)
        for i, a, c, cause, f, d in zip(incidents.column("incident_id").to_pylist(),
                                        incidents.column("attempt").to_pylist(), incidents.column("cls").to_pylist(),
                                        incidents.column("cause").to_pylist(), _scalar_ns(incidents, "first_signal"),
                                        _scalar_ns(incidents, "detected"), strict=True))
    decision_facts = tuple(
        DecisionFact(decision_id=d, incident_id=i, attempt=a, action=act, issued_ns=t)
        for d, i, a, act, t in zip(decisions.column("decision_id").to_pylist(),
                                   decisions.column("incident_id").to_pylist(), decisions.column("attempt").to_pylist(),
                                   decisions.column("action").to_pylist(), _scalar_ns(decisions, "issued"),
                                   strict=True))
    return JobFacts(
        job_id=job_id, step_attempt=_column_ns(steps, "attempt"), step_number=_column_ns(steps, "step"),
        step_is_checkpoint=steps.column("is_checkpoint").to_numpy(zero_copy_only=False).astype(bool),
        step_start_ns=_column_ns(steps, "start_ts"), step_end_ns=_column_ns(steps, "end_ts"),
        observed_starts=observed, incidents=incident_facts, decisions=decision_facts,
        last_telemetry_ns=_scalar_ns(last, "t")[0])


