"""Hang detection from progress, and the collective-hang incident built from a flight-recorder dump set.

A job is suspected hung when no step of its current attempt completes for k x its recent step time (the median
interval between consecutive completed training steps, warm-up steps left out), never before a floor, and only
after a much longer floor while no baseline exists yet (the first steps of an attempt). Phases that are slow by
design (evaluation, checkpointing) widen the allowance once seen, when the next step may be one of them. An
earlier attempt counts as hung when its progress stopped that long before the next attempt started.

A suspect (from progress, or from collective-timeout errors in process_events) then gets a flight-recorder dump
request through a callable the caller passes in, and the dump set's collectives go through the hang analysis
(attribution.hang.analyze_collectives). Its culprit ranks are mapped to nodes and GPUs through the ranks table.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from attribution.hardware import XidCatalogLike, as_datetime, hardware_findings
from attribution.incident import Cause, Evidence, Incident, IncidentClass
from attribution.rules import CrashRules, ProgressThresholds
from attribution.telemetry import Placement, Telemetry, placements

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HangSuspect:
    """A job attempt that stopped making progress or reported collective timeouts."""

    job_id: str | None
    attempt: int | None
    since: dt.datetime  # the last progress (or the first timeout report)
    detected_by: str  # "progress" or "watchdog"
    last_step: int | None
    stalled_for_s: float | None
    threshold_s: float | None
    evidence: tuple[Evidence, ...]

    @property
    def incident_id(self) -> str:
        return Incident.make_id("collective_hang", self.job_id, self.attempt, self.last_step)


DumpRequester = Callable[[HangSuspect], pa.Table | None]
HangAnalyzer = Callable[[pa.Table, Sequence[int] | None], Any]


def default_analyzer() -> HangAnalyzer:
    from attribution.hang import analyze_collectives

    return analyze_collectives


# ---------------------------------------------------------------- detection from progress


def _completion_times(rows: pd.DataFrame) -> pd.Series:
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


class ProgressMonitor:
    """Finds attempts whose progress stopped for longer than their own recent step time allows."""

    def __init__(self, thresholds: ProgressThresholds) -> None:
        self.t = thresholds

    def baseline(self, attempt_steps: pd.DataFrame) -> ProgressBaseline:
        """The allowed gap after the last completed step of `attempt_steps` (rows of one attempt)."""
        t = self.t
        rows = attempt_steps.assign(_done=_completion_times(attempt_steps), _phase=_phase(attempt_steps))
        rows = rows[rows["step"].notna()]
        first_step = int(rows["step"].min()) if not rows.empty else 0
        base = rows[rows["_phase"].isin(t.baseline_phases) & (rows["step"] >= first_step + t.warmup_steps)]
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
            intervals = [float(d) for d in durations.to_numpy()] if len(durations) > len(intervals) else intervals
        intervals = [i for i in intervals if i >= 0][-t.recent_steps:]
        if len(intervals) < t.min_baseline_steps:
            return ProgressBaseline(t.startup_floor_s, None, len(intervals),
                                    f"no baseline yet ({len(intervals)} steps): startup floor {t.startup_floor_s:g}s")
        baseline = float(np.median(intervals))
        threshold = max(t.floor_s, t.k * baseline)
        reason = f"{t.k:g} x recent step time {baseline:.3g}s (median of {len(intervals)}), floor {t.floor_s:g}s"
        allowance = self._slow_phase_allowance(rows)
        if allowance is not None and allowance[0] > threshold:
            threshold = allowance[0]
            reason += f"; {allowance[1]}"
        return ProgressBaseline(threshold, baseline, len(intervals), reason)

    def _slow_phase_allowance(self, rows: pd.DataFrame) -> tuple[float, str] | None:
        """The wider gap a slow phase may need, when one was seen and the next step may be one."""
        slow = rows[rows["_phase"].isin(self.t.slow_phases)]
        if slow.empty:
            return None
        last = rows.loc[rows["_done"].idxmax()]
        next_step = int(last["step"]) + 1
        best: tuple[float, str] | None = None
        for phase, group in slow.groupby("_phase"):
            durations = group["duration_s"].dropna() if "duration_s" in group.columns else pd.Series(dtype=float)
            longest = float(durations.max()) if not durations.empty else 0.0
            if longest <= 0:
                continue
            occurrences = sorted({int(s) for s in group["step"].dropna()})
            due = last["_phase"] == phase
            if not due:
                gaps = np.diff(occurrences)
                if len(occurrences) >= 2 and len(set(gaps.tolist())) == 1:
                    due = next_step >= occurrences[-1] + int(gaps[0]) - 1  # periodic: is the next one due?
                else:
                    due = True  # seen, period unknown: it may come at any step
            if due:
                allowance = self.t.slow_phase_k * longest
                if best is None or allowance > best[0]:
                    best = (allowance, f"{phase} steps take up to {longest:.3g}s: allowance {allowance:.3g}s")
        return best

    def suspects(self, telemetry: Telemetry, as_of: dt.datetime | dict[str, dt.datetime]) -> list[HangSuspect]:
        """One suspect per attempt whose progress stopped too long (the latest attempt: until `as_of`; an earlier
        one: until the next attempt started)."""
        steps = telemetry.steps
        if steps.empty:
            return []
        found = []
        for job, job_steps in steps.groupby("job_id", dropna=True):
            job = str(job)
            end = as_of.get(job) if isinstance(as_of, dict) else as_of
            if end is None:
                continue
            attempts = sorted(int(a) for a in job_steps["attempt"].dropna().unique()) or [None]
            starts = _attempt_starts(telemetry, job)
            finished = _finished_attempts(telemetry.process_events, job)
            for attempt in attempts:
                rows = job_steps if attempt is None else job_steps[job_steps["attempt"] == attempt]
                newer = [t for a, t in starts.items() if a is not None and attempt is not None and a > attempt]
                observed_until = min(newer) if newer else end
                if attempt in finished:
                    continue
                suspect = self._check(job, attempt, rows, observed_until)
                if suspect is not None:
                    found.append(suspect)
        return found

    def _check(self, job: str, attempt: int | None, rows: pd.DataFrame, until: dt.datetime) -> HangSuspect | None:
        if rows.empty:
            return None
        done = _completion_times(rows)
        last_index = done.idxmax()
        last = as_datetime(done.loc[last_index])
        if last is None:
            return None
        until = as_datetime(until) or until
        gap = (until - last).total_seconds()
        baseline = self.baseline(rows)
        if gap <= baseline.threshold_s:
            return None
        last_step = rows.loc[last_index, "step"]
        last_step = int(last_step) if last_step is not None and last_step is not pd.NA else None
        ranks_at_last = rows[rows["step"] == last_step]["rank"].dropna().nunique() if last_step is not None else 0
        all_ranks = rows["rank"].dropna().nunique()
        text = (f"no step completed for {gap:.1f}s after step {last_step} (allowed {baseline.threshold_s:.3g}s: "
                f"{baseline.reason}); {ranks_at_last} of {all_ranks} ranks finished step {last_step}")
        return HangSuspect(job, attempt, last, "progress", last_step, gap, baseline.threshold_s,
                           (Evidence("steps", last, text),))


def _attempt_starts(telemetry: Telemetry, job: str) -> dict[int | None, dt.datetime]:
    """When each attempt of a job first showed up (any table)."""
    starts: dict[int | None, dt.datetime] = {}
    for frame in (telemetry.ranks, telemetry.steps, telemetry.process_events):
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
    """Attempts whose every reported rank exited with code 0 (the job finished: silence is not a hang)."""
    if events.empty:
        return set()
    rows = events[(events["job_id"] == job) & (events["kind"] == "exit")]
    finished: set[int | None] = set()
    for attempt, group in rows.groupby("attempt", dropna=False):
        codes = group["exit_code"]
        if len(codes) and bool((codes.fillna(-1) == 0).all()):
            finished.add(None if attempt is pd.NA or attempt != attempt else int(attempt))
    return finished


# ---------------------------------------------------------------- from a dump set to an incident


def latest_dump_set(collectives: pa.Table, job: str | None, attempt: int | None) -> pa.Table:
    """The newest dump of every rank of one attempt (collectives rows of possibly many dumps)."""
    if collectives.num_rows == 0:
        return collectives
    mask = pc.fill_null(pc.equal(collectives.column("job_id"), pa.scalar(job)), False) if job is not None \
        else pc.is_null(collectives.column("job_id"))
    rows = collectives.filter(mask)
    if attempt is not None and rows.num_rows:
        same = rows.filter(pc.fill_null(pc.equal(rows.column("attempt"), pa.scalar(attempt, pa.int32())), False))
        unknown = rows.filter(pc.is_null(rows.column("attempt")))
        rows = same if same.num_rows else unknown
    if rows.num_rows == 0:
        return rows
    frame = pa.table({"rank": rows.column("rank"), "dump_id": pc.fill_null(rows.column("dump_id"), ""),
                      "ts": rows.column("ts")})
    newest = frame.group_by(["rank", "dump_id"]).aggregate([("ts", "max")]).to_pandas()
    keep = newest.sort_values("ts_max").drop_duplicates("rank", keep="last")
    wanted = set(zip(keep["rank"].tolist(), keep["dump_id"].tolist(), strict=True))
    keys = zip(frame.column("rank").to_pylist(), frame.column("dump_id").to_pylist(), strict=True)
    return rows.filter(pa.array([key in wanted for key in keys]))


def _verdict(report: Any) -> str:
    verdict = getattr(report, "verdict", "unknown")
    return str(getattr(verdict, "value", verdict)).lower()


class HangAttributor:
    """Turns a hang suspect into a collective_hang incident: dump request, hang analysis, culprits, cause."""

    def __init__(self, crash_rules: CrashRules, catalog: XidCatalogLike | None,
                 analyzer: HangAnalyzer | None = None, dump_requester: DumpRequester | None = None) -> None:
        self.rules = crash_rules
        self.catalog = catalog
        self._analyzer = analyzer
        self.dump_requester = dump_requester

    @property
    def analyzer(self) -> HangAnalyzer:
        if self._analyzer is None:
            self._analyzer = default_analyzer()
        return self._analyzer

    def dumps_for(self, suspect: HangSuspect, telemetry: Telemetry) -> tuple[pa.Table, str]:
        """The dump set to analyse: what the dump requester returns, else the newest dumps in the store."""
        if self.dump_requester is not None:
            try:
                requested = self.dump_requester(suspect)
            except Exception as exc:  # a failing trigger must not stop attribution
                log.warning("flight-recorder dump request for %s attempt %s failed: %s",
                            suspect.job_id, suspect.attempt, exc)
                requested = None
            if requested is not None and requested.num_rows:
                return requested, "requested dump set"
        return latest_dump_set(telemetry.collectives, suspect.job_id, suspect.attempt), "dumps in the store"

    def attribute(self, suspect: HangSuspect, telemetry: Telemetry, now: dt.datetime) -> Incident:
        placement = placements(telemetry.ranks, suspect.attempt, telemetry.process_events, telemetry.steps)
        expected = sorted(placement) or None
        dumps, origin = self.dumps_for(suspect, telemetry)
        evidence = list(suspect.evidence)
        if dumps.num_rows == 0:
            evidence.append(Evidence("collectives", None, "no flight-recorder dumps for this attempt"))
            return self._incident(suspect, now, Cause.UNKNOWN, "hang-no-dumps", 0.3, (), placement, evidence,
                                  "collective hang suspected; no flight-recorder dumps to analyse")
        report = self.analyzer(dumps, expected)
        verdict = _verdict(report)
        culprits = tuple(int(r) for r in getattr(report, "culprit_ranks", ()) or ())
        dump_ranks = len(set(dumps.column("rank").to_pylist()))
        evidence.append(Evidence("collectives", as_datetime(pc.max(dumps.column("ts")).as_py()),
                                 f"hang analysis of {origin} ({dump_ranks} rank(s), {dumps.num_rows} entries): "
                                 f"{verdict}: {getattr(report, 'reason', '')}"))
        lines = tuple(getattr(report, "evidence", ()) or ())[:5]
        evidence.extend(Evidence("collectives", None, str(line)) for line in lines)
        confidence = float(getattr(report, "confidence", 0.5) or 0.0)
        cause, rule = Cause.UNKNOWN, f"hang-{verdict.replace('_', '-')}"
        if verdict in {"size_mismatch", "op_mismatch"}:
            cause = Cause.SOFTWARE
        elif verdict == "stalled":
            cause = Cause.NETWORK
            confidence *= 0.7
        elif verdict in {"never_joined", "missing_dumps"}:
            findings = [f for rank in culprits
                        for f in hardware_findings(telemetry.gpu_events, _node(placement, rank), suspect.since,
                                                   self.rules, self.catalog, placement.get(rank))]
            if findings:
                best = max(findings, key=lambda f: (f.same_gpu, f.confidence))
                cause, rule = best.cause, f"hang-{verdict.replace('_', '-')}-hardware"
                confidence = max(confidence, best.confidence)
                evidence.extend(f.evidence() for f in findings[:3])
        elif verdict == "no_hang":
            culprits = ()
            confidence = min(confidence, 0.4)
        group = getattr(report, "pg_desc", None) or getattr(report, "pg_name", None) or getattr(report, "pg_id", None)
        op = getattr(report, "op", None)
        seq = getattr(report, "collective_seq_id", None)
        summary = (f"collective hang: {verdict}" + (f" in group {group}" if group else "")
                   + (f" at {op} #{seq}" if op else "") + (f"; culprit ranks {list(culprits)}" if culprits else "")
                   + f"; cause {cause.value}")
        incident = self._incident(suspect, now, cause, rule, confidence, culprits, placement, evidence, summary)
        incident.details.update({"verdict": verdict, "pg": group, "op": op, "collective_seq_id": seq})
        roots = getattr(report, "roots", ())
        if roots:  # every independent root with its own kind (stuck_outside, skipped, stalled, ...), group, waiters
            incident.details["roots"] = [root.to_dict() for root in roots]
        return incident

    def _incident(self, suspect: HangSuspect, now: dt.datetime, cause: Cause, rule: str, confidence: float,
                  culprits: tuple[int, ...], placement: dict[int, Placement], evidence: list[Evidence],
                  summary: str) -> Incident:
        nodes = sorted({p for p in (_node(placement, r) for r in culprits) if p})
        gpus = sorted({placement[r].gpu_label for r in culprits if r in placement and placement[r].gpu_label})
        return Incident(
            incident_id=suspect.incident_id, incident_class=IncidentClass.COLLECTIVE_HANG, cause=cause,
            first_signal_ts=suspect.since, detected_ts=now, confidence=round(max(0.0, min(1.0, confidence)), 3),
            rule=rule, summary=summary, job_id=suspect.job_id, attempt=suspect.attempt, culprit_nodes=tuple(nodes),
            culprit_ranks=culprits, culprit_gpus=tuple(gpus), evidence=tuple(evidence[: self.rules.evidence_limit]),
            step=suspect.last_step, details={"detected_by": suspect.detected_by})


def _node(placement: dict[int, Placement], rank: int) -> str | None:
    return placement[rank].node if rank in placement else None


def suspect_from_trigger(job: str | None, attempt: int | None, ts: dt.datetime, evidence: Sequence[Evidence],
                         steps: pd.DataFrame) -> HangSuspect:
    """A hang suspect from collective-timeout reports (watchdog / gloo timeouts) in process_events."""
    last_step = None
    since = ts
    if not steps.empty:
        rows = steps[(steps["job_id"] == job)] if job is not None else steps
        if attempt is not None:
            rows = rows[rows["attempt"] == attempt]
        if not rows.empty and rows["step"].notna().any():
            done = _completion_times(rows)
            last_index = done.idxmax()
            last_step = int(rows.loc[last_index, "step"])
            since = min(since, as_datetime(done.loc[last_index]) or since)
    return HangSuspect(job, attempt, since, "watchdog", last_step, None, None, tuple(evidence))
