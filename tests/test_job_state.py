"""What happened to a job, in one word (attribution/goodput/jobstate.py): completed only when every
node launched in the last attempt exited 0 by itself; stopped when escalated; a notify is never a
state; a silent end is unknown, not "ended". The end-to-end states of real `faultlens run` jobs are
in tests/test_run_restart.py; the store's own rows here come from a real SegmentSink."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from faultlens.attribution.goodput.jobstate import (
    AgentExit,
    JobState,
    agent_exits,
    judge_job_state,
)
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.supervisor.processes import EventRecorder

NOW = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)
NODES = {0: {"node-0", "node-1"}, 1: {"node-0", "node-1"}}


def judge(exits=(), incidents=(), decisions=(), last_ts=NOW, last_attempt=1, launched=None):
    return judge_job_state(
        last_attempt=last_attempt,
        last_ts=last_ts,
        exits=list(exits),
        launched=NODES if launched is None else launched,
        incidents=list(incidents),
        decisions=list(decisions),
        now=NOW,
        running_within_s=120.0,
    )


def ok(node: str, attempt: int = 1) -> AgentExit:
    return AgentExit(attempt, node, 0, False)


def test_every_node_exiting_0_is_completed_even_while_telemetry_is_fresh():
    assert judge([ok("node-0"), ok("node-1")]) is JobState.COMPLETED
    # an earlier attempt's failover and a notify of the last one change nothing
    decisions = [{"attempt": 0, "action": "failover"}, {"attempt": 1, "action": "notify"}]
    assert judge([ok("node-0"), ok("node-1")], decisions=decisions) is JobState.COMPLETED


def test_one_node_done_is_not_the_job_done():
    assert judge([ok("node-0")]) is JobState.RUNNING
    assert judge([ok("node-0")], last_ts=NOW - dt.timedelta(hours=1)) is JobState.UNKNOWN


def test_a_teardown_by_the_supervisor_is_not_a_completion():
    stopped = [AgentExit(1, "node-0", -15, True), AgentExit(1, "node-1", 0, True)]
    assert judge(stopped, decisions=[{"attempt": 1, "action": "escalate"}]) is JobState.STOPPED


@pytest.mark.parametrize(
    ("action", "state"),
    [
        ("escalate", JobState.STOPPED),
        ("failover", JobState.RESTARTING),
        ("restart", JobState.RESTARTING),
        ("notify", JobState.RUNNING),
    ],
)
def test_the_last_attempts_decision(action, state):
    assert judge(decisions=[{"attempt": 1, "action": action}]) is state


def test_a_failure_with_no_decision_is_failed_and_a_silent_end_unknown():
    failed = [AgentExit(1, "node-0", 1, False), AgentExit(1, "node-1", 1, False)]
    assert judge(failed) is JobState.FAILED  # even with fresh telemetry: it has exited
    old = NOW - dt.timedelta(hours=2)
    assert judge(incidents=[{"attempt": 1}], last_ts=old) is JobState.FAILED
    assert judge(last_ts=old) is JobState.UNKNOWN
    # a plain torchrun job (no supervisor rows): its incidents say it failed
    assert judge(incidents=[{"attempt": 1}], last_ts=old, launched={}) is JobState.FAILED


def test_agent_exits_read_back_from_a_real_store(tmp_path: Path):
    with SegmentSink(tmp_path / "store", flush_rows=1) as sink:
        recorder = EventRecorder(sink, job_id="j")
        for node in ("node-0", "node-1"):
            recorder.agent_exit(
                node=node, attempt=0, returncode=0, pid=10, message="done", by_us=False
            )
        sink.flush()
    with Store(tmp_path / "store") as store:
        exits, launched = agent_exits(store, "j")
    assert sorted(e.node for e in exits) == ["node-0", "node-1"]
    assert all(e.exit_code == 0 and not e.by_supervisor for e in exits)
    assert judge(exits, last_attempt=0, launched=launched) is JobState.COMPLETED
