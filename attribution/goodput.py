"""Goodput accounting: ETTR (effective training time ratio) and badput by cause for one job, from the store.

ETTR (Meta's definition, reference/failures.md 2(b)) is productive training time divided by the wall-clock time
of the window. Badput is the rest, broken down by cause. Every instant of the window [start, end] gets exactly one
bucket, so the buckets add up to the wall clock. Where the definitions below overlap, the bucket that comes first
in PRIORITY wins (e.g. a straggler's detection runs while steps still complete: those seconds are productive).

Facts read from the store (one job; rows with a null attempt count as attempt 0):

- A *step* is one (attempt, step number, phase) of the `steps` table, spanning from the earliest `start_ts` to the
  latest `end_ts` over the ranks (synchronous training: every rank spends the step together).
- An attempt's *start* is its earliest `process_events` row of kind 'start' (the supervisor's launch), else its
  earliest `ranks` row (the step timer's start, after init_process_group), else its first step's start; a caller
  that knows better (the supervisor launched the attempt earlier) passes `attempt_starts`, and the earlier time
  is used.
- An attempt's *resume point* is the smallest first step number (non-checkpoint phases) of any later attempt: the
  step the job went back to. The last attempt has none.
- An incident is one `incident_id` of the `incidents` table (first_signal_ts, detected_ts: earliest over its rows);
  a decision is one `decision_id` of the `decisions` table (issued_ts: its earliest row). A decision belongs to
  the attempt on its row, else its incident's.
- Only *live* incidents and decisions shape the timeline: detected (issued) no later than the start of the next
  attempt after theirs, or, for the last attempt, within `live_grace_s` (default 600 s) of the job's last
  telemetry. The others come from a batch pass over old telemetry (`faultlens attribute` after the fact, a
  simulated store): their detection and decision times say when the pass ran, not what the job waited for. They
  are listed in `offline`, still charged in the per-incident costs, and the time they would have covered is
  whatever else covers it (often `unknown`).

Buckets (seconds), in priority order:

- checkpoint: inside a step row of phase 'checkpoint' (blocking checkpoint save), whether or not that checkpoint
  was later restored.
- lost_work: inside a non-checkpoint step of attempt k whose step number is >= attempt k's resume point: computed,
  then thrown away because a later attempt recomputed it. The partial step in progress when a failure hit has no
  step row; it falls in `unknown`.
- productive: inside any other non-checkpoint step (train, eval, warmup, user phases): work that was kept. The
  last attempt's steps are kept (nothing has thrown them away yet, even when the job was escalated).
- startup: from an attempt's start to its first step's start (process start-up, rendezvous, model build,
  checkpoint load). An attempt that never reached a step: to the first signal of its first incident, else to the
  next attempt's start (or the window's end).
- restart (shutdown and restart): from a decision's issued_ts to the start of the next attempt (the smallest
  attempt number above the decision's with a start at or after issued_ts); with no next attempt, to the window's
  end (the job waits for a human).
- decision: from an incident's detected_ts to the issued_ts of its first decision (policy, restore choice; a
  controller that stops the job before it asks for a decision, as the reference supervisor does, spends its
  shutdown here).
- detection: from an incident's first_signal_ts to its detected_ts.
- unknown: the unproductive remainder: gaps between step rows, the unfinished step when a failure hit, time
  before the first attempt's start when the window starts earlier, anything no rule above covers.

The window is [since, until] when given, else [earliest attempt start, latest activity], where the latest
activity is the latest of: a step's end, a process event, a ranks row, a live incident's detection, a live
decision.

Over the bucket timeline: ETTR = productive / wall; sliding-window ETTR = productive seconds in (t - W, t] / W for
sample times t from start + W to end (W defaults to a tenth of the wall clock); the longest unproductive stretch is
the longest run of time containing no productive second. An incident that stopped an attempt (the one of that
attempt's first decision) is charged with the attempt's lost work plus every unproductive second from the
attempt's last step end to the next attempt's first step (or the window's end).

A straggler's slowdown is not badput here: its slow steps are productive (or lost work when thrown away).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.attribution.store import Store


class GoodputError(ValueError):
    """The job cannot be accounted (no telemetry for it, or an empty window): the message says which."""


class Bucket(StrEnum):
    PRODUCTIVE = "productive"
    CHECKPOINT = "checkpoint"
    LOST_WORK = "lost_work"
    STARTUP = "startup"
    RESTART = "restart"
    DECISION = "decision"
    DETECTION = "detection"
    UNKNOWN = "unknown"  # the unproductive remainder: covered by no other bucket


# the bucket that wins where several definitions cover the same instant; UNKNOWN is what is left
PRIORITY: tuple[Bucket, ...] = (Bucket.CHECKPOINT, Bucket.LOST_WORK, Bucket.PRODUCTIVE, Bucket.STARTUP,
                                Bucket.RESTART, Bucket.DECISION, Bucket.DETECTION)
BUCKETS: tuple[Bucket, ...] = (*PRIORITY, Bucket.UNKNOWN)
BADPUT: tuple[Bucket, ...] = tuple(b for b in BUCKETS if b is not Bucket.PRODUCTIVE)
_INDEX = {bucket: i for i, bucket in enumerate(BUCKETS)}
_CHECKPOINT_PHASE = "checkpoint"
_NS = 1_000_000_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


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


# ---------------------------------------------------------------------------------------------- the timeline


@dataclass(frozen=True, eq=False)
class Timeline:
    """The window cut into elementary segments [bounds[i], bounds[i+1]) with one bucket each."""

    bounds: np.ndarray  # int64 ns, strictly increasing, bounds[0] = window start, bounds[-1] = window end
    labels: np.ndarray  # int8 index into BUCKETS, len(bounds) - 1
    _cumulative: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def start_ns(self) -> int:
        return int(self.bounds[0])

    @property
    def end_ns(self) -> int:
        return int(self.bounds[-1])

    def seconds(self) -> dict[Bucket, float]:
        widths = np.diff(self.bounds).astype(np.float64) / _NS
        totals = np.bincount(self.labels, weights=widths, minlength=len(BUCKETS))
        return {bucket: float(totals[i]) for i, bucket in enumerate(BUCKETS)}

    def _cum(self, bucket: Bucket) -> np.ndarray:
        index = _INDEX[bucket]
        if index not in self._cumulative:
            widths = np.where(self.labels == index, np.diff(self.bounds), 0).astype(np.float64) / _NS
            self._cumulative[index] = np.concatenate([[0.0], np.cumsum(widths)])
        return self._cumulative[index]

    def cumulative(self, bucket: Bucket, at_ns: np.ndarray | int) -> np.ndarray:
        """Seconds of `bucket` from the window's start up to each time in `at_ns` (clipped to the window)."""
        t = np.clip(np.asarray(at_ns, dtype=np.int64), self.bounds[0], self.bounds[-1])
        cum = self._cum(bucket)
        i = np.clip(np.searchsorted(self.bounds, t, side="right") - 1, 0, len(self.labels) - 1)
        inside = (self.labels[i] == _INDEX[bucket]).astype(np.float64)
        return cum[i] + (t - self.bounds[i]).astype(np.float64) / _NS * inside

    def between(self, start_ns: int, end_ns: int) -> dict[Bucket, float]:
        """Seconds of every bucket inside [start_ns, end_ns] (clipped to the window)."""
        if end_ns <= start_ns:
            return {bucket: 0.0 for bucket in BUCKETS}
        ends = np.array([start_ns, end_ns], dtype=np.int64)
        return {bucket: float(np.diff(self.cumulative(bucket, ends))[0]) for bucket in BUCKETS}

    def runs(self) -> list[tuple[int, int, Bucket]]:
        """Maximal runs of one bucket: (start ns, end ns, bucket)."""
        if not len(self.labels):
            return []
        change = np.flatnonzero(np.diff(self.labels)) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change, [len(self.labels)]])
        return [(int(self.bounds[s]), int(self.bounds[e]), BUCKETS[int(self.labels[s])])
                for s, e in zip(starts, ends, strict=True)]


