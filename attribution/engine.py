"""The attribution engine: telemetry -> incidents, as a batch pass over a store or live, tailing new segments.

`attribute(store, job=None, now=None)` reads a store and returns every incident its telemetry supports (crashes,
collective hangs, stragglers); `write_new_incidents` adds the ones not in the incidents table yet. The live
follower that tails a store is attribution/follow.py. Incident ids are deterministic
(Incident.make_id over what identifies the failure), so a batch re-run, a restarted follower and a follower racing
a batch pass all agree on what was already reported. Every written incident gets a LagRecord: when the segment
that completed its evidence became visible, and when the incident row did.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable

import pandas as pd

from faultlens.attribution.detectors.base import (
    REGISTRY,
    Detector,
    DetectorInputs,
    JobOptions,
    JobPass,
    Scope,
    StorePass,
)
from faultlens.attribution.detectors.builtin import (
    attempt_failure_starts,
    evidence_start,
    hung_since,
    without_follow_ons,
)
from faultlens.attribution.detectors.progress import DumpRequester, HangAnalyzer, HangSuspect, suspect_from_trigger
from faultlens.attribution.hardware import XidCatalogLike, default_xid_catalog
from faultlens.attribution.incident import Incident
from faultlens.attribution.memory import release_freed_memory
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import (
    Telemetry,
    job_as_of,
    list_jobs,
    load_from_store,
    to_frame,
)
from faultlens.attribution.reading.windows import JobWindows, store_jobs
from faultlens.attribution.rules import CrashRules, Thresholds, load_crash_rules, load_thresholds
from faultlens.collectors.store.layout import StoreLocation
from faultlens.collectors.store.sink import SegmentSink

log = logging.getLogger(__name__)

def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


#: the JOB detectors the windowed batch pass (Engine.run_windows) knows how to run attempt by attempt; an engine
#: with any other set runs each job whole
WINDOWED_DETECTORS = ("crash", "hang", "straggler", "loss")


class Engine:
    """The registered detectors together (attribution/detectors/base.py), in their order: crash first (a crashed
    attempt is not also a hang), then hangs, stragglers and losses per job; GPU health over every node last."""

    def __init__(self, *, crash_rules: CrashRules | None = None, thresholds: Thresholds | None = None,
                 catalog: XidCatalogLike | None = None, analyzer: HangAnalyzer | None = None,
                 dump_requester: DumpRequester | None = None, detectors: Iterable[str] | None = None) -> None:
        self.crash_rules = crash_rules or load_crash_rules()
        self.thresholds = thresholds or load_thresholds()
        self.catalog = catalog if catalog is not None else default_xid_catalog()
        inputs = DetectorInputs(self.crash_rules, self.thresholds, self.catalog, analyzer, dump_requester)
        self.detectors = REGISTRY.build(inputs, detectors)

    def detector(self, name: str) -> Detector:
        """The built detector registered as `name` (KeyError when this engine has none by that name)."""
        for detector in self.detectors:
            if detector.name == name:
                return detector
        raise KeyError(name)

    def run_job(self, telemetry: Telemetry, now: dt.datetime, as_of: dt.datetime | None, *,
                settled: Callable[[str | None, int | None], bool] | None = None,
                failure_seen: Callable[[str | None, int | None], dt.datetime | None] | None = None,
                already: set[str] | frozenset[str] = frozenset(), hangs: bool = True,
                stragglers: bool = True, straggler_last_steps: int | None = None,
                hung: dict[tuple[str | None, int | None], dt.datetime] | None = None,
                failed: dict[tuple[str | None, int | None], dt.datetime] | None = None) -> list[Incident]:
        """Incidents of the telemetry of one job. `already` holds incident ids reported before: their hang
        suspects are not analysed again (no second dump request). `hung`: attempts already reported hung (live
        mode) and since when; a failure after that is the hang's ending (a watchdog abort, a supervisor's
        kill), not a new crash. `failed`: attempts already reported crashed (live mode) and since when; a
        slowdown that begins after that is the failure's consequence (a survivor waiting on the dead rank, the
        teardown), not a new fault. `failure_seen` (live mode): when a failure of an attempt was first seen."""
        options = JobOptions(settled=settled, failure_seen=failure_seen, already=frozenset(already), hangs=hangs,
                             stragglers=stragglers, straggler_last_steps=straggler_last_steps)
        run = JobPass(telemetry, now, as_of, options, hung=dict(hung or {}), failed=dict(failed or {}))
        for detector in self.detectors:
            if detector.scope is Scope.JOB:
                run.add(detector.detect(run))
        return list(run.incidents.values())

    def run_store_detectors(self, gpu_events: pd.DataFrame, failures: Iterable[Incident], now: dt.datetime,
                            settled_before: dt.datetime | None = None) -> list[Incident]:
        """The STORE detectors (GPU health) over every node's events, with the failures that may explain them."""
        run = StorePass(gpu_events, now, tuple(failures), settled_before)
        found: dict[str, Incident] = {}
        for detector in self.detectors:
            if detector.scope is Scope.STORE:
                for incident in detector.detect(run):
                    found.setdefault(incident.incident_id, incident)
        return list(found.values())

    def run_windows(self, windows: JobWindows, now: dt.datetime, as_of: dt.datetime | None) -> list[Incident]:
        """Incidents of one job read attempt by attempt (a batch pass in bounded memory): what run_job finds in
        the whole job's telemetry. Crash and hang attribution read the job's small tables and the steps digest
        (see attribution/reading/windows.py); per attempt, progress and loss detection read the few step rows their
        answers depend on (DuckDB picks them) and straggler scoring reads the attempt's rows in chunks of steps,
        so memory holds one chunk's rows and the attempt's (step x rank) frames, never the attempt's rows."""
        job_detectors = {d.name for d in self.detectors if d.scope is Scope.JOB}
        if job_detectors != set(WINDOWED_DETECTORS):  # a subset, or a detector this pass does not know: whole job
            return self.run_job(load_from_store(windows.store, windows.job).for_job(windows.job), now, as_of)
        context = windows.context
        crash_detector = self.detector("crash")
        crash = crash_detector.attributor.attribute(context, now, None)
        keys = [(i.job_id, i.attempt) for i in crash.incidents] + list(crash.pending) + \
            [(t.job_id, t.attempt) for t in crash.hang_triggers]
        if not windows.windowable or any(job != windows.job or attempt is None for job, attempt in keys):
            whole = load_from_store(windows.store, windows.job).for_job(windows.job)
            return self.run_job(whole, now, as_of)
        slack = self.crash_rules.signal_notice_slack_s
        pending = set(crash.pending)
        incidents: dict[str, Incident] = {}
        for attempt in sorted(set(windows.attempts) | {attempt for _, attempt in keys if attempt is not None}):
            key = (windows.job, attempt)
            telemetry = windows.attempt_context(attempt)  # the digest, and this attempt's flight-recorder entries
            stalled = [s for s in crash_detector.progress.suspects(windows.progress_window(attempt), as_of)
                       if (s.job_id, s.attempt) == key] if as_of is not None else []
            hung = hung_since(stalled, slack).get(key)  # progress stopped for longer than allowed before a failure
            crashes = [i for i in crash.incidents if (i.job_id, i.attempt) == key
                       and not (hung is not None and evidence_start(i) >= hung)]
            for incident in crashes:
                incidents.setdefault(incident.incident_id, crash_detector.with_dump_evidence(incident, telemetry))
            suspects: dict[str, HangSuspect] = {}
            for trigger in crash.hang_triggers:
                if (trigger.job_id, trigger.attempt) == key:
                    suspect = suspect_from_trigger(trigger.job_id, trigger.attempt, trigger.ts, trigger.evidence,
                                                   context.steps)
                    suspects.setdefault(suspect.incident_id, suspect)
            if not crashes and key not in pending:
                for suspect in stalled:
                    suspects.setdefault(suspect.incident_id, suspect)
            for incident_id, suspect in suspects.items():
                if incident_id not in incidents:
                    incidents[incident_id] = self.detector("hang").attributor.attribute(suspect, telemetry, now)
            ended = attempt_failure_starts(context, crashes, None)
            slow = self.detector("straggler").detector.attribute_attempt(
                context, windows.job, attempt, windows.step_columns, windows.straggler_chunks(attempt), now,
                placement_rows=windows.attempt_digest(attempt))
            for incident in without_follow_ons(slow, ended):
                incidents.setdefault(incident.incident_id, incident)
            for incident in self.detector("loss").monitor.attribute(windows.loss_window(attempt), now):
                if (incident.job_id, incident.attempt) == key:
                    incidents.setdefault(incident.incident_id, incident)
            release_freed_memory()  # this attempt's frames go before the next attempt's are read
        return list(incidents.values())

    def run_store(self, store: Store, job: str | None, now: dt.datetime, as_of: dt.datetime | None) -> list[Incident]:
        """A batch pass over a store, job by job and attempt by attempt (run_windows): the incidents `run` finds
        in the store's whole telemetry, with one attempt's step rows in memory at a time. `as_of`: the end of
        the observation; None: each job up to its own newest telemetry (a replay)."""
        jobs = [job] if job is not None else store_jobs(store)
        found: dict[str, Incident] = {}
        gpu_events = None
        try:
            for name in jobs:
                store.scope_to_job(name)  # this job's segments only: a store of many jobs is not read per job
                newest = job_as_of(store, name)
                windows = JobWindows.open(store, name, newest, warmup_steps=self.thresholds.progress.warmup_steps)
                if job is not None:
                    gpu_events = windows.context.gpu_events
                for incident in self.run_windows(windows, now, as_of if as_of is not None else newest):
                    found.setdefault(incident.incident_id, incident)
        finally:
            store.scope_to_job(None)
        if gpu_events is None:  # every node's events: health incidents concern nodes without a job too
            gpu_events = to_frame(store.query("SELECT * FROM gpu_events"), "gpu_events")
        for incident in self.run_store_detectors(gpu_events, found.values(), now):
            found.setdefault(incident.incident_id, incident)
        return sorted(found.values(), key=lambda i: (i.first_signal_ts, i.incident_id))

    def run(self, telemetry: Telemetry, now: dt.datetime, as_of: dt.datetime | dict[str, dt.datetime] | None = None,
            **options: object) -> list[Incident]:
        """Incidents of every job in `telemetry` (each job on its own rows)."""
        jobs = telemetry.jobs or tuple(list_jobs(telemetry.ranks, telemetry.steps, telemetry.process_events,
                                                 telemetry.heartbeats))
        found: dict[str, Incident] = {}
        for job in jobs:
            job_as_of = as_of.get(job) if isinstance(as_of, dict) else as_of
            for incident in self.run_job(telemetry.for_job(job), now, job_as_of, **options):  # type: ignore[arg-type]
                found.setdefault(incident.incident_id, incident)
        for incident in self.run_store_detectors(telemetry.gpu_events, found.values(), now):
            found.setdefault(incident.incident_id, incident)
        return sorted(found.values(), key=lambda i: (i.first_signal_ts, i.incident_id))


