"""Detection from progress: per attempt, steps and heartbeats against the baseline of the job's own
pace.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.crash import teardown_starts
from faultlens.attribution.detectors.progress.suspect import HangSuspect
from faultlens.attribution.detectors.progress.together import idle_together
from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Evidence
from faultlens.attribution.reading.telemetry import Telemetry
from faultlens.attribution.rules import ProgressThresholds

# ---------------------------------------------------------------- detection from progress


def completion_times(rows: pd.DataFrame) -> pd.Series:
    """Per row, when it completed: end_ts where known, else the row's ts."""
    if "end_ts" in rows.columns:
        return rows["end_ts"].where(rows["end_ts"].notna(), rows["ts"])
    return rows["ts"]


def _phase(rows: pd.DataFrame) -> pd.Series:
    if "phase" not in rows.columns:
        return pd.Series(["train"] * len(rows), index=rows.index, dtype=object)
    return rows["phase"].astype(object).where(rows["phase"].notna(), "train")


@dataclass(frozen=True)
class ProgressBaseline:
    """What the recent steps of one attempt say about how long a gap may be."""

    threshold_s: float
    baseline_s: float | None
    baseline_steps: int
    reason: str
    normal_s: float | None = None  # before any slow-phase allowance (None: no baseline)
    normal_reason: str = ""


