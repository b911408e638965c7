"""Goodput accounting: hand-built stores with answers worked out by hand (written through the real
sink, read back through DuckDB), the CLI, and the real demo store (invariants that hold for any demo
run)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math

import pytest

from faultlens.attribution.goodput import (
    BADPUT,
    Bucket,
    GoodputError,
    build_timeline,
    expected_ettr,
    goodput,
    optimal_checkpoint_interval,
)
from faultlens.attribution.reading.store import Store
from faultlens.controller.cli.main import main
from tests.engine_rows import at, write

JOB = "job-g"


def _step(
    attempt: int,
    step: int,
    start: float,
    end: float,
    *,
    phase: str = "train",
    ranks: int = 2,
    job: str = JOB,
) -> list[dict]:
    # rank 1 starts 50 ms after rank 0 and ends with it: the step spans rank 0's start to the common
    # end
    return [
        {
            "ts": at(end),
            "job_id": job,
            "attempt": attempt,
            "rank": r,
            "node": f"node-{r}",
            "step": step,
            "phase": phase,
            "start_ts": at(start + 0.05 * r),
            "end_ts": at(end),
            "duration_s": end - start,
        }
        for r in range(ranks)
    ]


def _ranks(attempt: int, seconds: float, ranks: int = 2, job: str = JOB) -> list[dict]:
    return [
        {
            "ts": at(seconds),
            "job_id": job,
            "attempt": attempt,
            "rank": r,
            "node": f"node-{r}",
            "world_size": ranks,
        }
        for r in range(ranks)
    ]


def _incident(incident_id: str, attempt: int, first: float, detected: float, cls: str = "crash",
              cause: str = "gpu_hardware", job: str = JOB) -> dict:
    return {
        "ts": at(detected),
        "job_id": job,
        "attempt": attempt,
        "incident_id": incident_id,
        "class": cls,
        "cause": cause,
        "first_signal_ts": at(first),
        "detected_ts": at(detected),
    }


def _decision(
    decision_id: str,
    incident_id: str,
    attempt: int,
    issued: float,
    action: str = "failover",
    status: str = "pending",
    row_ts: float | None = None,
    job: str = JOB,
) -> dict:
    return {
        "ts": at(row_ts if row_ts is not None else issued),
        "job_id": job,
        "attempt": attempt,
        "decision_id": decision_id,
        "incident_id": incident_id,
        "action": action,
        "issued_ts": at(issued),
        "delivery_status": status,
    }


@pytest.fixture
def one_failover(store_dir):
    """attempt 0: ranks at 0 s; steps 0-2 at [1,4], checkpoint of step 2 at [4,4.5], steps 3-4 at
    [4.5,6.5]; a crash first seen at 7 s, detected at 9 s, failover issued at 10 s (a second
    delivery row at 11 s). attempt 1: supervisor start row at 12 s (ranks row at 13 s), resumes at
    step 3: steps 3-5 at [14,17]; last process exit at 17.5 s."""
    steps = [
        *_step(0, 0, 1, 2),
        *_step(0, 1, 2, 3),
        *_step(0, 2, 3, 4),
        *_step(0, 2, 4, 4.5, phase="checkpoint"),
        *_step(0, 3, 4.5, 5.5),
        *_step(0, 4, 5.5, 6.5),
        *_step(1, 3, 14, 15),
        *_step(1, 4, 15, 16),
        *_step(1, 5, 16, 17),
    ]
    write(store_dir, "steps", steps)
    write(store_dir, "ranks", [*_ranks(0, 0.0), *_ranks(1, 13.0)])
    write(store_dir, "process_events", [
        {"ts": at(12.0), "job_id": JOB, "attempt": 1, "kind": "start", "source": "supervisor"},
        {"ts": at(17.5), "job_id": JOB, "attempt": 1, "rank": 0, "kind": "exit", "exit_code": 0}])
    write(store_dir, "incidents", [_incident("inc-a", 0, 7.0, 9.0)])
    write(
        store_dir,
        "decisions",
        [
            _decision("dec-a", "inc-a", 0, 10.0),
            _decision("dec-a", "inc-a", 0, 10.0, status="delivered", row_ts=11.0),
        ],
    )
    return store_dir


def test_every_bucket_of_a_failover_worked_out_by_hand(one_failover):
    report = goodput(str(one_failover), JOB)
    assert report.start == at(0) and report.end == at(17.5)
    assert report.wall_s == pytest.approx(17.5)
    # steps 0-2 of attempt 0, steps 3-5 of attempt 1
    assert report.productive_s == pytest.approx(6.0)
    assert report.ettr == pytest.approx(6.0 / 17.5)
    expected = {
        Bucket.CHECKPOINT: 0.5,
        Bucket.LOST_WORK: 2.0,
        Bucket.STARTUP: 1.0 + 2.0,
        Bucket.RESTART: 2.0,
        Bucket.DECISION: 1.0,
        Bucket.DETECTION: 2.0,
        Bucket.UNKNOWN: 0.5 + 0.5,
    }
    assert {k: pytest.approx(v) for k, v in expected.items()} == dict(report.badput)
    assert report.productive_s + sum(report.badput.values()) == pytest.approx(report.wall_s)
    assert (report.steps_kept, report.steps_lost) == (6, 2)

    first, second = report.attempts
    assert (first.first_step, first.last_step, first.resume_point) == (0, 4, 3)
    assert (first.steps_kept, first.steps_lost) == (3, 2)
    assert (first.incident_id, first.action) == ("inc-a", "failover")
    # the supervisor's start row beats the ranks row
    assert first.start == at(0) and second.start == at(12)
    assert first.seconds[Bucket.RESTART] == pytest.approx(2.0) and first.seconds[
        Bucket.STARTUP
    ] == pytest.approx(1.0)
    assert sum(first.seconds.values()) == pytest.approx(12.0)
    assert (second.resume_point, second.steps_kept, second.steps_lost, second.incident_id) == (
        None,
        3,
        0,
        None,
    )

    (cost,) = report.incidents
    assert cost.incident_id == "inc-a" and cost.lost_work_s == pytest.approx(2.0)
    assert cost.downtime_s == pytest.approx(7.5)  # 6.5 s (last step end) .. 14 s (next first step)

    stretch = report.longest_unproductive
    assert (stretch.start, stretch.end, stretch.seconds) == (at(4), at(14), pytest.approx(10.0))
    assert stretch.buckets[Bucket.LOST_WORK] == pytest.approx(2.0)
    assert set(stretch.buckets) == {
        Bucket.CHECKPOINT,
        Bucket.LOST_WORK,
        Bucket.UNKNOWN,
        Bucket.DETECTION,
        Bucket.DECISION,
        Bucket.RESTART,
        Bucket.STARTUP,
    }


def test_sliding_window_ettr(one_failover):
    report = goodput(str(one_failover), JOB, window_s=5.0)
    assert report.window_s == 5.0
    points = {round((p.end - at(0)).total_seconds(), 3): p.ettr for p in report.sliding}
    assert min(points) == 5.0 and max(points) == 17.5
    assert points[5.0] == pytest.approx(3.0 / 5)  # (0,5]: steps 0-2
    assert points[12.0] == pytest.approx(0.0)  # (7,12]: detection, decision, restart
    assert points[17.5] == pytest.approx(3.0 / 5)  # (12.5,17.5]: steps 3-5
    assert report.min_sliding_ettr == pytest.approx(0.0)
    curve = report.cumulative_ettr(points=36)  # every 0.5 s
    assert curve[-1] == (at(17.5), pytest.approx(6.0 / 17.5))
    assert dict(curve)[at(4.0)] == pytest.approx(3.0 / 4.0)
    # a window longer than the job: one point, the whole-job ETTR
    whole = goodput(str(one_failover), JOB, window_s=100.0)
    assert len(whole.sliding) == 1 and whole.sliding[0].ettr == pytest.approx(6.0 / 17.5)


def test_window_and_attempt_starts_from_the_caller(one_failover):
    # the caller launched attempt 0 at -3 s and attempt 1 at 11 s; the job is looked at until 20 s
    report = goodput(str(one_failover), JOB, since=at(-3), until=at(20),
                     attempt_starts={0: at(-3), 1: at(11)})
    assert report.wall_s == pytest.approx(23.0)
    assert report.badput[Bucket.STARTUP] == pytest.approx(4.0 + 3.0)  # -3..1 and 11..14
    assert report.badput[Bucket.RESTART] == pytest.approx(1.0)  # 10..11
    assert report.badput[Bucket.UNKNOWN] == pytest.approx(0.5 + 3.0)  # partial step, and 17..20
    assert report.productive_s + sum(report.badput.values()) == pytest.approx(23.0)
    # a window start after the first attempt's start clips it
    late = goodput(str(one_failover), JOB, since=at(2))
    assert late.wall_s == pytest.approx(15.5) and late.badput[Bucket.STARTUP] == pytest.approx(2.0)
    with pytest.raises(GoodputError, match="empty window"):
        goodput(str(one_failover), JOB, since=at(30))
    with pytest.raises(GoodputError, match="timezone"):
        goodput(str(one_failover), JOB, since=dt.datetime(2026, 11, 30, 12, 0, 0))


def test_overlaps_take_the_bucket_of_higher_priority(store_dir):
    """A straggler detected while steps still complete, then a secondary crash while the job
    restarts, an attempt that restarts from scratch (all its work lost) and a final escalation left
    waiting for a human."""
    steps = [row for s in range(6) for row in _step(0, s, 1 + s, 2 + s)]  # [1,7]
    # from scratch again: all of attempt 0 is lost
    steps += [*_step(1, 0, 12, 13), *_step(1, 1, 13, 14)]
    write(store_dir, "steps", steps)
    write(store_dir, "ranks", [*_ranks(0, 0.0), *_ranks(1, 11.0)])
    write(store_dir, "incidents", [
        _incident("inc-slow", 0, 2.0, 6.5, cls="straggler", cause="thermal"),  # overlaps steps 1..5
        # the survivors' echo during the restart
        _incident("inc-echo", 0, 7.5, 9.5, cls="crash", cause="unknown"),
        _incident("inc-bug", 1, 14.5, 16.0, cls="crash", cause="software")])
    write(store_dir, "decisions", [_decision("dec-slow", "inc-slow", 0, 7.0),
                                   _decision("dec-bug", "inc-bug", 1, 17.0, action="escalate")])
    report = goodput(str(store_dir), JOB, until=at(20))
    # the straggler's detection (2..6.5 s) and decision (6.5..7 s) fall on steps: lost work, not
    # detection
    assert report.productive_s == pytest.approx(2.0)
    expected = {Bucket.LOST_WORK: 6.0, Bucket.STARTUP: 1.0 + 1.0, Bucket.DETECTION: 1.5,
                # 7..11 and 17..20 (waiting for a human)
                Bucket.DECISION: 1.0, Bucket.RESTART: 4.0 + 3.0,
                Bucket.UNKNOWN: 0.5, Bucket.CHECKPOINT: 0.0}
    assert {k: pytest.approx(v) for k, v in expected.items()} == dict(report.badput)
    first, second = report.attempts
    assert (first.resume_point, first.steps_kept, first.steps_lost) == (0, 0, 6)
    assert (first.incident_class, first.cause) == ("straggler", "thermal")
    assert (second.action, second.steps_kept) == ("escalate", 2)
    assert [c.incident_id for c in report.incidents] == ["inc-slow", "inc-bug"]
    assert report.incidents[1].downtime_s == pytest.approx(0.5 + 1.5 + 1.0 + 3.0)  # 14..20


def test_incidents_attributed_after_the_fact_do_not_shape_the_timeline(store_dir):
    """A batch pass months later (faultlens attribute/decide over old telemetry, or a simulated
    store): detection and decision times say when the pass ran. Attempt 0: steps [1,5]; a crash at
    5.5 s; attempt 1 starts at 9 s, steps [10,12]; the incident of attempt 0 and its decision are
    stamped 200 days later."""
    later = 200 * 86_400.0
    write(store_dir, "steps", [*_step(0, 0, 1, 3), *_step(0, 1, 3, 5), *_step(1, 1, 10, 12)])
    write(store_dir, "ranks", [*_ranks(0, 0.0), *_ranks(1, 9.0)])
    write(store_dir, "incidents", [_incident("inc-old", 0, 5.5, later)])
    write(store_dir, "decisions", [_decision("dec-old", "inc-old", 0, later + 2)])
    report = goodput(str(store_dir), JOB)
    assert report.end == at(12) and report.wall_s == pytest.approx(12.0)  # not 200 days
    assert (
        report.badput[Bucket.DETECTION]
        == report.badput[Bucket.DECISION]
        == report.badput[Bucket.RESTART]
        == 0
    )
    # 5..9: down, by what nobody recorded live
    assert report.badput[Bucket.UNKNOWN] == pytest.approx(4.0)
    assert report.badput[Bucket.LOST_WORK] == pytest.approx(2.0)  # step 1 of attempt 0, recomputed
    assert set(report.offline) == {"inc-old", "dec-old"}
    (cost,) = report.incidents
    assert (
        not cost.live
        and cost.lost_work_s == pytest.approx(2.0)
        and cost.downtime_s == pytest.approx(5.0)
    )
    # the same store with the incident detected live (before attempt 1 started) puts it back on the
    # timeline
    write(store_dir, "incidents", [_incident("inc-live", 0, 5.5, 7.0)])
    write(store_dir, "decisions", [_decision("dec-live", "inc-live", 0, 8.0)])
    again = goodput(str(store_dir), JOB)
    assert again.badput[Bucket.DETECTION] == pytest.approx(1.5) and again.badput[
        Bucket.RESTART
    ] == pytest.approx(1.0)
    # a last attempt's escalation shortly after the last telemetry is live and extends the window
    write(store_dir, "incidents", [_incident("inc-end", 1, 12.5, 14.0)])
    write(store_dir, "decisions", [_decision("dec-end", "inc-end", 1, 15.0, action="escalate")])
    final = goodput(str(store_dir), JOB)
    assert final.end == at(15) and final.badput[Bucket.DECISION] == pytest.approx(1.0 + 1.0)
    assert "inc-end" not in final.offline
    assert "dec-end" in goodput(str(store_dir), JOB, live_grace_s=1.0).offline


def test_other_jobs_are_ignored_and_a_missing_job_is_an_error(one_failover):
    write(one_failover, "steps", _step(0, 0, 0, 100, job="other"))
    assert goodput(str(one_failover), JOB).wall_s == pytest.approx(17.5)
    with pytest.raises(GoodputError, match="'nope': no steps"):
        goodput(str(one_failover), "nope")


def test_build_timeline_partitions_the_window():
    import numpy as np

    timeline = build_timeline({Bucket.PRODUCTIVE: (np.array([0, 50]), np.array([30, 80])),
                               Bucket.DETECTION: (np.array([20]), np.array([60]))}, 10, 100)
    assert [(s, e, str(b)) for s, e, b in timeline.runs()] == [
        (10, 30, "productive"), (30, 50, "detection"), (50, 80, "productive"), (80, 100, "unknown")]
    assert sum(timeline.seconds().values()) == pytest.approx(90e-9)
    with pytest.raises(GoodputError):
        build_timeline({}, 5, 5)


def test_expected_ettr_and_young_daly():
    # Llama 3 405B: 2,048 nodes, 419 unexpected interruptions in 54 days; 10 min restart, 30 s
    # blocking writes
    nodes, rate = 2048, 419 / (54 * 86_400 * 2048)
    interval = optimal_checkpoint_interval(nodes, rate, 30.0)
    assert interval == pytest.approx(math.sqrt(2 * 30 / (nodes * rate)))
    assert 800 < interval < 830
    value = expected_ettr(nodes, rate, 600.0, interval, 30.0)
    assert value == pytest.approx((1 - nodes * rate * (600 + interval / 2)) / (1 + 30 / interval))
    assert 0.87 < value < 0.89
    # the optimum beats its neighbours
    assert value > expected_ettr(nodes, rate, 600.0, interval * 2, 30.0)
    assert value > expected_ettr(nodes, rate, 600.0, interval / 2, 30.0)
    with pytest.raises(ValueError):
        optimal_checkpoint_interval(0, rate, 30.0)


def test_cli_table_json_and_errors(one_failover, capsys):
    assert (
        main(["goodput", "--store", str(one_failover), "--job", JOB, "--json", "--window", "5"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["ettr"] == pytest.approx(6 / 17.5, abs=1e-6)
    assert data["badput_s"]["lost_work"] == pytest.approx(2.0)
    assert data["incidents"][0]["total_s"] == pytest.approx(9.5)
    assert main(["goodput", "--store", str(one_failover), "--job", JOB]) == 0
    text = capsys.readouterr().out
    assert "ETTR 34.3%" in text and "longest unproductive stretch: 10.0 s" in text
    assert (
        main(["goodput", "--store", str(one_failover), "--job", JOB, "--until", "yesterday"]) == 2
    )
    assert "--until 'yesterday'" in capsys.readouterr().err
    assert main(["goodput", "--store", str(one_failover), "--job", "nope"]) == 2
    assert "no steps, ranks or process events" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the
# real demo


def test_goodput_of_the_demo_store(demo_store):
    with Store(demo_store.store) as reader:
        (job,) = reader.query("SELECT DISTINCT job_id FROM steps").column(0).to_pylist()
        first_steps = {
            r["attempt"]: r["s"]
            for r in reader.query(
                "SELECT attempt, min(step) AS s FROM steps WHERE phase = 'train' GROUP BY attempt"
            ).to_pylist()
        }
        last_steps = {
            r["attempt"]: r["s"]
            for r in reader.query(
                "SELECT attempt, max(step) AS s FROM steps WHERE phase = 'train' GROUP BY attempt"
            ).to_pylist()
        }
        restore = {r["attempt"]: r["restore_step"] for r in reader.query(
            "SELECT attempt, any_value(restore_step) AS restore_step FROM decisions WHERE action = "
            "'failover' "
            "GROUP BY attempt").to_pylist()}
        report = goodput(reader, job)
    attempts = sorted(first_steps)
    assert len(report.attempts) == len(attempts) == 5
    assert report.productive_s + sum(report.badput[b] for b in BADPUT) == pytest.approx(
        report.wall_s
    )
    assert 0 < report.ettr < 1
    # every step up to the last one is kept exactly once; the rest was thrown away by a restart
    assert report.steps_kept == last_steps[attempts[-1]] + 1
    lost = sum(last_steps[a] - first_steps[b] + 1 for a, b in itertools.pairwise(attempts))
    assert report.steps_lost == lost > 0
    for account, nxt in zip(report.attempts, attempts[1:], strict=False):
        assert account.resume_point == first_steps[nxt] == restore[account.attempt] + 1
    assert report.badput[Bucket.LOST_WORK] > 0 and report.badput[Bucket.CHECKPOINT] > 0
    assert report.badput[Bucket.RESTART] > 0 and report.badput[Bucket.DETECTION] > 0
    # four failovers and an escalation, each charged to the incident that stopped its attempt
    assert [c.action for c in report.incidents] == ["failover"] * 4 + ["escalate"]
    assert report.longest_unproductive is not None and report.longest_unproductive.seconds > 1


def test_demo_closing_report_uses_goodput(demo_store):
    saved = json.loads((demo_store.workdir / "goodput.json").read_text())
    output = " ".join(demo_store.output.split())
    assert f"= {saved['ettr']:.0%}" in output and "ETTR (faultlens goodput)" in output
    assert f"steps thrown away: {saved['steps_lost']}" in output
    # the demo's window is the supervisor's own: from the first launch, so start-up includes process
    # launch
    assert saved["badput_s"]["startup"] > 1.0
    total = saved["productive_s"] + sum(saved["badput_s"].values())
    assert total == pytest.approx(saved["wall_s"], abs=1e-3)