def _coverage(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which elementary segments of `bounds` lie inside at least one [start, end) interval."""
    n = len(bounds)
    if not len(starts):
        return np.zeros(n - 1, dtype=bool)
    opened = np.bincount(np.searchsorted(bounds, starts), minlength=n + 1)
    closed = np.bincount(np.searchsorted(bounds, ends), minlength=n + 1)
    return np.cumsum(opened - closed)[: n - 1] > 0


def build_timeline(intervals: Mapping[Bucket, tuple[np.ndarray, np.ndarray]], start_ns: int,
                   end_ns: int) -> Timeline:
    """Cut [start_ns, end_ns] by the intervals of every bucket; each segment takes the first bucket of PRIORITY
    that covers it, else UNKNOWN."""
    if end_ns <= start_ns:
        raise GoodputError("the window is empty (its end is not after its start)")
    clipped: dict[Bucket, tuple[np.ndarray, np.ndarray]] = {}
    points = [np.array([start_ns, end_ns], dtype=np.int64)]
    for bucket, (starts, ends) in intervals.items():
        s = np.clip(np.asarray(starts, dtype=np.int64), start_ns, end_ns)
        e = np.clip(np.asarray(ends, dtype=np.int64), start_ns, end_ns)
        keep = e > s
        clipped[bucket] = (s[keep], e[keep])
        points.extend((s[keep], e[keep]))
    bounds = np.unique(np.concatenate(points))
    labels = np.full(len(bounds) - 1, _INDEX[Bucket.UNKNOWN], dtype=np.int8)
    taken = np.zeros(len(bounds) - 1, dtype=bool)
    for bucket in PRIORITY:
        if bucket not in clipped:
            continue
        covered = _coverage(bounds, *clipped[bucket])
        fresh = covered & ~taken
        labels[fresh] = _INDEX[bucket]
        taken |= covered
    return Timeline(bounds=bounds, labels=labels)


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class WindowPoint:
    end: dt.datetime
    ettr: float  # productive seconds in (end - window, end] / window


@dataclass(frozen=True)
class Stretch:
    start: dt.datetime
    end: dt.datetime
    seconds: float
    buckets: Mapping[Bucket, float]  # what the stretch was spent on (non-zero buckets only)


@dataclass(frozen=True)
class AttemptAccount:
    attempt: int
    start: dt.datetime | None
    first_step_start: dt.datetime | None
    last_step_end: dt.datetime | None
    first_step: int | None
    last_step: int | None
    resume_point: int | None  # the step a later attempt went back to (None: the last attempt)
    steps_kept: int
    steps_lost: int
    incident_id: str | None  # the incident that stopped this attempt (its first decision's)
    incident_class: str | None
    cause: str | None
    action: str | None
    seconds: Mapping[Bucket, float]  # buckets inside [this attempt's start, the next attempt's start)


@dataclass(frozen=True)
class IncidentCost:
    incident_id: str
    attempt: int | None
    live: bool  # its decision was issued while the job ran (else: a batch pass afterwards)
    incident_class: str | None
    cause: str | None
    action: str | None
    lost_work_s: float
    downtime_s: float  # unproductive seconds from the attempt's last step end to the next attempt's first step

    @property
    def total_s(self) -> float:
        return self.lost_work_s + self.downtime_s


@dataclass(frozen=True, eq=False)
class GoodputReport:
    job_id: str
    start: dt.datetime
    end: dt.datetime
    wall_s: float
    productive_s: float
    ettr: float
    badput: Mapping[Bucket, float]  # seconds per unproductive bucket; sums with productive_s to wall_s
    steps_kept: int
    steps_lost: int
    window_s: float
    sliding: tuple[WindowPoint, ...]
    min_sliding_ettr: float | None
    longest_unproductive: Stretch | None
    attempts: tuple[AttemptAccount, ...]
    incidents: tuple[IncidentCost, ...]
    offline: tuple[str, ...]  # incident and decision ids from a batch pass after the fact: not on the timeline
    timeline: Timeline = field(repr=False)

    def cumulative_ettr(self, points: int = 200) -> list[tuple[dt.datetime, float]]:
        """ETTR from the window's start up to `points` evenly spaced times: (time, productive / elapsed)."""
        start, end = self.timeline.start_ns, self.timeline.end_ns
        times = np.linspace(start, end, max(points, 2)).astype(np.int64)[1:]
        productive = self.timeline.cumulative(Bucket.PRODUCTIVE, times)
        return [(_dt(int(t)), float(p) / ((int(t) - start) / _NS)) for t, p in zip(times, productive, strict=True)]

    def to_dict(self, *, include_timeline: bool = False) -> dict[str, Any]:
        def iso(value: dt.datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        def buckets(values: Mapping[Bucket, float]) -> dict[str, float]:
            return {str(k): round(v, 6) for k, v in values.items()}

        result: dict[str, Any] = {
            "job_id": self.job_id, "start": iso(self.start), "end": iso(self.end), "wall_s": round(self.wall_s, 6),
            "productive_s": round(self.productive_s, 6), "ettr": round(self.ettr, 6),
            "badput_s": buckets(self.badput), "steps_kept": self.steps_kept, "steps_lost": self.steps_lost,
            "window_s": round(self.window_s, 6),
            "min_sliding_ettr": None if self.min_sliding_ettr is None else round(self.min_sliding_ettr, 6),
            "sliding": [{"end": iso(p.end), "ettr": round(p.ettr, 6)} for p in self.sliding],
            "longest_unproductive": None if self.longest_unproductive is None else {
                "start": iso(self.longest_unproductive.start), "end": iso(self.longest_unproductive.end),
                "seconds": round(self.longest_unproductive.seconds, 6),
                "buckets": buckets(self.longest_unproductive.buckets)},
            "attempts": [{
                "attempt": a.attempt, "start": iso(a.start), "first_step_start": iso(a.first_step_start),
                "last_step_end": iso(a.last_step_end), "first_step": a.first_step, "last_step": a.last_step,
                "resume_point": a.resume_point, "steps_kept": a.steps_kept, "steps_lost": a.steps_lost,
                "incident_id": a.incident_id, "class": a.incident_class, "cause": a.cause, "action": a.action,
                "seconds": buckets(a.seconds)} for a in self.attempts],
            "incidents": [{
                "incident_id": c.incident_id, "attempt": c.attempt, "live": c.live, "class": c.incident_class,
                "cause": c.cause,
                "action": c.action, "lost_work_s": round(c.lost_work_s, 6), "downtime_s": round(c.downtime_s, 6),
                "total_s": round(c.total_s, 6)} for c in self.incidents],
            "offline": list(self.offline),
        }
        if include_timeline:
            result["timeline"] = [{"start": iso(_dt(s)), "end": iso(_dt(e)), "bucket": str(b)}
                                  for s, e, b in self.timeline.runs()]
        return result


def _dt(ns: int | None) -> dt.datetime | None:
    if ns is None:
        return None
    seconds, rest = divmod(int(ns), _NS)
    return dt.datetime.fromtimestamp(seconds, dt.UTC) + dt.timedelta(microseconds=rest // 1000)


# ---------------------------------------------------------------------------------------------- accounting


def _intervals(facts: JobFacts, starts: Mapping[int, int], end_ns: int
               ) -> tuple[dict[Bucket, tuple[np.ndarray, np.ndarray]], np.ndarray, dict[int, int | None]]:
    work = ~facts.step_is_checkpoint
    attempts = sorted(set(starts) | set(facts.step_attempt.tolist()))
    first_step = {a: (int(facts.step_number[work & (facts.step_attempt == a)].min())
                      if np.any(work & (facts.step_attempt == a)) else None) for a in attempts}
    resume: dict[int, int | None] = {}
    later: int | None = None
    for attempt in reversed(attempts):
        resume[attempt] = later
        if first_step[attempt] is not None:
            later = first_step[attempt] if later is None else min(later, first_step[attempt])
    resume_of_step = np.array([resume.get(int(a)) if resume.get(int(a)) is not None else np.iinfo(np.int64).max
                               for a in facts.step_attempt], dtype=np.int64)
    lost = work & (facts.step_number >= resume_of_step)
    kept = work & ~lost
    ckpt = facts.step_is_checkpoint
    s, e = facts.step_start_ns, facts.step_end_ns
    intervals: dict[Bucket, tuple[np.ndarray, np.ndarray]] = {
        Bucket.CHECKPOINT: (s[ckpt], e[ckpt]), Bucket.LOST_WORK: (s[lost], e[lost]),
        Bucket.PRODUCTIVE: (s[kept], e[kept])}

    incidents_by_attempt: dict[int | None, list[IncidentFact]] = {}
    for incident in facts.incidents:
        incidents_by_attempt.setdefault(incident.attempt, []).append(incident)
    startup_s, startup_e = [], []
    for i, attempt in enumerate(attempts):
        begin = starts.get(attempt)
        if begin is None:
            continue
        mine = facts.step_attempt == attempt
        if np.any(mine):
            finish = int(s[mine].min())
        else:
            signals = [x.first_signal_ns for x in incidents_by_attempt.get(attempt, []) if x.first_signal_ns]
            following = [starts[a] for a in attempts[i + 1:] if a in starts]
            finish = min(signals) if signals else (min(following) if following else end_ns)
        startup_s.append(begin)
        startup_e.append(finish)
    intervals[Bucket.STARTUP] = (np.array(startup_s, dtype=np.int64), np.array(startup_e, dtype=np.int64))

    by_incident = {x.incident_id: x for x in facts.incidents}
    restart_s, restart_e, decide_s, decide_e = [], [], [], []
    decided: set[str] = set()
    for decision in facts.decisions:
        attempt = decision.attempt
        incident = by_incident.get(decision.incident_id or "")
        if attempt is None and incident is not None:
            attempt = incident.attempt
        nxt = [starts[a] for a in attempts if (attempt is None or a > attempt) and starts.get(a) is not None
               and starts[a] >= decision.issued_ns]
        restart_s.append(decision.issued_ns)
        restart_e.append(min(nxt) if nxt else end_ns)
        if incident is not None and incident.detected_ns is not None and incident.incident_id not in decided:
            decided.add(incident.incident_id)
            decide_s.append(incident.detected_ns)
            decide_e.append(decision.issued_ns)
    intervals[Bucket.RESTART] = (np.array(restart_s, dtype=np.int64), np.array(restart_e, dtype=np.int64))
    intervals[Bucket.DECISION] = (np.array(decide_s, dtype=np.int64), np.array(decide_e, dtype=np.int64))
    detect = [(x.first_signal_ns, x.detected_ns) for x in facts.incidents
              if x.first_signal_ns is not None and x.detected_ns is not None]
    intervals[Bucket.DETECTION] = (np.array([d[0] for d in detect], dtype=np.int64),
                                   np.array([d[1] for d in detect], dtype=np.int64))
    return intervals, lost, resume


def _sliding(timeline: Timeline, window_ns: int, max_points: int) -> tuple[WindowPoint, ...]:
    start, end = timeline.start_ns, timeline.end_ns
    if end - start <= window_ns:
        ends = np.array([end], dtype=np.int64)
        width = end - start
    else:
        count = int(min(max_points, math.ceil((end - start - window_ns) / (window_ns / 10)) + 1))
        ends = np.linspace(start + window_ns, end, max(count, 2)).astype(np.int64)
        width = window_ns
    productive = timeline.cumulative(Bucket.PRODUCTIVE, ends) - timeline.cumulative(Bucket.PRODUCTIVE, ends - width)
    return tuple(WindowPoint(_dt(int(t)), float(p) / (width / _NS)) for t, p in zip(ends, productive, strict=True))


def _longest_unproductive(timeline: Timeline) -> Stretch | None:
    best: tuple[int, int] | None = None
    current: int | None = None
    for run_start, _run_end, bucket in [*timeline.runs(), (timeline.end_ns, timeline.end_ns, Bucket.PRODUCTIVE)]:
        if bucket is Bucket.PRODUCTIVE:
            if current is not None and (best is None or run_start - current > best[1] - best[0]):
                best = (current, run_start)
            current = None
        elif current is None:
            current = run_start
    if best is None:
        return None
    spent = {k: v for k, v in timeline.between(*best).items() if v > 0}
    return Stretch(_dt(best[0]), _dt(best[1]), (best[1] - best[0]) / _NS, spent)


def _live(facts: JobFacts, starts: Mapping[int, int], last_ns: int | None, grace_s: float) -> JobFacts:
    """The facts with only the incidents and decisions that happened while the job ran (see the module doc)."""
    attempts = sorted(starts)
    by_incident = {x.incident_id: x for x in facts.incidents}

    def bound(attempt: int | None, after_ns: int | None) -> int | None:
        if attempt is not None:
            later = [starts[a] for a in attempts if a > attempt]
        else:
            later = [t for t in starts.values() if after_ns is not None and t > after_ns]
        if later:
            return min(later)
        return None if last_ns is None else last_ns + round(grace_s * _NS)

    incidents = tuple(x for x in facts.incidents if x.detected_ns is not None
                      and (b := bound(x.attempt, x.first_signal_ns)) is not None and x.detected_ns <= b)
    decisions = []
    for decision in facts.decisions:
        incident = by_incident.get(decision.incident_id or "")
        attempt = decision.attempt if decision.attempt is not None else (incident.attempt if incident else None)
        limit = bound(attempt, decision.issued_ns if attempt is None else None)
        if limit is not None and decision.issued_ns <= limit:
            decisions.append(decision)
    return JobFacts(
        job_id=facts.job_id, step_attempt=facts.step_attempt, step_number=facts.step_number,
        step_is_checkpoint=facts.step_is_checkpoint, step_start_ns=facts.step_start_ns,
        step_end_ns=facts.step_end_ns, observed_starts=facts.observed_starts, incidents=incidents,
        decisions=tuple(decisions), last_telemetry_ns=facts.last_telemetry_ns)


def account(facts: JobFacts, *, since: dt.datetime | None = None, until: dt.datetime | None = None,
            window_s: float | None = None, attempt_starts: Mapping[int, dt.datetime] | None = None,
            live_grace_s: float = 600.0, max_points: int = 2000) -> GoodputReport:
    """The goodput report of one job's facts (see the module docstring for every definition)."""
    starts: dict[int, int] = {int(a): int(t) for a, t in facts.observed_starts.items() if t is not None}
    for attempt in np.unique(facts.step_attempt).tolist():
        first = int(facts.step_start_ns[facts.step_attempt == attempt].min())
        starts[attempt] = min(starts.get(attempt, first), first)
    for attempt, when in (attempt_starts or {}).items():
        ns = _ns(when)
        if ns is not None:
            starts[int(attempt)] = min(starts.get(int(attempt), ns), ns)
    start_ns = _ns(since) if since is not None else (min(starts.values()) if starts else None)
    telemetry = [t for t in (facts.last_telemetry_ns, *(starts.values())) if t is not None]
    last_ns = max(telemetry) if telemetry else None
    live = _live(facts, starts, last_ns, live_grace_s)
    if until is not None:
        end_ns = _ns(until)
    else:
        candidates = [*telemetry, *(x.detected_ns for x in live.incidents if x.detected_ns is not None),
                      *(d.issued_ns for d in live.decisions)]
        end_ns = max(candidates) if candidates else None
    if start_ns is None or end_ns is None:
        raise GoodputError(f"job {facts.job_id!r}: no attempt start or activity to bound the window")
    if end_ns <= start_ns:
        raise GoodputError(f"job {facts.job_id!r}: empty window {_dt(start_ns).isoformat()} .. "
                           f"{_dt(end_ns).isoformat()}")
    intervals, lost, resume = _intervals(live, starts, end_ns)
    timeline = build_timeline(intervals, start_ns, end_ns)
    totals = timeline.seconds()
    wall_s = (end_ns - start_ns) / _NS
    window_ns = round((window_s if window_s else wall_s / 10) * _NS)
    if window_ns <= 0:
        raise GoodputError(f"the sliding window must be positive, got {window_s}")
    sliding = _sliding(timeline, window_ns, max_points)

    work = ~facts.step_is_checkpoint
    attempts = sorted(set(starts) | set(facts.step_attempt.tolist()))
    first_decision: dict[int, DecisionFact] = {}
    by_incident = {x.incident_id: x for x in facts.incidents}
    for decision in facts.decisions:
        attempt = decision.attempt
        if attempt is None and decision.incident_id in by_incident:
            attempt = by_incident[decision.incident_id].attempt
        if attempt is not None and attempt not in first_decision:
            first_decision[attempt] = decision
    accounts, costs = [], []
    for i, attempt in enumerate(attempts):
        mine = facts.step_attempt == attempt
        mine_work = mine & work
        numbers = facts.step_number[mine_work]
        begin = starts.get(attempt, start_ns)
        following = [starts[a] for a in attempts[i + 1:] if a in starts]
        period_end = min(following) if following else end_ns
        decision = first_decision.get(attempt)
        incident = by_incident.get(decision.incident_id) if decision is not None and decision.incident_id else None
        last_end = int(facts.step_end_ns[mine].max()) if np.any(mine) else None
        accounts.append(AttemptAccount(
            attempt=attempt, start=_dt(begin),
            first_step_start=_dt(int(facts.step_start_ns[mine].min())) if np.any(mine) else None,
            last_step_end=_dt(last_end), first_step=int(numbers.min()) if len(numbers) else None,
            last_step=int(numbers.max()) if len(numbers) else None, resume_point=resume.get(attempt),
            steps_kept=len(np.unique(facts.step_number[mine_work & ~lost])),
            steps_lost=len(np.unique(facts.step_number[mine_work & lost])),
            incident_id=None if decision is None else decision.incident_id,
            incident_class=None if incident is None else incident.incident_class,
            cause=None if incident is None else incident.cause, action=None if decision is None else decision.action,
            seconds=timeline.between(max(begin, start_ns), period_end)))
        if decision is not None and decision.incident_id:
            nxt_first = [int(facts.step_start_ns[facts.step_attempt == a].min()) for a in attempts[i + 1:]
                         if np.any(facts.step_attempt == a)]
            down_from = last_end if last_end is not None else begin
            down_to = nxt_first[0] if nxt_first else end_ns
            spent = timeline.between(max(down_from, start_ns), down_to)
            costs.append(IncidentCost(
                incident_id=decision.incident_id, attempt=attempt, live=decision in live.decisions,
                incident_class=None if incident is None else incident.incident_class,
                cause=None if incident is None else incident.cause, action=decision.action,
                lost_work_s=accounts[-1].seconds[Bucket.LOST_WORK],
                downtime_s=sum(v for k, v in spent.items() if k not in (Bucket.PRODUCTIVE, Bucket.CHECKPOINT))))
    productive_s = totals[Bucket.PRODUCTIVE]
    return GoodputReport(
        job_id=facts.job_id, start=_dt(start_ns), end=_dt(end_ns), wall_s=wall_s, productive_s=productive_s,
        ettr=productive_s / wall_s, badput={b: totals[b] for b in BADPUT},
        steps_kept=sum(a.steps_kept for a in accounts),
        steps_lost=sum(a.steps_lost for a in accounts), window_s=window_ns / _NS, sliding=sliding,
        min_sliding_ettr=min((p.ettr for p in sliding), default=None),
        longest_unproductive=_longest_unproductive(timeline), attempts=tuple(accounts), incidents=tuple(costs),
        offline=tuple([x.incident_id for x in facts.incidents if x not in live.incidents]
                      + [d.decision_id for d in facts.decisions if d not in live.decisions]),
        timeline=timeline)


def goodput(store: Store | str, job_id: str, *, since: dt.datetime | None = None, until: dt.datetime | None = None,
            window_s: float | None = None, attempt_starts: Mapping[int, dt.datetime] | None = None,
            live_grace_s: float = 600.0) -> GoodputReport:
    """ETTR and badput by cause of `job_id` from a store (a Store or its URL)."""
    if isinstance(store, Store):
        facts = load_job_facts(store, job_id)
    else:
        with Store(store, jobs=[job_id]) as reader:
            facts = load_job_facts(reader, job_id)
    return account(facts, since=since, until=until, window_s=window_s, attempt_starts=attempt_starts,
                   live_grace_s=live_grace_s)


def expected_ettr(nodes: int, failures_per_node_s: float, restart_s: float, interval_s: float,
                  write_s: float) -> float:
    """Meta's expected ETTR ≈ (1 − N·r_f·(u₀ + Δt_cp/2)) / (1 + w/Δt_cp) (reference/failures.md 2(b))."""
    if interval_s <= 0:
        raise ValueError("the checkpoint interval must be positive")
    return (1 - nodes * failures_per_node_s * (restart_s + interval_s / 2)) / (1 + write_s / interval_s)


def optimal_checkpoint_interval(nodes: int, failures_per_node_s: float, write_s: float) -> float:
    """Young/Daly: Δt_cp* = √(2w / (N·r_f))."""
    if nodes <= 0 or failures_per_node_s <= 0:
        raise ValueError("nodes and the failure rate must be positive")
    return math.sqrt(2 * write_s / (nodes * failures_per_node_s))
