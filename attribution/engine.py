"""The attribution engine: telemetry -> incidents, as a batch pass over a store or live, tailing new
segments.

`attribute(store, job=None, now=None)` reads a store and returns every incident its telemetry
supports (crashes, collective hangs, stragglers); `write_new_incidents` adds the ones not in the
incidents table yet. The live follower that tails a store is attribution/follow.py. Incident ids are
deterministic (Incident.make_id over what identifies the failure), so a batch re-run, a restarted
follower and a follower racing a batch pass all agree on what was already reported. Every written
incident gets a LagRecord: when the segment that completed its evidence became visible, and when the
incident row did.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable

import pandas as pd

from faultlens.attribution.detectors import builtin  # noqa: F401  (registers the built-in ones)
from faultlens.attribution.detectors.base import (
    REGISTRY,
    AttemptPass,
    Detector,
    DetectorInputs,
    DetectorRegistry,
    JobOptions,
    JobPass,
    Scope,
    StorePass,
    WindowedPass,
    attempt_step,
    prepare_step,
)
from faultlens.attribution.detectors.progress import DumpRequester, HangAnalyzer
from faultlens.attribution.hardware import XidCatalogLike, default_xid_catalog
from faultlens.attribution.incident import Incident
from faultlens.attribution.memory import release_freed_memory
from faultlens.attribution.reading.queries import (  # noqa: F401 (existing_failures: re-exported)
    existing_failures,
    existing_incident_ids,
)
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


class Engine:
    """The registered detectors together (attribution/detectors/base.py), in their order: crash
    first (a crashed attempt is not also a hang), then hangs, stragglers and losses per job; GPU
    health over every node last. `registry`: where they come from (REGISTRY, the built-in ones, by
    default; a REGISTRY.copy() with one more registered adds an incident class); `detectors`: the
    names of those to build (all by default). A JOB detector the windowed batch pass cannot run is
    refused here (attempt_step)."""

    def __init__(
        self,
        *,
        crash_rules: CrashRules | None = None,
        thresholds: Thresholds | None = None,
        catalog: XidCatalogLike | None = None,
        analyzer: HangAnalyzer | None = None,
        dump_requester: DumpRequester | None = None,
        detectors: Iterable[str] | None = None,
        registry: DetectorRegistry | None = None,
    ) -> None:
        self.crash_rules = crash_rules or load_crash_rules()
        self.thresholds = thresholds or load_thresholds()
        self.catalog = catalog if catalog is not None else default_xid_catalog()
        inputs = DetectorInputs(
            self.crash_rules, self.thresholds, self.catalog, analyzer, dump_requester
        )
        self.detectors = (registry if registry is not None else REGISTRY).build(inputs, detectors)
        for detector in self.detectors:
            if detector.scope is Scope.JOB:
                attempt_step(detector)  # refuses one with neither detect_attempt nor a window

    def detector(self, name: str) -> Detector:
        """The built detector registered as `name` (KeyError when this engine has none by that
        name).
        """
        for detector in self.detectors:
            if detector.name == name:
                return detector
        raise KeyError(name)

    def run_job(
        self,
        telemetry: Telemetry,
        now: dt.datetime,
        as_of: dt.datetime | None,
        *,
        settled: Callable[[str | None, int | None], bool] | None = None,
        failure_seen: Callable[[str | None, int | None], dt.datetime | None] | None = None,
        already: set[str] | frozenset[str] = frozenset(),
        hangs: bool = True,
        stragglers: bool = True,
        straggler_last_steps: int | None = None,
        hung: dict[tuple[str | None, int | None], dt.datetime] | None = None,
        failed: dict[tuple[str | None, int | None], dt.datetime] | None = None,
    ) -> list[Incident]:
        """Incidents of the telemetry of one job. `already` holds incident ids reported before:
        their hang suspects are not analysed again (no second dump request). `hung`: attempts
        already reported hung (live mode) and since when; a failure after that is the hang's ending
        (a watchdog abort, a supervisor's kill), not a new crash. `failed`: attempts already
        reported crashed (live mode) and since when; a slowdown that begins after that is the
        failure's consequence (a survivor waiting on the dead rank, the teardown), not a new fault.
        `failure_seen` (live mode): when a failure of an attempt was first seen."""
        options = JobOptions(
            settled=settled,
            failure_seen=failure_seen,
            already=frozenset(already),
            reported=frozenset(hung or {}) | frozenset(failed or {}),
            hangs=hangs,
            stragglers=stragglers,
            straggler_last_steps=straggler_last_steps,
        )
        run = JobPass(
            telemetry, now, as_of, options, hung=dict(hung or {}), failed=dict(failed or {})
        )
        for detector in self.detectors:
            if detector.scope is Scope.JOB:
                run.add(detector.detect(run))
        return list(run.incidents.values())

    def run_store_detectors(
        self,
        gpu_events: pd.DataFrame,
        failures: Iterable[Incident],
        now: dt.datetime,
        settled_before: dt.datetime | None = None,
    ) -> list[Incident]:
        """The STORE detectors (GPU health) over every node's events, with the failures that may
        explain them.
        """
        run = StorePass(gpu_events, now, tuple(failures), settled_before)
        found: dict[str, Incident] = {}
        for detector in self.detectors:
            if detector.scope is Scope.STORE:
                for incident in detector.detect(run):
                    found.setdefault(incident.incident_id, incident)
        return list(found.values())

    def run_windows(self, windows: JobWindows, now: dt.datetime,
                    as_of: dt.datetime | None) -> list[Incident]:
        """Incidents of one job read attempt by attempt (a batch pass in bounded memory): what
        run_job finds in the whole job's telemetry. Every JOB detector, in registration order,
        prepares the job where it has a step for that (`prepare_job`: the crash attribution over the
        job's small tables and steps digest), then runs on each attempt (base.attempt_step) over the
        windows of that attempt its answers depend on (attribution/reading/windows.py: the few step
        rows that progress and loss detection read, DuckDB picking them; the attempt's rows in
        chunks of steps for straggler scoring), so memory holds one chunk's rows and the attempt's
        (step x rank) frames, never the attempt's rows. A job is read whole only for its data: rows
        of no attempt, or evidence a prepare step finds in no attempt window (never for which
        detectors run)."""
        if not windows.windowable:
            return self._run_whole(windows, now, as_of, "rows of no attempt")
        job_detectors = [d for d in self.detectors if d.scope is Scope.JOB]
        steps = [attempt_step(d) for d in job_detectors]
        run = WindowedPass(windows, now, as_of)
        for detector in job_detectors:
            prepare = prepare_step(detector)
            if prepare is not None:
                prepare(run)
            if run.whole_job is not None:
                return self._run_whole(windows, now, as_of, run.whole_job)
        for attempt in sorted(run.attempts):
            attempt_pass = AttemptPass(run, attempt)
            for step in steps:
                attempt_pass.add(step(attempt_pass))
            del attempt_pass
            release_freed_memory()  # this attempt's frames go before the next attempt's are read
        return list(run.incidents.values())

    def _run_whole(self, windows: JobWindows, now: dt.datetime, as_of: dt.datetime | None,
                   reason: str) -> list[Incident]:
        """One job with its every row in memory: its data cannot be judged attempt by attempt."""
        log.debug("job %s is read whole: %s", windows.job, reason)
        whole = load_from_store(windows.store, windows.job).for_job(windows.job)
        return self.run_job(whole, now, as_of)

    def run_store(
        self, store: Store, job: str | None, now: dt.datetime, as_of: dt.datetime | None
    ) -> list[Incident]:
        """A batch pass over a store, job by job and attempt by attempt (run_windows): the incidents
        `run` finds in the store's whole telemetry, with one attempt's step rows in memory at a
        time. `as_of`: the end of the observation; None: each job up to its own newest telemetry (a
        replay)."""
        jobs = [job] if job is not None else store_jobs(store)
        found: dict[str, Incident] = {}
        gpu_events = None
        try:
            for name in jobs:
                # this job's segments only: a store of many jobs is not read per job
                store.scope_to_job(name)
                newest = job_as_of(store, name)
                windows = JobWindows.open(
                    store, name, newest, warmup_steps=self.thresholds.progress.warmup_steps
                )
                if job is not None:
                    gpu_events = windows.context.gpu_events
                for incident in self.run_windows(
                    windows, now, as_of if as_of is not None else newest
                ):
                    found.setdefault(incident.incident_id, incident)
        finally:
            store.scope_to_job(None)
        # every node's events: health incidents concern nodes without a job too
        if gpu_events is None:
            gpu_events = to_frame(store.query("SELECT * FROM gpu_events"), "gpu_events")
        for incident in self.run_store_detectors(gpu_events, found.values(), now):
            found.setdefault(incident.incident_id, incident)
        return sorted(found.values(), key=lambda i: (i.first_signal_ts, i.incident_id))

    def run(
        self,
        telemetry: Telemetry,
        now: dt.datetime,
        as_of: dt.datetime | dict[str, dt.datetime] | None = None,
        **options: object,
    ) -> list[Incident]:
        """Incidents of every job in `telemetry` (each job on its own rows)."""
        jobs = telemetry.jobs or tuple(
            list_jobs(
                telemetry.ranks, telemetry.steps, telemetry.process_events, telemetry.heartbeats
            )
        )
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


def attribute(
    store: Store | str | StoreLocation,
    job: str | None = None,
    now: dt.datetime | None = None,
    *,
    engine: Engine | None = None,
    windowed: bool = True,
) -> list[Incident]:
    """A batch pass: every incident the store's telemetry supports. `now` is the time of the pass
    (detection time and the end of the observation for hang detection); by default each job is
    observed up to its newest telemetry (a replay), and detection time is the wall clock. The pass
    reads each job attempt by attempt (Engine.run_store: memory bounded by one attempt, not the
    store); windowed=False reads the store whole (the reference the windowed pass is checked
    against)."""
    engine = engine or Engine()
    opened, owned = _open(store, job)
    try:
        if windowed:
            return engine.run_store(opened, job, now or utc_now(), now)
        telemetry = load_from_store(opened, job)
        as_of: dt.datetime | dict[str, dt.datetime] = now if now is not None else telemetry.as_of
        # GPU samples are read on demand: store open
        return engine.run(telemetry, now or utc_now(), as_of)
    finally:
        if owned:
            opened.close()


def write_new_incidents(
    store: Store | str | StoreLocation,
    incidents: Iterable[Incident],
    known: set[str] | None = None,
    sink: SegmentSink | None = None,
) -> list[Incident]:
    """Write the incidents whose ids are not in the incidents table (or in `known`, which gets the
    new ids) yet; returns those written. They are visible when this returns."""
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