def _open(store: Store | str | StoreLocation, job: str | None) -> tuple[Store, bool]:
    if isinstance(store, Store):
        return store, False
    return Store(store, jobs=[job] if job is not None else None), True


def attribute(store: Store | str | StoreLocation, job: str | None = None, now: dt.datetime | None = None, *,
              engine: Engine | None = None, windowed: bool = True) -> list[Incident]:
    """A batch pass: every incident the store's telemetry supports. `now` is the time of the pass (detection
    time and the end of the observation for hang detection); by default each job is observed up to its newest
    telemetry (a replay), and detection time is the wall clock. The pass reads each job attempt by attempt
    (Engine.run_store: memory bounded by one attempt, not the store); windowed=False reads the store whole
    (the reference the windowed pass is checked against)."""
    engine = engine or Engine()
    opened, owned = _open(store, job)
    try:
        if windowed:
            return engine.run_store(opened, job, now or utc_now(), now)
        telemetry = load_from_store(opened, job)
        as_of: dt.datetime | dict[str, dt.datetime] = now if now is not None else telemetry.as_of
        return engine.run(telemetry, now or utc_now(), as_of)  # GPU samples are read on demand: store open
    finally:
        if owned:
            opened.close()


def existing_incident_ids(store: Store) -> set[str]:
    table = store.query("SELECT DISTINCT incident_id FROM incidents WHERE incident_id IS NOT NULL")
    return set(table.column("incident_id").to_pylist()) if table.num_rows else set()


