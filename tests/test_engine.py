"""The engine: batch pass, incidents written exactly once, follow mode tailing only new segments,
the lag from a segment landing to its incident row, and the CLI."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from faultlens.attribution.engine import Engine, attribute, write_new_incidents
from faultlens.attribution.follow import Follower
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.reading.maintenance import compact
from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.kmsg import read_kernel_log
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.collectors.store.layout import resolve_store
from faultlens.controller.cli.main import main
from tests.engine_rows import at, event, ingest_torch_artifacts, ranks_rows, steps_rows, write

CLOSED = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:15242"


def flat(rank: int, step: int) -> dict[str, float]:
    return {"forward": 0.3, "backward": 0.6}


def crash_rows(job: str = "job-1", attempt: int = 0, base: float = 100.0) -> list[dict]:
    rows = [
        event(
            "exit",
            2,
            base,
            job=job,
            attempt=attempt,
            exit_code=-9,
            signal="SIGKILL",
            source="supervisor",
        )
    ]
    rows += [
        event(
            "comm_error", r, base + 0.5, job=job, attempt=attempt, message=CLOSED, is_secondary=True
        )
        for r in (0, 1, 3)
    ]
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

    assert incident_rows(store_dir) == [
        {"incident_id": first[0].incident_id, "class": "crash", "culprit_ranks": [2]}
    ]


def test_a_crashed_attempt_is_not_also_reported_as_a_hang(store_dir: Path, engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "steps", steps_rows("job-1", 0, 4, 4, range(40), sections=flat))
    write(store_dir, "process_events", crash_rows(base=40 * 0.91 + 1))

    found = attribute(str(store_dir), engine=engine, now=at(3600))

    assert [i.incident_class for i in found] == [IncidentClass.CRASH]


def test_follow_tails_new_segments_and_writes_each_incident_exactly_once(
    store_dir: Path, engine: Engine
) -> None:
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
    clock = {"now": at(34)}
    follower = Follower(str(store_dir), engine=hang_engine, clock=lambda: clock["now"])
    try:
        assert follower.poll_once() == []  # 34 s: last step ended at ~27 s, floor 10 s
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
    # the supervisor then kills the hung job: the end of the hang, not a second incident
    write(
        store_dir,
        "process_events",
        [event("exit", r, 210.0, exit_code=-9, signal="SIGKILL") for r in range(4)],
    )
    again = Follower(str(store_dir), engine=hang_engine, clock=lambda: at(215))
    try:
        for _ in range(10):
            assert again.poll_once() == []
            again._stop.wait(0.05)
    finally:
        again.close()


def test_cli_attribute_and_incidents(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", crash_rows() + crash_rows(job="job-2"))

    assert main(["attribute", "--store", str(store_dir), "--job", "job-2", "--json"]) == 0
    batch = json.loads(capsys.readouterr().out)
    assert [(r["job_id"], r["class"], r["culprit_ranks"], r["new"]) for r in batch] == [
        ("job-2", "crash", [2], True)
    ]

    assert (
        main(
            [
                "attribute",
                "--store",
                str(store_dir),
                "--follow",
                "--interval",
                "0.1",
                "--max-polls",
                "8",
                "--json",
            ]
        )
        == 0
    )
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


def test_follow_on_real_torchrun_artifacts_landing_one_after_the_other(
    torch_artifacts: dict[str, Path], tmp_path: Path, engine: Engine
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    follower = Follower(str(live), engine=engine)
    try:
        assert follower.poll_once() == []
        written = []
        for scenario in ("crash_sigkill", "crash_exception"):
            ingest_torch_artifacts(torch_artifacts[scenario], live)
            for _ in range(60):
                written += follower.poll_once()
                if len(written) >= (1 if scenario == "crash_sigkill" else 3):
                    break
                follower._stop.wait(0.05)
        for _ in range(5):
            assert follower.poll_once() == []
    finally:
        follower.close()
    by_job = sorted((i.job_id, i.attempt, i.culprit_ranks) for i in written)
    assert by_job == [
        ("faultlens-crash-exception", 0, (2,)),
        ("faultlens-crash-exception", 1, (2,)),
        ("faultlens-crash-sigkill", 0, (1,)),
    ]
    assert len(incident_rows(live)) == 3
    assert all(r.lag_s is not None for r in follower.stats.lag)


def kernel_log(tmp_path: Path, lines: list[str]) -> list[dict]:
    log = tmp_path / "kern.log"
    log.write_text("\n".join(lines) + "\n")
    return read_kernel_log(log, NodeIdentity(node="unused"), host_from_line=True).rows


def test_critical_gpu_events_without_a_failure_become_one_health_incident_per_gpu(
    store_dir: Path, tmp_path: Path, engine: Engine
) -> None:
    dbe = ("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
           "double bit error "
           "(DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, "
           "subpartition 1.")
    write(store_dir, "gpu_events", kernel_log(tmp_path, [
        f"{at(10).isoformat()} node-07 kernel: {dbe}",
        f"{at(70).isoformat()} node-07 kernel: {dbe}",  # the same GPU again: the same incident
        f"{at(20).isoformat()} node-03 kernel: NVRM: Xid (PCI:0018:01:00): 154, GPU recovery "
        "action changed from "
        "0x0 (None) to 0x2 (Node Reboot Required)",
        f"{at(30).isoformat()} node-05 kernel: NVRM: Xid (PCI:0000:00:07): 13, pid=1, "
        "name=python3, Graphics "
        "SM Warp Exception",  # an application error: the GPU is healthy
    ]))

    found = {i.culprit_nodes[0]: i for i in attribute(str(store_dir), engine=engine)}

    assert set(found) == {"node-07", "node-03"}
    assert all(i.incident_class == IncidentClass.HEALTH for i in found.values())
    assert found["node-07"].cause == Cause.HBM and found["node-07"].culprit_gpus == (
        "00000000:07:00.0",
    )
    assert found["node-07"].first_signal_ts == at(10)
    assert len([e for e in found["node-07"].evidence if "Xid 48" in e.text]) == 2
    assert found["node-03"].rule == "health-recovery-action"


def test_a_gpu_event_that_a_crash_explains_is_no_health_incident(store_dir: Path, tmp_path: Path,
                                                                 engine: Engine) -> None:
    write(store_dir, "ranks", ranks_rows("job-1", 0, 4, 4))
    write(store_dir, "process_events", crash_rows())
    write(store_dir, "gpu_events", kernel_log(tmp_path, [
        f"{at(95).isoformat()} node-00 kernel: NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off "
        "the bus."]))

    found = attribute(str(store_dir), engine=engine)

    assert [(i.incident_class, i.cause) for i in found] == [(IncidentClass.CRASH, Cause.PCIE)]


def test_follow_finds_a_straggler_as_its_steps_stream_in(store_dir: Path, engine: Engine) -> None:
    def sections(rank: int, step: int) -> dict[str, float]:
        slow = rank == 6 and step >= 20
        return {
            "forward": 0.3 * (1.7 if slow else 1.0) + 0.001 * ((rank * 7 + step) % 5),
            "backward": 0.6,
        }

    write(store_dir, "ranks", ranks_rows("job-1", 0, 16, 8))
    follower = Follower(str(store_dir), engine=engine, clock=lambda: at(10_000))
    follower.config = follower.config.model_copy(update={"straggler_check_s": 0.0})
    found = []
    try:
        # ten steps per segment, as a timer flushing every few seconds would
        for first in range(0, 60, 10):
            write(
                store_dir,
                "steps",
                steps_rows(
                    "job-1",
                    0,
                    16,
                    8,
                    range(first, first + 10),
                    start=first * 1.3,
                    sections=sections,
                ),
            )
            found += [
                i for i in follower.poll_once() if i.incident_class == IncidentClass.STRAGGLER
            ]
    finally:
        follower.close()
    (incident,) = found
    assert incident.culprit_ranks == (6,)
    assert incident.step < 50  # found while the job ran, not at the end