class ProgressMonitor:
    """Finds attempts whose progress stopped for longer than their own recent step time allows."""

    def __init__(self, thresholds: ProgressThresholds) -> None:
        self.t = thresholds

    def baseline(
        self, attempt_steps: pd.DataFrame, beats: pd.DataFrame | None = None
    ) -> ProgressBaseline:
        """The allowed gap after the last completed step of `attempt_steps` (rows of one attempt;
        `beats`: its heartbeats, which give the step time while few step rows were flushed yet)."""
        t = self.t
        rows = attempt_steps.assign(_done=completion_times(attempt_steps),
                                    _phase=_phase(attempt_steps))
        rows = rows[rows["step"].notna()]
        first_step = int(rows["step"].min()) if not rows.empty else 0
        base = rows[
            rows["_phase"].isin(t.baseline_phases) & (rows["step"] >= first_step + t.warmup_steps)
        ]
        # one completion per step (synchronous training: the last rank to finish it)
        per_step = base.groupby("step")["_done"].max().sort_index()
        steps = per_step.index.to_numpy(dtype=np.int64)
        times = per_step.to_numpy()
        intervals: list[float] = []
        for i in range(1, len(steps)):
            if steps[i] == steps[i - 1] + 1:
                intervals.append((times[i] - times[i - 1]) / pd.Timedelta(seconds=1))
        if len(intervals) < t.min_baseline_steps and "duration_s" in base.columns:
            durations = base.groupby("step")["duration_s"].max().dropna()
            intervals = (
                [float(d) for d in durations.to_numpy()]
                if len(durations) > len(intervals)
                else intervals
            )
        if len(intervals) < t.min_baseline_steps and beats is not None and not beats.empty:
            from_beats = _heartbeat_intervals(beats, t.warmup_steps)
            intervals = from_beats if len(from_beats) > len(intervals) else intervals
        intervals = [i for i in intervals if i >= 0][-t.recent_steps:]
        if len(intervals) < t.min_baseline_steps:
            return ProgressBaseline(t.startup_floor_s, None, len(intervals),
                                    f"no baseline yet ({len(intervals)} steps): startup floor "
                                    f"{t.startup_floor_s:g}s")
        baseline = float(np.median(intervals))
        threshold = max(t.floor_s, t.k * baseline)
        reason = (f"{t.k:g} x recent step time {baseline:.3g}s (median of {len(intervals)}), floor "
                  f"{t.floor_s:g}s")
        normal, normal_reason = threshold, reason
        allowance = self._slow_phase_allowance(rows)
        if allowance is not None and allowance[0] > threshold:
            threshold = allowance[0]
            reason += f"; {allowance[1]}"
        return ProgressBaseline(threshold, baseline, len(intervals), reason, normal, normal_reason)

    def _slow_phase_now(self, latest: pd.DataFrame, rows: pd.DataFrame) -> tuple[float, str] | None:
        """The gap allowed while a rank is inside a step of a slow phase (its heartbeat says which):
        slow_phase_k x the longest such step seen in the attempt, or slow_phase_floor_s for the
        first one (a checkpoint or an evaluation takes what it takes; its peers may already wait for
        it in the next step)."""
        if latest.empty or "phase" not in latest.columns:
            return None
        inside = latest[latest["in_step"].fillna(False).astype(bool)]
        phases = sorted({str(p) for p in inside["phase"].dropna() if str(p) in self.t.slow_phases})
        if not phases:
            return None
        best: tuple[float, str] | None = None
        for phase in phases:
            seen = rows[_phase(rows) == phase] if not rows.empty else rows
            longest = _longest_step(seen)
            if longest > 0:
                allowance = self.t.slow_phase_k * longest
                why = (f"a rank is in a {phase} step ({phase} steps take up to {longest:.3g}s): "
                       "allowance "
                       f"{allowance:.3g}s")
            else:
                allowance = self.t.slow_phase_floor_s
                why = (f"a rank is in the attempt's first {phase} step: slow-phase floor "
                       f"{allowance:g}s")
            if best is None or allowance > best[0]:
                best = (allowance, why)
        return best

    def _together_window(self, baseline: ProgressBaseline, rows: pd.DataFrame,
                         slow_now: bool) -> tuple[float, str] | None:
        """The normal threshold a slow phase's allowance widened (the window over which every rank
        idle together withholds it), with its reason; None when no allowance is in play. Before a
        baseline exists (the attempt's first steps) only a rank inside a slow-phase step counts,
        against k x the longest training step so far (at least floor_s)."""
        if baseline.normal_s is not None:
            if baseline.threshold_s > baseline.normal_s or slow_now:
                return baseline.normal_s, baseline.normal_reason
            return None
        if not slow_now:
            return None
        t = self.t
        train = rows[_phase(rows).isin(t.baseline_phases)] if not rows.empty else rows
        if not train.empty and train["step"].notna().any():
            # the warm-up steps (compilation, first batches) are no measure of a step
            warm = train[train["step"] >= int(train["step"].min()) + t.warmup_steps]
            train = warm if not warm.empty else train
        longest = _longest_step(train)
        window = max(t.floor_s, t.k * longest)
        return window, (f"no baseline yet: {t.k:g} x the longest training step so far "
                        f"{longest:.3g}s, floor {t.floor_s:g}s")

    def _slow_phase_allowance(self, rows: pd.DataFrame) -> tuple[float, str] | None:
        """The wider gap a slow phase may need, when one was seen and the next step may be one."""
        slow = rows[rows["_phase"].isin(self.t.slow_phases)]
        if slow.empty:
            return None
        last = rows.loc[rows["_done"].idxmax()]
        next_step = int(last["step"]) + 1
        best: tuple[float, str] | None = None
        for phase, group in slow.groupby("_phase"):
            longest = _longest_step(group)
            if longest <= 0:
                continue
            occurrences = sorted({int(s) for s in group["step"].dropna()})
            due = last["_phase"] == phase
            if not due:
                gaps = np.diff(occurrences)
                if len(occurrences) >= 2 and len(set(gaps.tolist())) == 1:
                    # periodic: is the next one due?
                    due = next_step >= occurrences[-1] + int(gaps[0]) - 1
                else:
                    due = True  # seen, period unknown: it may come at any step
            if due:
                allowance = self.t.slow_phase_k * longest
                if best is None or allowance > best[0]:
                    best = (allowance, f"{phase} steps take up to {longest:.3g}s: allowance "
                                       f"{allowance:.3g}s")
        return best

    def suspects(
        self, telemetry: Telemetry, as_of: dt.datetime | dict[str, dt.datetime]
    ) -> list[HangSuspect]:
        """One suspect per attempt whose progress stopped too long (the latest attempt: until
        `as_of`; an earlier
        one: until the next attempt started)."""
        steps, beats = telemetry.steps, telemetry.heartbeats
        if steps.empty and beats.empty:
            return []
        found = []
        jobs = sorted(
            {
                str(j)
                for frame in (steps, beats)
                if not frame.empty
                for j in frame["job_id"].dropna()
            }
        )
        for job in jobs:
            end = as_of.get(job) if isinstance(as_of, dict) else as_of
            if end is None:
                continue
            job_steps = steps[steps["job_id"] == job] if not steps.empty else steps
            job_beats = beats[beats["job_id"] == job] if not beats.empty else beats
            attempts = sorted({int(a) for frame in (job_steps, job_beats) if not frame.empty
                               for a in frame["attempt"].dropna().unique()}) or [None]
            starts = _attempt_starts(telemetry, job)
            finished = _finished_attempts(telemetry.process_events, job) | _closed_attempts(
                job_beats
            )
            events = telemetry.process_events
            teardown = teardown_starts(events[events["job_id"] == job]) if not events.empty else {}
            for attempt in attempts:
                if attempt in finished:
                    continue
                rows = job_steps if attempt is None or job_steps.empty else \
                    job_steps[job_steps["attempt"] == attempt]
                attempt_beats = job_beats if attempt is None or job_beats.empty else \
                    job_beats[job_beats["attempt"] == attempt]
                newer = [
                    t
                    for a, t in starts.items()
                    if a is not None and attempt is not None and a > attempt
                ]
                stopped = teardown.get((job, attempt if attempt is not None else -1))
                # the supervisor began stopping it: what follows is no stall
                if stopped is not None:
                    newer.append(as_datetime(stopped))
                observed_until = min(newer) if newer else end
                suspect = self._check(job, attempt, rows, attempt_beats, observed_until)
                if suspect is not None:
                    found.append(suspect)
        return found

    def _check(self, job: str, attempt: int | None, rows: pd.DataFrame, beats: pd.DataFrame,
               until: dt.datetime) -> HangSuspect | None:
        last, last_step, source = _last_progress(rows, beats)
        if last is None:
            return None
        until = as_datetime(until) or until
        observed, clock = until, "the clock"
        if not beats.empty:
            # the ranks themselves say how long the job went without progress: the newest moment a
            # rank was seen alive (its step timer stamps its heartbeat) past the last completed
            # step. Late or slow ingestion then never reads as a stall; only when every heartbeat
            # stopped for the startup floor (every process frozen or gone) does the clock count
            # again
            alive = as_datetime(beats["ts"].max())
            if alive is not None and (until - alive).total_seconds() <= self.t.startup_floor_s:
                observed, clock = min(alive, until), "heartbeats"
        gap = (observed - last).total_seconds()
        baseline = self.baseline(rows, beats)
        threshold, reason = baseline.threshold_s, baseline.reason
        latest = _latest_beats(beats)
        if not latest.empty and not latest["in_step"].fillna(False).astype(bool).any() \
                and self.t.startup_floor_s > threshold:
            threshold = self.t.startup_floor_s
            reason += ("; no rank is inside a step (between steps or ending): startup floor "
                       f"{threshold:g}s")
        slow = self._slow_phase_now(latest, rows)
        if slow is not None and slow[0] > threshold:
            threshold, reason = slow[0], reason + f"; {slow[1]}"
        window = self._together_window(baseline, rows, slow is not None)
        if window is not None and threshold > window[0]:
            # a slow phase's allowance is for a rank that works: not when every rank sits idle
            together = idle_together(beats, observed, window[0], self.t.idle_cpu_share,
                                     self.t.idle_io_bytes, tuple(self.t.slow_phases))
            if together is not None:
                threshold, reason = window[0], f"{window[1]}; {together.text}"
        if gap <= threshold:
            return None
        done_rows = (
            rows[rows["step"] == last_step]["rank"].dropna()
            if last_step is not None and not rows.empty
            else pd.Series(dtype=object)
        )
        done_beats = (
            latest[latest["step"] >= last_step]["rank"].dropna()
            if last_step is not None and not latest.empty
            else pd.Series(dtype=object)
        )
        ranks_at_last = len(set(done_rows.astype(int)) | set(done_beats.astype(int)))
        all_ranks = len(
            {int(r) for frame in (rows, beats) if not frame.empty for r in frame["rank"].dropna()}
        )
        text = (f"no step completed for {gap:.1f}s after step {last_step} (allowed "
                f"{threshold:.3g}s: {reason}); "
                f"{ranks_at_last} of {all_ranks} ranks finished step {last_step} (progress from "
                f"{source}, "
                f"observed by {clock})")
        return HangSuspect(
            job,
            attempt,
            last,
            "progress",
            last_step,
            gap,
            threshold,
            (Evidence("heartbeats" if source == "heartbeats" else "steps", last, text),),
        )


