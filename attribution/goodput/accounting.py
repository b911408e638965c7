"""Accounting: intervals per bucket from the facts, the report, and the closed-form ETTR and
checkpoint interval.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

import numpy as np

from faultlens.attribution.goodput.buckets import BADPUT, Bucket, GoodputError
from faultlens.attribution.goodput.clock import NS_PER_S, datetime_of, ns_of
from faultlens.attribution.goodput.facts import DecisionFact, IncidentFact, JobFacts, load_job_facts
from faultlens.attribution.goodput.report import (
    AttemptAccount,
    GoodputReport,
    IncidentCost,
    Stretch,
    WindowPoint,
)
from faultlens.attribution.goodput.timeline import Timeline, build_timeline
from faultlens.attribution.reading.store import Store

# ----------------------------------------------------------------------------------------------
# accounting


def _intervals(
    facts: JobFacts, starts: Mapping[int, int], end_ns: int
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
    resume_of_step = np.array(
        [
            resume.get(int(a)) if resume.get(int(a)) is not None else np.iinfo(np.int64).max
            for a in facts.step_attempt
        ],
        dtype=np.int64,
    )
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
            signals = [
                x.first_signal_ns
                for x in incidents_by_attempt.get(attempt, [])
                if x.first_signal_ns
            ]
            following = [starts[a] for a in attempts[i + 1:] if a in starts]
            finish = min(signals) if signals else (min(following) if following else end_ns)
        startup_s.append(begin)
        startup_e.append(finish)
    intervals[Bucket.STARTUP] = (
        np.array(startup_s, dtype=np.int64),
        np.array(startup_e, dtype=np.int64),
    )

    by_incident = {x.incident_id: x for x in facts.incidents}
    restart_s, restart_e, decide_s, decide_e = [], [], [], []
    decided: set[str] = set()
    for decision in facts.decisions:
        attempt = decision.attempt
        incident = by_incident.get(decision.incident_id or "")
        if attempt is None and incident is not None:
            attempt = incident.attempt
        nxt = [
            starts[a]
            for a in attempts
            if (attempt is None or a > attempt)
            and starts.get(a) is not None
            and starts[a] >= decision.issued_ns
        ]
        restart_s.append(decision.issued_ns)
        restart_e.append(min(nxt) if nxt else end_ns)
        if (
            incident is not None
            and incident.detected_ns is not None
            and incident.incident_id not in decided
        ):
            decided.add(incident.incident_id)
            decide_s.append(incident.detected_ns)
            decide_e.append(decision.issued_ns)
    intervals[Bucket.RESTART] = (
        np.array(restart_s, dtype=np.int64),
        np.array(restart_e, dtype=np.int64),
    )
    intervals[Bucket.DECISION] = (
        np.array(decide_s, dtype=np.int64),
        np.array(decide_e, dtype=np.int64),
    )
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
    productive = timeline.cumulative(Bucket.PRODUCTIVE, ends) - timeline.cumulative(
        Bucket.PRODUCTIVE, ends - width
    )
    return tuple(WindowPoint(datetime_of(int(t)), float(p) / (width / NS_PER_S))
                 for t, p in zip(ends, productive, strict=True))


def _longest_unproductive(timeline: Timeline) -> Stretch | None:
    best: tuple[int, int] | None = None
    current: int | None = None
    for run_start, _run_end, bucket in [
        *timeline.runs(),
        (timeline.end_ns, timeline.end_ns, Bucket.PRODUCTIVE),
    ]:
        if bucket is Bucket.PRODUCTIVE:
            if current is not None and (best is None or run_start - current > best[1] - best[0]):
                best = (current, run_start)
            current = None
        elif current is None:
            current = run_start
    if best is None:
        return None
    spent = {k: v for k, v in timeline.between(*best).items() if v > 0}
    return Stretch(datetime_of(best[0]), datetime_of(best[1]), (best[1] - best[0]) / NS_PER_S,
                   spent)


def _live(
    facts: JobFacts, starts: Mapping[int, int], last_ns: int | None, grace_s: float
) -> JobFacts:
    """The facts with only the incidents and decisions that happened while the job ran (see the
    module doc).
    """
    attempts = sorted(starts)
    by_incident = {x.incident_id: x for x in facts.incidents}

    def bound(attempt: int | None, after_ns: int | None) -> int | None:
        if attempt is not None:
            later = [starts[a] for a in attempts if a > attempt]
        else:
            later = [t for t in starts.values() if after_ns is not None and t > after_ns]
        if later:
            return min(later)
        return None if last_ns is None else last_ns + round(grace_s * NS_PER_S)

    incidents = tuple(
        x
        for x in facts.incidents
        if x.detected_ns is not None
        and (b := bound(x.attempt, x.first_signal_ns)) is not None
        and x.detected_ns <= b
    )
    decisions = []
    for decision in facts.decisions:
        incident = by_incident.get(decision.incident_id or "")
        attempt = (
            decision.attempt
            if decision.attempt is not None
            else (incident.attempt if incident else None)
        )
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
    starts = _attempt_starts(facts, attempt_starts)
    start_ns = ns_of(since) if since is not None else (min(starts.values()) if starts else None)
    telemetry = [t for t in (facts.last_telemetry_ns, *(starts.values())) if t is not None]
    last_ns = max(telemetry) if telemetry else None
    live = _live(facts, starts, last_ns, live_grace_s)
    if until is not None:
        end_ns = ns_of(until)
    else:
        candidates = [
            *telemetry,
            *(x.detected_ns for x in live.incidents if x.detected_ns is not None),
            *(d.issued_ns for d in live.decisions),
        ]
        end_ns = max(candidates) if candidates else None
    if start_ns is None or end_ns is None:
        raise GoodputError(
            f"job {facts.job_id!r}: no attempt start or activity to bound the window"
        )
    if end_ns <= start_ns:
        raise GoodputError(f"job {facts.job_id!r}: empty window {datetime_of(start_ns).isoformat()}"
                           f" .. {datetime_of(end_ns).isoformat()}")
    intervals, lost, resume = _intervals(live, starts, end_ns)
    timeline = build_timeline(intervals, start_ns, end_ns)
    totals = timeline.seconds()
    wall_s = (end_ns - start_ns) / NS_PER_S
    window_ns = round((window_s if window_s else wall_s / 10) * NS_PER_S)
    if window_ns <= 0:
        raise GoodputError(f"the sliding window must be positive, got {window_s}")
    sliding = _sliding(timeline, window_ns, max_points)
    accounts, costs = _attempt_accounts(
        facts, starts, start_ns, end_ns, timeline, live, lost, resume
    )
    productive_s = totals[Bucket.PRODUCTIVE]
    return GoodputReport(
        job_id=facts.job_id,
        start=datetime_of(start_ns),
        end=datetime_of(end_ns),
        wall_s=wall_s,
        productive_s=productive_s,
        ettr=productive_s / wall_s,
        badput={b: totals[b] for b in BADPUT},
        steps_kept=sum(a.steps_kept for a in accounts),
        steps_lost=sum(a.steps_lost for a in accounts),
        window_s=window_ns / NS_PER_S,
        sliding=sliding,
        min_sliding_ettr=min((p.ettr for p in sliding), default=None),
        longest_unproductive=_longest_unproductive(timeline),
        attempts=tuple(accounts),
        incidents=tuple(costs),
        offline=tuple(
            [x.incident_id for x in facts.incidents if x not in live.incidents]
            + [d.decision_id for d in facts.decisions if d not in live.decisions]
        ),
        timeline=timeline,
    )


def _attempt_starts(
    facts: JobFacts, attempt_starts: Mapping[int, dt.datetime] | None
) -> dict[int, int]:
    """attempt -> its start (ns): the earliest of what was observed, its first step and what the
    caller says.
    """
    starts: dict[int, int] = {
        int(a): int(t) for a, t in facts.observed_starts.items() if t is not None
    }
    for attempt in np.unique(facts.step_attempt).tolist():
        first = int(facts.step_start_ns[facts.step_attempt == attempt].min())
        starts[attempt] = min(starts.get(attempt, first), first)
    for attempt, when in (attempt_starts or {}).items():
        ns = ns_of(when)
        if ns is not None:
            starts[int(attempt)] = min(starts.get(int(attempt), ns), ns)
    return starts


def _attempt_accounts(
    facts: JobFacts,
    starts: dict[int, int],
    start_ns: int,
    end_ns: int,
    timeline: Timeline,
    live: JobFacts,
    lost: np.ndarray,
    resume: Mapping[int, int | None],
) -> tuple[list[AttemptAccount], list[IncidentCost]]:
    """One account per attempt, and the cost of each incident that ended one."""
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
        incident = (
            by_incident.get(decision.incident_id)
            if decision is not None and decision.incident_id
            else None
        )
        last_end = int(facts.step_end_ns[mine].max()) if np.any(mine) else None
        accounts.append(
            AttemptAccount(
                attempt=attempt,
                start=datetime_of(begin),
                first_step_start=(
                    datetime_of(int(facts.step_start_ns[mine].min())) if np.any(mine) else None
                ),
                last_step_end=datetime_of(last_end),
                first_step=int(numbers.min()) if len(numbers) else None,
                last_step=int(numbers.max()) if len(numbers) else None,
                resume_point=resume.get(attempt),
                steps_kept=len(np.unique(facts.step_number[mine_work & ~lost])),
                steps_lost=len(np.unique(facts.step_number[mine_work & lost])),
                incident_id=None if decision is None else decision.incident_id,
                incident_class=None if incident is None else incident.incident_class,
                cause=None if incident is None else incident.cause,
                action=None if decision is None else decision.action,
                seconds=timeline.between(max(begin, start_ns), period_end),
            )
        )
        if decision is not None and decision.incident_id:
            nxt_first = [
                int(facts.step_start_ns[facts.step_attempt == a].min())
                for a in attempts[i + 1 :]
                if np.any(facts.step_attempt == a)
            ]
            down_from = last_end if last_end is not None else begin
            down_to = nxt_first[0] if nxt_first else end_ns
            spent = timeline.between(max(down_from, start_ns), down_to)
            costs.append(
                IncidentCost(
                    incident_id=decision.incident_id,
                    attempt=attempt,
                    live=decision in live.decisions,
                    incident_class=None if incident is None else incident.incident_class,
                    cause=None if incident is None else incident.cause,
                    action=decision.action,
                    lost_work_s=accounts[-1].seconds[Bucket.LOST_WORK],
                    downtime_s=sum(
                        v
                        for k, v in spent.items()
                        if k not in (Bucket.PRODUCTIVE, Bucket.CHECKPOINT)
                    ),
                )
            )
    return accounts, costs


def goodput(
    store: Store | str,
    job_id: str,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    window_s: float | None = None,
    attempt_starts: Mapping[int, dt.datetime] | None = None,
    live_grace_s: float = 600.0,
) -> GoodputReport:
    """ETTR and badput by cause of `job_id` from a store (a Store or its URL)."""
    if isinstance(store, Store):
        facts = load_job_facts(store, job_id)
    else:
        with Store(store, jobs=[job_id]) as reader:
            facts = load_job_facts(reader, job_id)
    return account(
        facts,
        since=since,
        until=until,
        window_s=window_s,
        attempt_starts=attempt_starts,
        live_grace_s=live_grace_s,
    )


def expected_ettr(nodes: int, failures_per_node_s: float, restart_s: float, interval_s: float,
                  write_s: float) -> float:
    """Meta's expected ETTR ≈ (1 − N·r_f·(u₀ + Δt_cp/2)) / (1 + w/Δt_cp) (reference/failures.md
    2(b)).
    """
    if interval_s <= 0:
        raise ValueError("the checkpoint interval must be positive")
    return (1 - nodes * failures_per_node_s * (restart_s + interval_s / 2)) / (
        1 + write_s / interval_s
    )


def optimal_checkpoint_interval(nodes: int, failures_per_node_s: float, write_s: float) -> float:
    """Young/Daly: Δt_cp* = √(2w / (N·r_f))."""
    if nodes <= 0 or failures_per_node_s <= 0:
        raise ValueError("nodes and the failure rate must be positive")
    return math.sqrt(2 * write_s / (nodes * failures_per_node_s))
