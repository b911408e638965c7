"""The engine: batch pass, incidents written exactly once, follow mode tailing only new segments, the lag from a
segment landing to its incident row, and the CLI."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from engine_rows import at, event, ranks_rows, steps_rows, write

from attribution.engine import Engine, Follower, attribute, write_new_incidents
from attribution.incident import Cause, IncidentClass
from attribution.maintenance import compact
from attribution.store import Store
from collectors.layout import resolve_store
from collectors.xid_catalog import load_xid_catalog
from controller.cli.main import main

CLOSED = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:15242"


def flat(rank: int, step: int) -> dict[str, float]:
    return {"forward": 0.3, "backward": 0.6}


def crash_rows(job: str = "job-1", attempt: int = 0, base: float = 100.0) -> list[dict]:
    rows = [event("exit", 2, base, job=job, attempt=attempt, exit_code=-9, signal="SIGKILL", source="supervisor")]
    rows += [event("comm_error", r, base + 0.5, job=job, attempt=attempt, message=CLOSED, is_secondary=True)
             for r in (0, 1, 3)]
    return rows


def incident_rows(store_dir: Path) -> list[dict]:
    with Store(str(store_dir)) as store:
        return store.query("SELECT incident_id, class, culprit_ranks FROM incidents").to_pylist()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def test_batch_pass_writes_each_incident_once(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", crash_rows())

    first = attribute(str(store_dir), engine=engine)
    assert [i.incident_class for i in first] == [IncidentClass.CRASH]
    assert write_new_incidents(str(store_dir), first) == first
    again = attribute(str(store_dir), engine=engine)
    assert [i.incident_id for i in again] == [i.incident_id for i in first]  # deterministic ids
    assert write_new_incidents(str(store_dir), again) == []

    assert incident_rows(store_dir) == [{"incident_id": first[0].incident_id, "class": "crash", "culprit_ranks": [2]}]


def test_a_crashed_attempt_is_not_also_reported_as_a_hang(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "steps", steps_rows("job-1", 0, 4, 4, range(40), sections=flat))
    write(store_dir, "process_events", crash_rows(base=40 * 0.91 + 1))

    found = attribute(str(store_dir), engine=engine, now=at(3600))

    assert [i.incident_class for i in found] == [IncidentClass.CRASH]


def test_follow_tails_new_segments_and_writes_each_incident_exactly_once(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    follower = Follower(str(store_dir), engine=engine)
    try:
        assert follower.poll_once() == []
        write(store_dir, "process_events", crash_rows()[:1])  # the supervisor saw rank 2 die
        written = []
        for _ in range(40):
            written += follower.poll_once()
            if written:
                break
            follower._stop.wait(0.05)
        assert [i.culprit_ranks for i in written] == [(2,)]
        record = follower.stats.lag[0]
        assert record.incident_id == written[0].incident_id
        assert record.lag_s is not None and 0 <= record.lag_s < 30
        rows_before = follower.stats.rows_read
        # the cascade lands later: more rows, same attempt, no second incident
        write(store_dir, "process_events", crash_rows()[1:] * 50)
        for _ in range(10):
            assert follower.poll_once() == []
        assert follower.stats.rows_read == rows_before + 150
        # compaction merges segments already read: they are not read again
        compact(resolve_store(str(store_dir)), ["process_events"], min_segments=2)
        assert follower.poll_once() == []
        assert follower.stats.rows_read == rows_before + 150
    finally:
        follower.close()
    # a restarted follower knows what was written
    again = Follower(str(store_dir), engine=engine)
    try:
        assert again.poll_once() == []
    finally:
        again.close()
    assert len(incident_rows(store_dir)) == 1


def test_follow_detects_a_stall_and_requests_dumps_once(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "steps", steps_rows("job-1", 0, 4, 4, range(30), sections=flat))
    requests = []

    def requester(suspect):
        requests.append((suspect.job_id, suspect.attempt, suspect.last_step))
        return None  # the job could not be reached: no dumps

    hang_engine = Engine(catalog=load_xid_catalog(), dump_requester=requester)
    clock = {"now": at(40)}
    follower = Follower(str(store_dir), engine=hang_engine, clock=lambda: clock["now"])
    try:
        assert follower.poll_once() == []  # 40 s: last step ended at ~27 s, floor 30 s
        clock["now"] = at(90)
        follower._last_progress = float("-inf")
        (incident,) = follower.poll_once()
        clock["now"] = at(200)
        follower._last_progress = float("-inf")
        assert follower.poll_once() == []
    finally:
        follower.close()
    assert requests == [("job-1", 0, 29)]
    assert incident.incident_class == IncidentClass.COLLECTIVE_HANG
    assert incident.rule == "hang-no-dumps" and incident.cause == Cause.UNKNOWN
    assert incident.step == 29


def test_cli_attribute_and_incidents(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", crash_rows() + crash_rows(job="job-2"))

    assert main(["attribute", "--store", str(store_dir), "--job", "job-2", "--json"]) == 0
    batch = json.loads(capsys.readouterr().out)
    assert [(r["job_id"], r["class"], r["culprit_ranks"], r["new"]) for r in batch] == [("job-2", "crash", [2], True)]

    assert main(["attribute", "--store", str(store_dir), "--follow", "--interval", "0.1", "--max-polls", "8",
                 "--json"]) == 0
    live = capsys.readouterr().out
    assert '"job_id": "job-1"' in live and '"job_id": "job-2"' not in live

    assert main(["incidents", "--store", str(store_dir), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["job_id"] for r in listed) == ["job-1", "job-2"]
    assert all(r["evidence"] for r in listed)


def test_cli_bad_rules_and_store_fail_with_one_line(store_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "thresholds.yaml"
    bad.write_text("format_version: 1\nprogress: {k: 5}\n")
    assert main(["attribute", "--store", str(store_dir), "--thresholds", str(bad)]) == 2
    error = capsys.readouterr().err
    assert str(bad) in error and "progress.floor_s: required key is missing" in error
    assert main(["incidents", "--store", str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_now_must_be_a_time(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attribute", "--store", str(store_dir), "--now", "yesterday"]) == 2
    assert "expected an ISO 8601 time" in capsys.readouterr().err
    assert main(["attribute", "--store", str(store_dir), "--now", "2026-11-30T12:00:00"]) == 0
    assert isinstance(dt.datetime.fromisoformat("2026-11-30T12:00:00"), dt.datetime)
