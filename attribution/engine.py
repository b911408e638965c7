"""The attribution engine: telemetry -> incidents, as a batch pass over a store or live, tailing new segments.

`attribute(store, job=None, now=None)` reads a store and returns every incident its telemetry supports (crashes,
collective hangs, stragglers); `write_new_incidents` adds the ones not in the incidents table yet. `Follower`
tails a store: each poll lists it again (Store.refresh), reads only the new segments, runs the detectors over a
bounded in-memory window, and writes each new incident once through a SegmentSink. Incident ids are deterministic
(Incident.make_id over what identifies the failure), so a batch re-run, a restarted follower and a follower racing
a batch pass all agree on what was already reported. Every written incident gets a LagRecord: when the segment
that completed its evidence became visible, and when the incident row did.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from attribution.crash import CrashAttributor, HangTrigger
from attribution.hardware import XidCatalogLike, default_xid_catalog
from attribution.incident import Incident
from attribution.progress import (
    DumpRequester,
    HangAnalyzer,
    HangAttributor,
    HangSuspect,
    ProgressMonitor,
    suspect_from_trigger,
)
from attribution.rules import CrashRules, Thresholds, load_crash_rules, load_thresholds
from attribution.store import Store
from attribution.straggler import StragglerDetector
from attribution.tail import NewSegment, SegmentTail
from attribution.telemetry import SAMPLE_COLUMNS, Telemetry, list_jobs, load_from_store, to_frame
from collectors.layout import StoreLocation, safe_value
from collectors.sink import SegmentSink

log = logging.getLogger(__name__)

_JOB_PART = re.compile(r"/job=([^/]+)/")
TAILED_TABLES = ("ranks", "steps", "process_events", "gpu_events", "gpu_samples", "collectives")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Engine:
    """The detectors together: crash first (a crashed attempt is not also a hang), then hangs, then stragglers."""

    def __init__(self, *, crash_rules: CrashRules | None = None, thresholds: Thresholds | None = None,
                 catalog: XidCatalogLike | None = None, analyzer: HangAnalyzer | None = None,
                 dump_requester: DumpRequester | None = None) -> None:
        self.crash_rules = crash_rules or load_crash_rules()
        self.thresholds = thresholds or load_thresholds()
        self.catalog = catalog if catalog is not None else default_xid_catalog()
        self.crash = CrashAttributor(self.crash_rules, self.catalog)
        self.progress = ProgressMonitor(self.thresholds.progress)
        self.hang = HangAttributor(self.crash_rules, self.catalog, analyzer, dump_requester)
        self.straggler = StragglerDetector(self.thresholds.straggler)

    def run_job(self, telemetry: Telemetry, now: dt.datetime, as_of: dt.datetime | None, *,
                settled: Callable[[str | None, int | None], bool] | None = None,
                already: set[str] | frozenset[str] = frozenset(), hangs: bool = True,
                stragglers: bool = True) -> list[Incident]:
        """Incidents of the telemetry of one job. `already` holds incident ids reported before: their hang
        suspects are not analysed again (no second dump request)."""
        crash = self.crash.attribute(telemetry, now, settled)
        incidents: dict[str, Incident] = {i.incident_id: i for i in crash.incidents}
        if hangs:
            busy = {(i.job_id, i.attempt) for i in crash.incidents} | set(crash.pending)
            suspects: dict[str, HangSuspect] = {}
            for trigger in crash.hang_triggers:
                suspect = self._from_trigger(trigger, telemetry)
                suspects.setdefault(suspect.incident_id, suspect)
            if as_of is not None:
                for suspect in self.progress.suspects(telemetry, as_of):
                    if (suspect.job_id, suspect.attempt) not in busy:
                        suspects.setdefault(suspect.incident_id, suspect)
            for incident_id, suspect in suspects.items():
                if incident_id in already or incident_id in incidents:
                    continue
                incidents[incident_id] = self.hang.attribute(suspect, telemetry, now)
        if stragglers:
            for incident in self.straggler.attribute(telemetry, now):
                incidents.setdefault(incident.incident_id, incident)
        return list(incidents.values())

    @staticmethod
    def _from_trigger(trigger: HangTrigger, telemetry: Telemetry) -> HangSuspect:
        return suspect_from_trigger(trigger.job_id, trigger.attempt, trigger.ts, trigger.evidence, telemetry.steps)

    def run(self, telemetry: Telemetry, now: dt.datetime, as_of: dt.datetime | dict[str, dt.datetime] | None = None,
            **options: object) -> list[Incident]:
        """Incidents of every job in `telemetry` (each job on its own rows)."""
        jobs = telemetry.jobs or tuple(list_jobs(telemetry.ranks, telemetry.steps, telemetry.process_events))
        found: dict[str, Incident] = {}
        for job in jobs:
            job_as_of = as_of.get(job) if isinstance(as_of, dict) else as_of
            for incident in self.run_job(telemetry.for_job(job), now, job_as_of, **options):  # type: ignore[arg-type]
                found.setdefault(incident.incident_id, incident)
        return sorted(found.values(), key=lambda i: (i.first_signal_ts, i.incident_id))


def _open(store: Store | str | StoreLocation, job: str | None) -> tuple[Store, bool]:
    if isinstance(store, Store):
        return store, False
    return Store(store, jobs=[job] if job is not None else None), True


def attribute(store: Store | str | StoreLocation, job: str | None = None, now: dt.datetime | None = None, *,
              engine: Engine | None = None) -> list[Incident]:
    """A batch pass: every incident the store's telemetry supports. `now` is the time of the pass (detection
    time and the end of the observation for hang detection); by default each job is observed up to its newest
    telemetry (a replay), and detection time is the wall clock."""
    engine = engine or Engine()
    opened, owned = _open(store, job)
    try:
        telemetry = load_from_store(opened, job)
        as_of: dt.datetime | dict[str, dt.datetime] = now if now is not None else telemetry.as_of
        return engine.run(telemetry, now or utc_now(), as_of)  # GPU samples are read on demand: store open
    finally:
        if owned:
            opened.close()


def existing_incident_ids(store: Store) -> set[str]:
    table = store.query("SELECT DISTINCT incident_id FROM incidents WHERE incident_id IS NOT NULL")
    return set(table.column("incident_id").to_pylist()) if table.num_rows else set()


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


# ---------------------------------------------------------------- follow mode


@dataclass(frozen=True)
class LagRecord:
    """How long one incident took: from the segment that completed its evidence becoming visible to the
    incident row becoming visible (wall-clock seconds)."""

    incident_id: str
    segment: str | None
    landed_at: float | None
    seen_at: float
    written_at: float

    @property
    def lag_s(self) -> float | None:
        return None if self.landed_at is None else self.written_at - self.landed_at


@dataclass
class FollowStats:
    polls: int = 0
    segments_read: int = 0
    rows_read: int = 0
    incidents_written: int = 0
    lag: list[LagRecord] = field(default_factory=list)


class Follower:
    """Live attribution: tails new segments and writes each new incident exactly once."""

    def __init__(self, store: str | StoreLocation, *, job: str | None = None, engine: Engine | None = None,
                 sink: SegmentSink | None = None, clock: Callable[[], dt.datetime] = utc_now,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.engine = engine or Engine()
        self.config = self.engine.thresholds.engine
        self.job = job
        self.store = Store(store, jobs=[job] if job is not None else None)
        self.incident_store = Store(store) if job is not None else self.store
        self.sink = sink or SegmentSink(self.store.location, flush_rows=1_000_000, flush_age_s=3600.0)
        self.tail = SegmentTail(self.store, TAILED_TABLES, retain_s=self.config.retain_s,
                                max_rows=self.config.max_rows_per_table)
        self.clock = clock
        self.monotonic = monotonic
        self.wall = wall
        self.known = existing_incident_ids(self.incident_store)
        self.stats = FollowStats()
        self._arrivals: dict[tuple[str | None, int | None], float] = {}
        self._frames: dict[str, pd.DataFrame] = {}
        self._stale: set[str] = set(TAILED_TABLES)  # tables whose frames must be rebuilt
        self._steps_changed = False
        self._last_progress = float("-inf")
        self._last_straggler = float("-inf")
        self._pending_crash = False
        self._stop = threading.Event()
        self._unclaimed: dict[str, NewSegment] = {}
        self._seen_at: dict[str, float] = {}

    # ------------------------------------------------------------ one poll

    def poll_once(self) -> list[Incident]:
        """Read new segments, attribute, write new incidents; returns the incidents written by this poll."""
        arrived = self.tail.poll()
        self.stats.polls += 1
        self.stats.segments_read += len(arrived)
        self.stats.rows_read += sum(s.rows for s in arrived)
        seen_at = self.wall()
        tick = self.monotonic()
        self._remember(arrived, seen_at)
        changed = {segment.table for segment in arrived}
        self._stale |= changed
        self._steps_changed |= "steps" in changed
        if "process_events" in changed:
            self._note_arrivals(arrived)
        crash_due = bool({"process_events", "gpu_events"} & changed) or self._pending_crash
        progress_due = tick - self._last_progress >= self.config.progress_check_s or bool(
            {"steps", "process_events", "collectives"} & changed)
        straggler_due = self._steps_changed and tick - self._last_straggler >= self.config.straggler_check_s
        if not (crash_due or progress_due or straggler_due):
            return []
        telemetry = self._telemetry()
        now = self.clock()
        found: list[Incident] = []
        for job in telemetry.jobs:
            found.extend(self.engine.run_job(
                telemetry.for_job(job), now, now, settled=self._settled, already=self.known,
                hangs=progress_due or crash_due, stragglers=straggler_due))
        if crash_due:
            # an attempt whose settle time ends after this evaluation began may have been skipped: look again
            self._arrivals = {key: arrived for key, arrived in self._arrivals.items()
                              if arrived + self.config.crash_settle_s >= tick}
            self._pending_crash = bool(self._arrivals)
        if progress_due:
            self._last_progress = tick
        if straggler_due:
            self._last_straggler = tick
            self._steps_changed = False
        written = write_new_incidents(self.incident_store, found, self.known, self.sink)
        if written:
            written_at = self.wall()
            for incident in written:
                trigger = self._unclaimed.pop(safe_value(incident.job_id or "_node"), None)
                self.stats.lag.append(LagRecord(incident.incident_id, trigger.path if trigger else None,
                                                trigger.landed_at if trigger else None,
                                                trigger_seen if trigger and (trigger_seen := self._seen_at.get(
                                                    trigger.path)) else seen_at, written_at))
            self.stats.incidents_written += len(written)
        return written

    def _remember(self, arrived: Sequence[NewSegment], seen_at: float) -> None:
        """The newest segment of each job not yet followed by an incident: what an incident's lag is measured
        from (an incident found by the passing of time, a hang, has none unless data of its job just landed)."""
        for segment in arrived:
            if segment.table == "gpu_samples" or segment.landed_at is None:
                continue
            match = _JOB_PART.search(segment.path)
            job = match.group(1) if match else "_node"
            current = self._unclaimed.get(job)
            if current is None or (current.landed_at or 0.0) <= segment.landed_at:
                self._unclaimed[job] = segment
                self._seen_at[segment.path] = seen_at

    def _note_arrivals(self, arrived: Sequence[object]) -> None:
        events = self.tail.table("process_events")
        if events.num_rows == 0:
            return
        tick = self.monotonic()
        new_rows = sum(s.rows for s in arrived if s.table == "process_events")  # type: ignore[attr-defined]
        recent = events.slice(max(0, events.num_rows - new_rows))
        jobs = recent.column("job_id").to_pylist()
        attempts = recent.column("attempt").to_pylist()
        for key in set(zip(jobs, attempts, strict=True)):
            self._arrivals[key] = tick

    def _settled(self, job: str | None, attempt: int | None) -> bool:
        arrived = self._arrivals.get((job, attempt))
        return arrived is None or self.monotonic() - arrived >= self.config.crash_settle_s

    def _telemetry(self) -> Telemetry:
        for name in TAILED_TABLES:
            if name == "collectives" or (name not in self._stale and name in self._frames):
                continue
            table = self.tail.table(name)
            if name == "gpu_samples":
                self._frames[name] = to_frame(table, name)[list(SAMPLE_COLUMNS)]
            else:
                self._frames[name] = to_frame(table, name)
        self._stale.clear()
        samples = self._frames["gpu_samples"]

        def fetch(nodes: Sequence[str], start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
            if samples.empty:
                return samples
            mask = samples["node"].isin(list(nodes)) & (samples["ts"] >= start) & (samples["ts"] <= end)
            return samples[mask]

        frames = self._frames
        jobs = tuple(list_jobs(frames["ranks"], frames["steps"], frames["process_events"]))
        if self.job is not None:
            jobs = tuple(j for j in jobs if j == self.job)
        collectives: pa.Table = self.tail.table("collectives")
        return Telemetry(ranks=frames["ranks"], steps=frames["steps"], process_events=frames["process_events"],
                         gpu_events=frames["gpu_events"], collectives=collectives, fetch_samples=fetch, jobs=jobs)

    # ------------------------------------------------------------ loop

    def run(self, *, interval: float | None = None, on_incident: Callable[[Incident], None] | None = None,
            max_polls: int | None = None) -> None:
        """Poll until stop() (or max_polls); `on_incident` sees each written incident."""
        interval = interval if interval is not None else self.config.poll_interval_s
        polls = 0
        while not self._stop.is_set():
            started = self.monotonic()
            for incident in self.poll_once():
                if on_incident is not None:
                    on_incident(incident)
            polls += 1
            if max_polls is not None and polls >= max_polls:
                break
            self._stop.wait(max(0.0, interval - (self.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        self.sink.close()
        self.store.close()
        if self.incident_store is not self.store:
            self.incident_store.close()
