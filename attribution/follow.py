"""Follow mode: the live attributor. `Follower` tails a store: each poll lists it again, reads only
the new segments (SegmentTail), runs the detectors over a bounded in-memory window, and writes each
new incident once through a SegmentSink. Incident ids are deterministic (Incident.make_id over what
identifies the failure), so a batch re-run, a restarted follower and a follower racing a batch pass
all agree on what was already reported. Every written incident gets a LagRecord: when the segment
that completed its evidence became visible, and when the incident row did.

A follower of one job (`job=`) lists only the partitions its window can hold rows of
(attribution/reading/tail.py PartitionListing: the job's own partitions and the node-level ones of
its nodes, from the window's oldest date on); a follower of the whole store lists every tailed table
whole on each poll. On an object store a follower lists the partitions once and then the landing log
(attribution/reading/landed.py LandingListing): a poll's requests follow what landed since the last
one, not the store's history.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from faultlens.attribution.detectors.builtin import evidence_start
from faultlens.attribution.engine import (
    Engine,
    existing_failures,
    existing_incident_ids,
    utc_now,
    write_new_incidents,
)
from faultlens.attribution.incident import Incident, IncidentClass
from faultlens.attribution.reading.landed import LandingListing
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.tail import NewSegment, PartitionListing, SegmentTail
from faultlens.attribution.reading.telemetry import SAMPLE_COLUMNS, Telemetry, list_jobs, to_frame
from faultlens.collectors.store.layout import StoreLocation, list_segments, safe_value
from faultlens.collectors.store.schema import Role, tables_with
from faultlens.collectors.store.sink import SegmentSink

#: the tables a follower tails (the live window's tables)
TAILED_TABLES = tables_with(Role.TAILED)


def tail_frame(table: pa.Table, name: str) -> pd.DataFrame:
    """A tailed segment's rows as the window's frame (GPU samples: the columns the detectors read).
    """
    frame = to_frame(table, name)
    return frame[list(SAMPLE_COLUMNS)] if name == "gpu_samples" else frame


_JOB_PART = re.compile(r"/job=([^/]+)/")


@dataclass(frozen=True)
class LagRecord:
    """How long one incident took: from the segment that completed its evidence becoming visible to
    the incident row becoming visible (wall-clock seconds)."""

    incident_id: str
    segment: str | None
    landed_at: float | None
    seen_at: float
    written_at: float

    @property
    def lag_s(self) -> float | None:
        return None if self.landed_at is None else self.written_at - self.landed_at


#: process_events kinds that never name a failure of their own: the supervisor's launches and its
#: own signals
_NOT_A_FAILURE_KINDS = ("start", "signal_sent")


def _may_change_a_crash(events: pd.DataFrame) -> pd.Series:
    """Rows that may change a crash's verdict: a failure, an agent killed by a signal (a lost node).
    Not a survivor's echo (is_secondary), the supervisor's own launches and signals, or an agent
    exiting with a code (it exits after reporting its workers' failures: the end of a cascade, not
    news)."""
    keep = ~events["kind"].isin(_NOT_A_FAILURE_KINDS)
    if "is_secondary" in events.columns:
        keep &= ~events["is_secondary"].fillna(False).astype(bool)
    if "signal" in events.columns:
        keep &= ~((events["kind"] == "agent_exit") & events["signal"].isna())
    return keep


@dataclass
class FollowStats:
    polls: int = 0
    segments_read: int = 0
    rows_read: int = 0
    incidents_written: int = 0
    lag: list[LagRecord] = field(default_factory=list)


class Follower:
    """Live attribution: tails new segments and writes each new incident exactly once."""

    def __init__(
        self,
        store: str | StoreLocation,
        *,
        job: str | None = None,
        engine: Engine | None = None,
        sink: SegmentSink | None = None,
        clock: Callable[[], dt.datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        landing: bool | None = None,
    ) -> None:
        self.engine = engine or Engine()
        self.config = self.engine.thresholds.engine
        self.job = job
        # a job's follower lists no table whole, not even once: its tail lists what it tails
        # (PartitionListing), and of the incidents it reads the table of that name only
        self.store = (
            Store(store, jobs=[job, "_node"], tables=()) if job is not None else Store(store)
        )
        self.incident_store = Store(store, tables=("incidents",)) if job is not None else self.store
        self.sink = sink or SegmentSink(
            self.store.location, flush_rows=1_000_000, flush_age_s=3600.0
        )
        # a job's follower lists only its job's partitions and its nodes' node-level ones
        # (PartitionListing)
        partitions = PartitionListing(self.store.location, job) if job is not None else None
        # landing: None = the landing log on an object store, the partitions on a local one
        if landing is None:
            landing = not self.store.location.is_local
        listing: PartitionListing | LandingListing | None = partitions
        if landing:
            listing = LandingListing(self.store.location, job, self._catch_up(partitions),
                                     nodes=lambda: set(partitions.nodes) if partitions else set(),
                                     wall=wall)
        self.tail = SegmentTail(self.store, TAILED_TABLES, retain_s=self.config.retain_s,
                                max_rows=self.config.max_rows_per_table, to_frame=tail_frame,
                                arrow_tables=("collectives",), listing=listing)
        self.clock = clock
        self.monotonic = monotonic
        self.wall = wall
        self.known = existing_incident_ids(self.incident_store)
        self._failures: list[Incident] = existing_failures(self.incident_store)
        self._hung = {(i.job_id, i.attempt): i.first_signal_ts for i in self._failures
                      if i.incident_class == IncidentClass.COLLECTIVE_HANG}
        self._crashed = {(i.job_id, i.attempt): evidence_start(i) for i in self._failures
                         if i.incident_class == IncidentClass.CRASH}
        self._last_health = float("-inf")
        straggler = self.engine.thresholds.straggler
        self._straggler_steps = 2 * straggler.window_steps + straggler.self_baseline_steps
        self.stats = FollowStats()
        self._arrivals: dict[tuple[str | None, int | None], float] = {}
        # attempts with a failure row seen, and when the first was (the clock's time)
        self._failure_seen: dict[tuple[str | None, int | None], dt.datetime] = {}
        self._steps_changed = False
        self._last_progress = float("-inf")
        self._last_straggler = float("-inf")
        self._pending_crash = False
        self._stop = threading.Event()
        # job -> the newest segment not yet followed by an incident, and when it was seen
        self._unclaimed: dict[str, tuple[NewSegment, float]] = {}

    def _catch_up(
        self, partitions: PartitionListing | None
    ) -> Callable[[dict[str, str | None]], dict[str, list[str]]]:
        """The landing listing's first refresh: what the window already holds, listed once."""
        location = self.store.location

        def listed(since: dict[str, str | None]) -> dict[str, list[str]]:
            if partitions is not None:
                partitions.refresh(since)
                return {table: partitions.segments(table) for table in since}
            return {table: list_segments(location, table, date_from=low)
                    for table, low in since.items()}

        return listed

    # ------------------------------------------------------------ one poll

    def poll_once(self) -> list[Incident]:
        """Read new segments, attribute, write new incidents; returns the incidents written by this
        poll.
        """
        arrived = self.tail.poll()
        self.stats.polls += 1
        self.stats.segments_read += len(arrived)
        self.stats.rows_read += sum(s.rows for s in arrived)
        seen_at = self.wall()
        tick = self.monotonic()
        self._remember(arrived, seen_at)
        changed = {segment.table for segment in arrived}
        self._steps_changed |= "steps" in changed
        if "process_events" in changed:
            self._note_arrivals(arrived)
        crash_due = bool({"process_events", "gpu_events"} & changed) or self._pending_crash
        # a failure's own rows (an exit, a dump) are judged at once; the rows every healthy rank
        # writes all the time (steps, heartbeats, numerics) at most every progress_check_s, or the
        # whole job would be attributed again on nearly every poll
        progress_due = tick - self._last_progress >= self.config.progress_check_s or bool(
            {"process_events", "collectives"} & changed)
        straggler_due = (
            self._steps_changed and tick - self._last_straggler >= self.config.straggler_check_s
        )
        health_due = (
            "gpu_events" in changed or tick - self._last_health >= self.config.progress_check_s
        )
        if not (crash_due or progress_due or straggler_due or health_due):
            return []
        telemetry = self._telemetry()
        now = self.clock()
        found: list[Incident] = []
        for job in telemetry.jobs:
            found.extend(
                self.engine.run_job(
                    telemetry.for_job(job),
                    now,
                    now,
                    settled=self._settled,
                    failure_seen=lambda job, attempt: self._failure_seen.get((job, attempt)),
                    already=self.known,
                    hangs=progress_due or crash_due,
                    stragglers=straggler_due,
                    straggler_last_steps=self._straggler_steps,
                    hung=self._hung,
                    failed=self._crashed,
                )
            )
        self._failures.extend(
            i
            for i in found
            if i.incident_class in (IncidentClass.CRASH, IncidentClass.COLLECTIVE_HANG)
        )
        for incident in found:
            if incident.incident_class == IncidentClass.COLLECTIVE_HANG:
                self._hung.setdefault((incident.job_id, incident.attempt), incident.first_signal_ts)
            elif incident.incident_class == IncidentClass.CRASH:
                self._crashed.setdefault(
                    (incident.job_id, incident.attempt), evidence_start(incident)
                )
        if health_due:
            self._last_health = tick
            settle = dt.timedelta(seconds=self.engine.thresholds.health.settle_s)
            found.extend(self.engine.run_store_detectors(telemetry.gpu_events, self._failures, now,
                                                         settled_before=now - settle))
        if crash_due:
            # an attempt whose settle time ends after this evaluation began may have been skipped:
            # look again
            self._arrivals = {key: arrived for key, arrived in self._arrivals.items()
                              if arrived + self.config.crash_settle_s >= tick}
            # and while a failure seen lately may still be waiting for the other nodes' reports (the
            # attributor's peer wait counts from when it was seen): looked at again on every poll,
            # not at the next hang check
            peer_wait = dt.timedelta(seconds=self.engine.crash_rules.exception_peer_wait_s)
            self._pending_crash = bool(self._arrivals) or any(
                now < seen + peer_wait for seen in self._failure_seen.values()
            )
        if progress_due:
            self._last_progress = tick
        if straggler_due:
            self._last_straggler = tick
            self._steps_changed = False
        written = write_new_incidents(self.incident_store, found, self.known, self.sink)
        if written:
            written_at = self.wall()
            jobs = {safe_value(incident.job_id or "_node") for incident in written}
            # shared by one poll's incidents
            triggers = {job: self._unclaimed.pop(job, None) for job in jobs}
            for incident in written:
                claimed = triggers[safe_value(incident.job_id or "_node")]
                trigger = claimed[0] if claimed else None
                self.stats.lag.append(
                    LagRecord(
                        incident.incident_id,
                        trigger.path if trigger else None,
                        trigger.landed_at if trigger else None,
                        claimed[1] if claimed else seen_at,
                        written_at,
                    )
                )
            self.stats.incidents_written += len(written)
        return written

    def _remember(self, arrived: Sequence[NewSegment], seen_at: float) -> None:
        """The newest segment of each job not yet followed by an incident: what an incident's lag is
        measured from (an incident found by the passing of time, a hang, has none unless data of its
        job just landed)."""
        for segment in arrived:
            if segment.table == "gpu_samples" or segment.landed_at is None:
                continue
            match = _JOB_PART.search(segment.path)
            job = match.group(1) if match else "_node"
            current = self._unclaimed.get(job)
            if current is None or (current[0].landed_at or 0.0) <= segment.landed_at:
                self._unclaimed[job] = (segment, seen_at)

    def _note_arrivals(self, arrived: Sequence[object]) -> None:
        events = self.tail.frame("process_events")
        if events.empty:
            return
        tick = self.monotonic()
        new_rows = sum(s.rows for s in arrived if s.table == "process_events")  # type: ignore[attr-defined]
        recent = events.iloc[max(0, len(events) - new_rows):]
        jobs = recent["job_id"].astype(object).where(recent["job_id"].notna(), None)
        attempts = recent["attempt"].astype(object).where(recent["attempt"].notna(), None)
        failure_rows = _may_change_a_crash(recent)
        for job, attempt, failure in set(zip(jobs, attempts, failure_rows, strict=True)):
            key = (job, None if attempt is None else int(attempt))
            # an echo extends the wait only while no failure of the attempt has arrived (it may land
            # before the report of the death it echoes); after one, the cascade no longer holds the
            # incident back
            if failure or key not in self._failure_seen:
                self._arrivals[key] = tick
            if failure:
                self._failure_seen.setdefault(key, self.clock())

    def _settled(self, job: str | None, attempt: int | None) -> bool:
        arrived = self._arrivals.get((job, attempt))
        return arrived is None or self.monotonic() - arrived >= self.config.crash_settle_s

    def _telemetry(self) -> Telemetry:
        frames = {name: self.tail.frame(name) for name in TAILED_TABLES if name != "collectives"}
        samples = frames["gpu_samples"]

        def fetch(nodes: Sequence[str], start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
            if samples.empty:
                return samples
            mask = (
                samples["node"].isin(list(nodes))
                & (samples["ts"] >= start)
                & (samples["ts"] <= end)
            )
            return samples[mask]

        jobs = tuple(
            list_jobs(
                frames["ranks"], frames["steps"], frames["process_events"], frames["heartbeats"]
            )
        )
        if self.job is not None:
            jobs = tuple(j for j in jobs if j == self.job)
        collectives: pa.Table = self.tail.table("collectives")
        return Telemetry(
            ranks=frames["ranks"],
            steps=frames["steps"],
            process_events=frames["process_events"],
            gpu_events=frames["gpu_events"],
            collectives=collectives,
            fetch_samples=fetch,
            jobs=jobs,
            heartbeats=frames["heartbeats"],
            numerics=frames["numerics"],
        )

    # ------------------------------------------------------------ loop

    def run(
        self,
        *,
        interval: float | None = None,
        on_incident: Callable[[Incident], None] | None = None,
        max_polls: int | None = None,
    ) -> None:
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
