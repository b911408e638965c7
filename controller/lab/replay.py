"""Live replay: measure detection latency in simulated time by feeding a store's telemetry, in time
order, to the engine's live Follower whose clocks are the simulated clock.

A batch pass over a finished store sees every row at once and stamps detections with the wall clock,
so it cannot say how soon a fault would have been caught. For each labelled fault this module copies
the telemetry before the fault (the history the detectors need: recent step times, the rank's own
baseline) into a scratch store, then advances simulated time in small increments, landing the rows
of each increment as one segment per table (as node agents flushing every `increment` seconds
would), and polls the Follower after each. The detection time of a fault is the simulated time of
the first poll that wrote an incident standing for it.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from faultlens.attribution.incident import Incident
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import partition_dir, resolve_store, write_segment
from faultlens.collectors.store.schema import Role, tables_with
from faultlens.controller.lab.fault_labels import FaultLabel

REPLAY_TABLES = tables_with(Role.REPLAYED)  # the telemetry a replay copies
# (seconds after the fault's onset, poll increment): fine-grained first, coarser while waiting for
# stragglers
DEFAULT_SCHEDULE: tuple[tuple[float, float], ...] = (
    (20.0, 1.0),
    (60.0, 2.0),
    (600.0, 10.0),
    (float("inf"), 30.0),
)
HISTORY_GUARD = dt.timedelta(seconds=2)


@dataclass(frozen=True)
class ReplayDetection:
    fault_id: str
    # simulated time of the first poll whose incidents stand for the fault
    detected_at: dt.datetime | None
    incident: Incident | None
    polls: int


def _ns(moment: dt.datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _load(store: Store, table: str, low: dt.datetime, high: dt.datetime, job: str | None,
          attempt_floor: int | None) -> pa.Table:
    params: list[object] = [low, high]
    where = "ts >= ? AND ts <= ?"
    if table == "ranks":  # placement rows are written once per attempt, long before the fault
        where = "ts <= ?" + (" AND attempt >= ?" if attempt_floor is not None else "")
        params = [high] + ([attempt_floor] if attempt_floor is not None else [])
    if job is not None:
        where += " AND job_id = ?"
        params.append(job)
    return store.query(f'SELECT * FROM "{table}" WHERE {where} ORDER BY ts', params)


def _land(location, table: str, rows: pa.Table, job: str | None, day: str) -> None:
    if rows.num_rows:
        write_segment(location, partition_dir(location, table, job or "_node", day, "replay"), rows)


def _time_slice(rows: pa.Table, low_ns: int | None, high_ns: int) -> pa.Table:
    ts = pc.cast(pc.cast(rows.column("ts"), pa.timestamp("ns", tz="UTC")), pa.int64())
    mask = pc.less_equal(ts, high_ns)
    if low_ns is not None:
        mask = pc.and_(mask, pc.greater(ts, low_ns))
    return rows.filter(mask)


def replay_fault(
    source: Store,
    label: FaultLabel,
    stands_for: Callable[[Incident, FaultLabel], bool],
    *,
    workdir: str | Path,
    history_s: float = 1800.0,
    after_s: float = 120.0,
    max_wait_s: float = 1800.0,
    schedule: Sequence[tuple[float, float]] = DEFAULT_SCHEDULE,
) -> ReplayDetection:
    """Replay the telemetry around one fault through a fresh Follower; see the module docstring."""
    # the engine is optional for the rest of the evaluator
    from faultlens.attribution.follow import Follower

    onset = label.window_start
    low = onset - dt.timedelta(seconds=history_s)
    high = min(
        label.effect_end_ts + dt.timedelta(seconds=after_s),
        onset + dt.timedelta(seconds=max_wait_s),
    )
    job = label.job_id
    floor = label.attempt - 1 if label.attempt is not None else None
    tables = {name: _load(source, name, low, high, job, floor) for name in REPLAY_TABLES}
    scratch = Path(tempfile.mkdtemp(prefix=f"replay-{label.fault_id}-", dir=workdir))
    try:
        location = resolve_store(str(scratch), create=True)
        # the history ends a little before the onset: torchrun reports and error.json files stamp
        # whole seconds, so a fault's first rows can carry a time up to a second before it happened
        history_end = onset - HISTORY_GUARD
        history_ns = _ns(history_end)
        day = onset.strftime("%Y-%m-%d")
        for name, rows in tables.items():
            _land(location, name, _time_slice(rows, None, history_ns), job, day)
        now = {"t": history_end}
        follower = Follower(
            str(scratch),
            job=job,
            clock=lambda: now["t"],
            monotonic=lambda: now["t"].timestamp(),
            wall=lambda: now["t"].timestamp(),
        )
        polls = 0
        try:
            # what the history alone says (an earlier fault, reported once its cascade settled) is
            # not this fault
            follower.poll_once()
            now["t"] = history_end + dt.timedelta(seconds=0.5)
            follower.poll_once()
            polls += 2
            previous = history_ns
            elapsed = 0.0
            while True:
                step = next(inc for until, inc in schedule if elapsed < until)
                elapsed += step
                moment = onset + dt.timedelta(seconds=elapsed)
                if moment > high:
                    break
                moment_ns = _ns(moment)
                for name, rows in tables.items():
                    _land(location, name, _time_slice(rows, previous, moment_ns), job, day)
                previous = moment_ns
                now["t"] = moment
                found = follower.poll_once()
                polls += 1
                for incident in found:
                    if stands_for(incident, label):
                        return ReplayDetection(label.fault_id, moment, incident, polls)
        finally:
            follower.close()
        return ReplayDetection(label.fault_id, None, None, polls)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def replay_faults(
    store: Store,
    labels: Sequence[FaultLabel],
    stands_for: Callable[[Incident, FaultLabel], bool],
    *,
    workdir: str | Path | None = None,
    progress: Callable[[ReplayDetection], None] | None = None,
    **options: float,
) -> dict[str, ReplayDetection]:
    """Replay every fault label (benign noise is skipped); returns detections by fault id."""
    results: dict[str, ReplayDetection] = {}
    for label in labels:
        if not label.is_fault:
            continue
        detection = replay_fault(
            store, label, stands_for, workdir=workdir or tempfile.gettempdir(), **options
        )
        results[label.fault_id] = detection
        if progress is not None:
            progress(detection)
    return results