def _longest_step(rows: pd.DataFrame) -> float:
    """The longest step duration among `rows` (0.0 when none is known)."""
    durations = (
        rows["duration_s"].dropna() if "duration_s" in rows.columns else pd.Series(dtype=float)
    )
    return float(durations.max()) if not durations.empty else 0.0


def _latest_beats(beats: pd.DataFrame) -> pd.DataFrame:
    """The newest heartbeat of every rank."""
    if beats.empty:
        return beats
    ordered = beats.sort_values(["ts", "steps"], kind="stable")
    return ordered.drop_duplicates("rank", keep="last")


def _last_progress(
    rows: pd.DataFrame, beats: pd.DataFrame
) -> tuple[dt.datetime | None, int | None, str]:
    """When the newest step of the attempt completed, which step it was, and where that was read."""
    best: tuple[dt.datetime | None, int | None, str] = (None, None, "steps")
    if not rows.empty:
        done = completion_times(rows)
        if done.notna().any():
            index = done.idxmax()
            step = rows.loc[index, "step"]
            best = (
                as_datetime(done.loc[index]),
                None if step is None or step is pd.NA else int(step),
                "steps",
            )
    if not beats.empty and "step_ts" in beats.columns:
        known = beats[beats["step_ts"].notna() & beats["step"].notna()]
        if not known.empty:
            index = known["step_ts"].idxmax()
            when = as_datetime(known.loc[index, "step_ts"])
            step = int(known["step"].max())
            if when is not None and (best[0] is None or when > best[0]):
                best = (when, max(step, best[1] if best[1] is not None else step), "heartbeats")
            elif best[1] is not None and step > best[1]:
                best = (best[0], step, best[2])
    return best


