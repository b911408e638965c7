"""The built-in detectors, registered in the order the engine runs them: crash, hang, straggler,
loss (JOB), health (STORE). Each wraps one attributor of this room; the order carries the judgment:
a crashed attempt is not also a hang, a hang's ending is no new crash, and a slowdown that begins
after an attempt's failure is its aftermath.

Each JOB detector runs two ways (base.py): `detect` over a job's telemetry (JobPass), and
`detect_attempt` over one attempt of the windowed batch pass (AttemptPass), reading only the windows
of that attempt its answers depend on; the crash detector's `prepare_job` attributes the job's
crashes once, over the job's context, before the attempts. Both ways find the same incidents
(tests/test_windowed_attribution.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from faultlens.attribution.detectors.base import (
    AttemptKey,
    AttemptPass,
    DetectorInputs,
    JobPass,
    Scope,
    StorePass,
    WindowedPass,
    register,
)
from faultlens.attribution.detectors.crash import CrashAttributor, CrashResult, teardown_starts
from faultlens.attribution.detectors.health import HealthMonitor
from faultlens.attribution.detectors.loss import LossMonitor
from faultlens.attribution.detectors.numerics import NumericsJudge
from faultlens.attribution.detectors.progress import (
    HangAnalyzer,
    HangAttributor,
    HangSuspect,
    ProgressMonitor,
    latest_dump_set,
    suspect_from_trigger,
)
from faultlens.attribution.detectors.progress.suspect import default_analyzer
from faultlens.attribution.detectors.straggler import StragglerDetector
from faultlens.attribution.incident import Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Telemetry, placements

log = logging.getLogger(__name__)


def evidence_start(incident: Incident) -> dt.datetime:
    """When the error signals an incident is made of began: its first signal, unless that was moved
    back to the culprit's last progress (a silent node), which says when it stopped, not when
    anything failed."""
    start = incident.details.get("failures_from") if isinstance(incident.details, dict) else None
    if isinstance(start, str):
        try:
            return max(incident.first_signal_ts, dt.datetime.fromisoformat(start))
        except ValueError:
            pass
    return incident.first_signal_ts


def attempt_failure_starts(
    telemetry: Telemetry, failures: Iterable[Incident], failed: dict[AttemptKey, dt.datetime] | None
) -> dict[AttemptKey, dt.datetime]:
    """(job, attempt) -> when the attempt's failure began: its crash incident, the supervisor's
    first stopping signal (a decided hang's teardown too), a torchrun agent's non-zero exit.
    Whatever starts later is the failure's aftermath. A hang suspect alone does not count: progress
    after it disproves it."""
    starts: dict[AttemptKey, dt.datetime] = {}

    def note(key: AttemptKey, ts: object) -> None:
        moment = ts.to_pydatetime(warn=False) if isinstance(ts, pd.Timestamp) else ts
        if isinstance(moment, dt.datetime):
            starts[key] = min(starts.get(key, moment), moment)

    for incident in failures:
        if incident.incident_class == IncidentClass.CRASH:
            note((incident.job_id, incident.attempt), evidence_start(incident))
    for key, ts in (failed or {}).items():
        note(key, ts)
    events = telemetry.process_events
    for (job, attempt), ts in teardown_starts(events).items():
        note((job or None, None if attempt == -1 else int(attempt)), ts)
    if not events.empty and "kind" in events.columns and "exit_code" in events.columns:
        exits = events[(events["kind"] == "agent_exit")
                       & (pd.to_numeric(events["exit_code"], errors="coerce").fillna(0) != 0)]
        for job, attempt, ts in zip(exits["job_id"], exits["attempt"], exits["ts"], strict=True):
            note(
                (
                    None if job is None or job != job else job,
                    None if attempt != attempt else int(attempt),
                ),
                ts,
            )
    return starts


def is_follow_on(incident: Incident, starts: dict[AttemptKey, dt.datetime]) -> bool:
    """A slowdown of an attempt that begins at or after the attempt's failure began."""
    start = starts.get((incident.job_id, incident.attempt))
    return start is not None and incident.first_signal_ts >= start


def hung_since(
    stalled: Iterable[HangSuspect], notice_slack_s: float
) -> dict[AttemptKey, dt.datetime]:
    """(job, attempt) -> from when a failure of it is the ending of its hang: its progress had
    stopped for longer than allowed (a death by signal is stamped when it was noticed, up to the
    notice slack late; see crash/)."""
    hung: dict[AttemptKey, dt.datetime] = {}
    for suspect in stalled:
        if suspect.threshold_s is not None:
            noticed = suspect.since + dt.timedelta(seconds=suspect.threshold_s + notice_slack_s)
            key = (suspect.job_id, suspect.attempt)
            hung[key] = min(hung.get(key, noticed), noticed)
    return hung


def without_follow_ons(
    slowdowns: Iterable[Incident], ended: dict[AttemptKey, dt.datetime]
) -> list[Incident]:
    """The slowdowns that do not begin after their attempt's failure began (those are its
    aftermath).
    """
    kept = []
    for incident in slowdowns:
        if is_follow_on(incident, ended):
            log.info("straggler %s of %s attempt %s begins after the attempt's failure: a "
                     "follow-on, not reported",
                     incident.incident_id, incident.job_id, incident.attempt)
            continue
        kept.append(incident)
    return kept


@dataclass(frozen=True)
class CrashNotes:
    """What the crash detector leaves in the pass for the hang detector (in an AttemptPass: the
    job's crash result, and the stalled progress of that attempt)."""

    result: CrashResult
    stalled: tuple[HangSuspect, ...]  # attempts whose progress stopped (hang suspects)


class CrashDetector:
    """Primary failures per attempt. An attempt whose progress had stopped for longer than allowed
    before it failed hung first: the failure that ends the hang is no new crash (live, the hang was
    reported then; a batch pass agrees)."""

    name = "crash"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        self.rules = inputs.crash_rules
        self.attributor = CrashAttributor(inputs.crash_rules, inputs.catalog)
        self.progress = ProgressMonitor(inputs.thresholds.progress)
        self._analyzer = inputs.analyzer

    @property
    def analyzer(self) -> HangAnalyzer:
        """The hang analysis the dumps of a crashed attempt go through (built on first use)."""
        if self._analyzer is None:
            self._analyzer = default_analyzer()
        return self._analyzer

    def detect(self, run: JobPass) -> list[Incident]:
        telemetry = run.telemetry
        crash = self.attributor.attribute(
            telemetry, run.now, run.options.settled, run.options.failure_seen
        )
        stalled = (
            self.progress.suspects(telemetry, run.as_of)
            if run.options.hangs and run.as_of is not None
            else []
        )
        for key, noticed in hung_since(stalled, self.rules.signal_notice_slack_s).items():
            run.hung[key] = min(run.hung.get(key, noticed), noticed)
        crashes = [
            i
            for i in crash.incidents
            if not (
                (i.job_id, i.attempt) in run.hung
                and evidence_start(i) >= run.hung[(i.job_id, i.attempt)]
            )
        ]
        run.busy |= {(i.job_id, i.attempt) for i in crashes} | set(crash.pending)
        run.notes[self.name] = CrashNotes(crash, tuple(stalled))
        return [
            self.with_dump_evidence(i, telemetry)
            for i in crashes
            if i.incident_id not in run.options.already
        ]

    def prepare_job(self, run: WindowedPass) -> None:
        """The job's crashes, once, before its attempts: the crash attribution over the job's
        context (the steps digest answers its lookups into other attempts: placements, last steps,
        earlier fingerprints). Every attempt it names is visited; evidence of another job or of no
        attempt is in no attempt window: then the job is read whole."""
        crash = self.attributor.attribute(run.context, run.now, None)
        keys = [(i.job_id, i.attempt) for i in crash.incidents] + list(crash.pending) + \
            [(t.job_id, t.attempt) for t in crash.hang_triggers]
        if any(job != run.job or attempt is None for job, attempt in keys):
            run.read_whole("crash evidence of another job or of no attempt")
            return
        run.visit(attempt for _, attempt in keys)
        run.notes[self.name] = crash

    def detect_attempt(self, run: AttemptPass) -> list[Incident]:
        """The attempt's crashes (prepare_job found them), but for a failure that began after the
        attempt's progress had stopped for longer than allowed (progress_window): the hang's end."""
        crash: CrashResult | None = run.job_pass.notes.get(self.name)
        if crash is None:  # not prepared: nothing attributed
            return []
        key = run.key
        stalled = [s for s in self.progress.suspects(run.progress_window(), run.as_of)
                   if (s.job_id, s.attempt) == key] if run.as_of is not None else []
        hung = hung_since(stalled, self.rules.signal_notice_slack_s).get(key)
        if hung is not None:
            run.hung[key] = min(run.hung.get(key, hung), hung)
        crashes = [i for i in crash.incidents if (i.job_id, i.attempt) == key
                   and not (hung is not None and evidence_start(i) >= hung)]
        run.busy |= {(i.job_id, i.attempt) for i in crashes} | set(crash.pending)
        run.notes[self.name] = CrashNotes(crash, tuple(stalled))
        return [self.with_dump_evidence(i, run.attempt_context()) for i in crashes]

    def with_dump_evidence(self, incident: Incident, telemetry: Telemetry) -> Incident:
        """A crash whose attempt left flight-recorder dumps: the hang analysis of the survivors'
        dumps (the dead rank wrote none, or never joined the collective the others waited in)
        corroborates the culprit."""
        dumps = latest_dump_set(telemetry.collectives, incident.job_id, incident.attempt)
        if dumps.num_rows == 0 or not incident.culprit_ranks:
            return incident
        placement = placements(
            telemetry.ranks,
            incident.attempt,
            telemetry.process_events,
            telemetry.steps,
            telemetry.heartbeats,
        )
        try:
            report = self.analyzer(dumps, sorted(placement) or None)
        except Exception as exc:  # evidence only: a failing analysis must not lose the crash
            log.warning(
                "hang analysis of the dumps of %s attempt %s failed: %s",
                incident.job_id,
                incident.attempt,
                exc,
            )
            return incident
        culprits = set(getattr(report, "culprit_ranks", ()) or ())
        if not culprits & set(incident.culprit_ranks):
            return incident
        verdict = getattr(
            getattr(report, "verdict", None), "value", getattr(report, "verdict", None)
        )
        reason = getattr(report, "reason", "")
        line = Evidence("collectives", None, f"flight-recorder dumps agree: {verdict}: {reason}")
        evidence = (*incident.evidence[: self.rules.evidence_limit - 1], line)
        confidence = round(min(0.99, incident.confidence + 0.1), 3)
        return dataclasses.replace(incident, evidence=evidence, confidence=confidence)


class HangDetector:
    """Collective hangs: the crash rules' hang triggers (collective timeouts) and the attempts whose
    progress stopped, unless they crashed or are not settled; each suspect's dumps through the hang
    analysis."""

    name = "hang"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        self.attributor = HangAttributor(
            inputs.crash_rules, inputs.catalog, inputs.analyzer, inputs.dump_requester
        )

    def detect(self, run: JobPass) -> list[Incident]:
        notes = run.notes.get(CrashDetector.name)
        if not run.options.hangs or notes is None:
            return []
        suspects: dict[str, HangSuspect] = {}
        for trigger in notes.result.hang_triggers:
            suspect = suspect_from_trigger(
                trigger.job_id, trigger.attempt, trigger.ts, trigger.evidence, run.telemetry.steps
            )
            suspects.setdefault(suspect.incident_id, suspect)
        for suspect in notes.stalled:
            if (suspect.job_id, suspect.attempt) not in run.busy:
                suspects.setdefault(suspect.incident_id, suspect)
        return [
            self.attributor.attribute(suspect, run.telemetry, run.now)
            for incident_id, suspect in suspects.items()
            if incident_id not in run.options.already and incident_id not in run.incidents
            # one failure per attempt: its hang or crash reported before (live), a stall or a
            # timeout of it found later (at another last step) is that failure's aftermath
            and (suspect.job_id, suspect.attempt) not in run.options.reported
        ]

    def detect_attempt(self, run: AttemptPass) -> list[Incident]:
        """The attempt's hang triggers, and its stalled progress unless it crashed or is not
        settled; each suspect through the hang analysis of the attempt's flight-recorder entries."""
        notes = run.notes.get(CrashDetector.name)
        if notes is None:
            return []
        key = run.key
        suspects: dict[str, HangSuspect] = {}
        for trigger in notes.result.hang_triggers:
            if (trigger.job_id, trigger.attempt) == key:
                suspect = suspect_from_trigger(trigger.job_id, trigger.attempt, trigger.ts,
                                               trigger.evidence, run.context.steps)
                suspects.setdefault(suspect.incident_id, suspect)
        if key not in run.busy:
            for suspect in notes.stalled:
                suspects.setdefault(suspect.incident_id, suspect)
        return [self.attributor.attribute(suspect, run.attempt_context(), run.now)
                for incident_id, suspect in suspects.items() if incident_id not in run.incidents]


class StragglerSlowdowns:
    """Stragglers; a slowdown that begins after its attempt's failure began is its aftermath, not
    reported.
    """

    name = "straggler"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        self.detector = StragglerDetector(inputs.thresholds.straggler)

    def detect(self, run: JobPass) -> list[Incident]:
        if not run.options.stragglers:
            return []
        ended = attempt_failure_starts(run.telemetry, run.incidents.values(), run.failed)
        return without_follow_ons(
            self.detector.attribute(run.telemetry, run.now, run.options.straggler_last_steps), ended
        )

    def detect_attempt(self, run: AttemptPass) -> list[Incident]:
        """The attempt's slowdowns, scored over its step rows chunk by chunk, less those that begin
        after the attempt's failure began (a crash found so far, a teardown, an agent's exit)."""
        ended = attempt_failure_starts(run.context, run.incidents.values(), None)
        slow = self.detector.attribute_attempt(run.context, run.job, run.attempt, run.step_columns,
                                               run.straggler_chunks(), run.now,
                                               placement_rows=run.attempt_digest())
        return without_follow_ons(slow, ended)


class LossDetector:
    """The numbers went bad while the job ran on: a loss that turned NaN or inf (loss.py), a
    replica whose parameter digest differs, a rank whose gradient norm is a persistent outlier, a
    loss spike that diverges or repeats (numerics.py). One incident per attempt: the first bad
    signal (a localized one before a job-wide one at the same step)."""

    name = "loss"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        self.monitor = LossMonitor(inputs.thresholds.loss)
        self.judge = NumericsJudge(inputs.thresholds.loss)

    def detect(self, run: JobPass) -> list[Incident]:
        return [
            i
            for i in first_per_attempt(self._found(run.telemetry, run.now))
            if i.incident_id not in run.options.already
        ]

    def detect_attempt(self, run: AttemptPass) -> list[Incident]:
        """The attempt's first bad signal: its step rows that carry a loss, the heartbeats, the
        numerics rows of this attempt and the ones before it."""
        found = self._found(run.loss_window(), run.now)
        return [i for i in first_per_attempt(found) if (i.job_id, i.attempt) == run.key]

    def _found(self, telemetry: Telemetry, now: dt.datetime) -> list[Incident]:
        """Both halves' incidents, less what an every-rank NaN held for the numerics rows of its
        step (numerics.py awaits_origin) would hide: from that step on, nothing of the attempt
        is decided yet."""
        found = self.monitor.attribute(telemetry, now) + self.judge.attribute(telemetry, now)
        held = {
            (i.job_id, i.attempt): i.step
            for i in found
            if i.step is not None and self.judge.awaits_origin(i, telemetry, now)
        }
        return [
            i
            for i in found
            if (i.job_id, i.attempt) not in held
            or (i.step is not None and i.step < held[(i.job_id, i.attempt)])
        ]


def first_per_attempt(found: Iterable[Incident]) -> list[Incident]:
    """Of each attempt's numerics incidents the first bad signal (the most localized one at a
    tie: a node named, else ranks, the fewer the better: where a NaN began before the every-rank
    NaN that the all_reduce made of it)."""
    best: dict[AttemptKey, Incident] = {}

    def order(i: Incident) -> tuple[int, bool, bool, int]:
        ranks = len(i.culprit_ranks)
        return (i.step if i.step is not None else -1, not i.culprit_nodes, not ranks, ranks)

    for incident in found:
        key = (incident.job_id, incident.attempt)
        held = best.get(key)
        if held is None or order(incident) < order(held):
            best[key] = incident
    return list(best.values())


class HealthDetector:
    """Critical GPU events (row-remap failure, DBE, GPU lost, recovery action, leave-the-job XIDs)
    that no crash or hang explains: a node to drain before it fails a job."""

    name = "health"
    scope = Scope.STORE

    def __init__(self, inputs: DetectorInputs) -> None:
        self.monitor = HealthMonitor(inputs.thresholds.health, inputs.crash_rules, inputs.catalog)

    def detect(self, run: StorePass) -> list[Incident]:
        return self.monitor.attribute(
            run.gpu_events, run.failures, run.now, settled_before=run.settled_before
        )


for _detector in (CrashDetector, HangDetector, StragglerSlowdowns, LossDetector, HealthDetector):
    register(_detector.name, _detector)
