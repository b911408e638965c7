"""The batch pass attempt by attempt (attribution/reading/windows.py, Engine.run_store) finds
exactly what a pass over the whole store finds, on a real simulated store (Parquet segments through
the real sink) of many attempts: every attempt is a window, and the incidents whose evidence reaches
into other windows (a crash compared with the fingerprints of earlier attempts, a hang observed
until the next attempt started, placements of other attempts) are neither lost nor doubled."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json

import pytest

from faultlens.attribution.detectors.crash import death_step, last_progress
from faultlens.attribution.detectors.desync import completed_steps
from faultlens.attribution.engine import attribute
from faultlens.attribution.incident import Incident, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store, placements
from faultlens.attribution.reading.windows import JobWindows, store_jobs
from faultlens.controller.lab.simulate import SimConfig, simulate


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("windowed") / "store"
    # a software bug twice: the second crash is judged against the first attempt's fingerprint
    # (another window)
    kinds = (
        "gpu_xid79",
        "nccl_stuck_rank",
        "software_bug",
        "host_down",
        "software_bug",
        "nvlink_xid74",
    )
    simulate(
        SimConfig(
            nodes=4,
            gpus_per_node=4,
            hours=6.0,
            seed=3,
            faults_per_day=48.0,
            stragglers_per_day=12.0,
            benign_per_day=20.0,
            fault_sequence=kinds,
        ),
        str(path),
    )
    return str(path)


def _identity(incidents: list[Incident]) -> list[str]:
    rows = []
    for incident in incidents:
        row = incident.to_row()
        row.pop("ts")  # detection time: the wall clock of the pass
        row.pop("detected_ts", None)
        rows.append(json.dumps(row, sort_keys=True, default=str))
    return sorted(rows)


def test_windowed_pass_finds_the_incidents_of_the_whole_store_pass(store: str) -> None:
    with Store(store) as opened:
        windowed = attribute(opened)
        whole = attribute(opened, windowed=False)
        jobs = store_jobs(opened)
        windows = JobWindows.open(opened, jobs[0], None)
    # many windows, not one
    assert len(jobs) == 1 and windows.windowable and len(windows.attempts) >= 5
    classes = {i.incident_class for i in whole}
    assert {IncidentClass.CRASH, IncidentClass.COLLECTIVE_HANG} <= classes, classes
    assert len({i.attempt for i in whole}) >= 4  # incidents in several windows
    assert _identity(windowed) == _identity(whole)
    assert len({i.incident_id for i in windowed}) == len(windowed)  # none doubled


def test_windowed_pass_at_a_given_time_and_for_one_job(store: str) -> None:
    with Store(store) as opened:
        job = store_jobs(opened)[0]
        newest = load_from_store(opened, job).as_of[job]
    now = newest - dt.timedelta(hours=1)  # the last hour unseen: the latest attempts look different
    assert _identity(attribute(store, job, now)) == _identity(
        attribute(store, job, now, windowed=False)
    )


def test_the_digest_answers_the_crash_lookups_as_every_step_row_does(store: str) -> None:
    """Where a rank ran, its last step, when it last made progress: the same from the few digest
    rows of each (attempt, rank, phase) as from all step rows, for every attempt and rank."""
    with Store(store) as opened:
        whole = load_from_store(opened).for_job(store_jobs(opened)[0])
        windows = JobWindows.open(opened, whole.jobs[0], None)
    digest = windows.context
    assert len(digest.steps) * 20 < len(whole.steps)  # a reduction, not a copy
    for attempt in windows.attempts:
        assert placements(whole.ranks, attempt, whole.process_events, whole.steps) == \
            placements(digest.ranks, attempt, digest.process_events, digest.steps)
        ranks = sorted(
            int(r)
            for r in whole.steps.loc[whole.steps["attempt"] == attempt, "rank"].dropna().unique()
        )
        assert last_progress(whole, attempt, ranks) == last_progress(digest, attempt, ranks)
        assert completed_steps(whole, attempt, ranks) == completed_steps(digest, attempt, ranks)
        for rank in ranks[:3]:
            assert death_step(whole, attempt, rank) == death_step(digest, attempt, rank)


def test_an_attempt_window_holds_only_its_rows_beside_the_digest(store: str) -> None:
    with Store(store) as opened:
        windows = JobWindows.open(opened, store_jobs(opened)[0], None)
        attempt = windows.attempts[len(windows.attempts) // 2]
        rows = windows.attempt_steps(attempt)
        every = (
            opened.query("SELECT count(*) AS n FROM steps WHERE attempt = ?", [attempt])
            .column("n")[0]
            .as_py()
        )
        progress = windows.progress_window(attempt).steps
        loss = windows.loss_window(attempt).steps
        chunks = list(windows.straggler_chunks(attempt, rows=len(rows) // 5))
    assert len(rows) == every and set(rows["attempt"]) == {attempt}
    mine = progress[progress["attempt"] == attempt]
    assert 0 < len(mine) < len(rows) // 5  # a reduction, not a copy
    others = progress[progress["attempt"] != attempt]
    stepped = set(windows.context.steps["attempt"])  # the attempts with step rows
    # one start row per other attempt
    assert len(others) == len(stepped) - 1 and others["attempt"].is_unique
    assert others["end_ts"].isna().all() and others["start_ts"].notna().all()
    assert set(loss["attempt"]) == {attempt} and set(loss["rank"]) == set(rows["rank"])
    assert len(chunks) >= 5 and sum(len(c) for c in chunks) == int(rows["step"].notna().sum())
    for before, after in itertools.pairwise(chunks):
        assert before["step"].max() < after["step"].min()  # disjoint, ascending step ranges


def test_the_reduced_windows_answer_as_the_attempts_rows_do(store: str) -> None:
    """Progress, loss and straggler answers of every attempt: the same from the reduced windows (and
    chunks of a few thousand rows) as from the attempt's every step row."""
    from faultlens.attribution.engine import Engine

    engine = Engine()
    monitor = engine.detector("crash").progress
    straggler = engine.detector("straggler").detector
    loss = engine.detector("loss").monitor
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    with Store(store) as opened:
        windows = JobWindows.open(opened, store_jobs(opened)[0], None)
        context = windows.context
        found = slow = 0
        for attempt in windows.attempts:
            rows = windows.attempt_steps(attempt)
            full = dataclasses.replace(context, steps=rows)
            # every attempt looks stalled by then
            as_of = rows["ts"].max() + dt.timedelta(minutes=30)
            expected = [s for s in monitor.suspects(full, as_of) if s.attempt == attempt]
            got = [
                s
                for s in monitor.suspects(windows.progress_window(attempt), as_of)
                if s.attempt == attempt
            ]
            assert got == expected
            found += len(expected)
            assert _identity(loss.attribute(windows.loss_window(attempt), now)) == \
                _identity(loss.attribute(full, now))
            chunked = straggler.attribute_attempt(
                context,
                windows.job,
                attempt,
                windows.step_columns,
                windows.straggler_chunks(attempt, rows=4096),
                now,
                placement_rows=windows.attempt_digest(attempt),
            )
            assert _identity(chunked) == _identity(straggler.attribute(full, now))
            slow += len(chunked)
    assert found >= 1 and slow >= 1  # stalls and slowdowns compared, not only empty answers