#: heartbeat intervals enough for a baseline: ranks are read in ascending order until this many are
#: found
HEARTBEAT_INTERVALS = 200


def _heartbeat_intervals(beats: pd.DataFrame, warmup_steps: int) -> list[float]:
    """Seconds per step between successive heartbeats of the same rank (warm-up steps left out),
    rank by rank in ascending order until HEARTBEAT_INTERVALS are found
    (attribution/reading/windows.py reads those ranks' beats)."""
    known = beats[beats["step_ts"].notna() & beats["step"].notna()]
    if known.empty:
        return []
    first = int(known["step"].min()) + warmup_steps
    intervals: list[float] = []
    for _, group in known[known["step"] >= first].groupby("rank"):
        points = group.drop_duplicates("step").sort_values("step")
        steps = points["step"].to_numpy(dtype=np.int64)
        times = points["step_ts"].to_numpy()
        for i in range(1, len(steps)):
            delta = int(steps[i] - steps[i - 1])
            if delta > 0:
                intervals.append((times[i] - times[i - 1]) / pd.Timedelta(seconds=1) / delta)
        if len(intervals) >= HEARTBEAT_INTERVALS:
            break
    return intervals


def _closed_attempts(beats: pd.DataFrame) -> set[int | None]:
    """Attempts whose every rank's step timer closed (their newest heartbeats all say so)."""
    if beats.empty or "closed" not in beats.columns:
        return set()
    closed: set[int | None] = set()
    for attempt, group in beats.groupby("attempt", dropna=False):
        latest = _latest_beats(group)
        if len(latest) and bool(latest["closed"].fillna(False).astype(bool).all()):
            closed.add(None if attempt is pd.NA or attempt != attempt else int(attempt))
    return closed


def _attempt_starts(telemetry: Telemetry, job: str) -> dict[int | None, dt.datetime]:
    """When each attempt of a job first showed up (any table)."""
    starts: dict[int | None, dt.datetime] = {}
    for frame in (telemetry.ranks, telemetry.steps, telemetry.process_events, telemetry.heartbeats):
        if frame.empty or "attempt" not in frame.columns:
            continue
        rows = frame[(frame["job_id"] == job) & frame["attempt"].notna()]
        if "start_ts" in rows.columns:
            times = rows["start_ts"].where(rows["start_ts"].notna(), rows["ts"])
        else:
            times = rows["ts"]
        for attempt, first in times.groupby(rows["attempt"]).min().items():
            first = as_datetime(first)
            if first is not None and (int(attempt) not in starts or first < starts[int(attempt)]):
                starts[int(attempt)] = first
    return starts


def _finished_attempts(events: pd.DataFrame, job: str) -> set[int | None]:
    """Attempts whose every reported rank (kind exit), or every torchrun agent (the supervisor's
    agent_exit rows), exited with code 0 (the job finished: silence is not a hang)."""
    if events.empty:
        return set()
    finished: set[int | None] = set()
    for kind in ("exit", "agent_exit"):
        rows = events[(events["job_id"] == job) & (events["kind"] == kind)]
        for attempt, group in rows.groupby("attempt", dropna=False):
            codes = group["exit_code"]
            # one row per agent (the newest per node), and every launched node's
            if kind == "agent_exit":
                newest = group.sort_values("ts").drop_duplicates("node", keep="last")
                codes = newest["exit_code"]
                same = events["attempt"].isna() if attempt is pd.NA or attempt != attempt else \
                    events["attempt"] == attempt
                launched = set(events[(events["job_id"] == job) & (events["kind"] == "start") & same
                                      & events["rank"].isna()]["node"].dropna())
                if not launched <= set(newest["node"].dropna()):
                    continue
            if len(codes) and bool((codes.fillna(-1) == 0).all()):
                finished.add(None if attempt is pd.NA or attempt != attempt else int(attempt))
    return finished