def existing_failures(store: Store) -> list[Incident]:
    """Crash and hang incidents already in the store (they explain GPU events: no health incident for those)."""
    table = store.query("SELECT * FROM incidents WHERE class IN ('crash', 'collective_hang')")
    seen: dict[str, Incident] = {}
    for row in table.to_pylist():
        seen.setdefault(row["incident_id"], Incident.from_row(row))
    return list(seen.values())


def write_new_incidents(store: Store | str | StoreLocation, incidents: Iterable[Incident],
                        known: set[str] | None = None, sink: SegmentSink | None = None) -> list[Incident]:
    """Write the incidents whose ids are not in the incidents table (or in `known`, which gets the new ids) yet;
    returns those written. They are visible when this returns."""
    opened, owned = _open(store, None)
    try:
        known = known if known is not None else existing_incident_ids(opened)  # updated in place
        fresh = []
        for incident in incidents:
            if incident.incident_id not in known:
                known.add(incident.incident_id)
                fresh.append(incident)
        if fresh:
            own_sink = sink is None
            sink = sink or SegmentSink(opened.location, flush_rows=1_000_000, flush_age_s=3600.0)
            sink.write("incidents", [i.to_row() for i in fresh])
            sink.flush("incidents")
            if own_sink:
                sink.close()
        return fresh
    finally:
        if owned:
            opened.close()
