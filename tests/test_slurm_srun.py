"""srun's reports of the node tasks it launched, read into the supervisor's lifecycle rows
(controller/slurm/srun.py): the lines are srun's own (Slurm 22.05 on the test cluster, copied from
batch outputs of tests/slurm_cluster.py runs), the rows go into a real store and are read back by
the crash rules' lifecycle functions, as `faultlens serve` reads them."""

from __future__ import annotations

import signal

import pandas as pd
import pytest

from faultlens.attribution.detectors.crash import lost_agents, teardown_starts
from faultlens.attribution.reading.store import Store
from faultlens.controller.slurm.srun import (
    SrunWatch,
    TaskEnd,
    Teardown,
    open_recorder,
    parse_line,
)

# a node lost while its slurmstepd lived (its task killed with everything under it), then the
# step's teardown: what srun printed on the test cluster
NODE_TASK_KILLED = [
    "faultlens slurm: job sc-node-loss attempt 0 (Slurm job 8856) on node-[0-1]",
    "srun: error: node-1: task 1: Killed",
    "srun: launch/slurm: _step_signal: Terminating StepId=8856.0",
    "slurmstepd-node-0: error: *** STEP 8856.0 ON node-0 CANCELLED AT 2026-12-07T21:06:44 ***",
    "srun: error: node-0: task 0: Killed",
    "srun: Force Terminated StepId=8856.0",
]
# a rank's exception: its node task exits 1, srun stops the step, the other node's task ends
EXCEPTION = [
    "srun: error: node-1: task 1: Exited with exit code 1",
    "srun: launch/slurm: _step_signal: Terminating StepId=6.0",
    "srun: error: node-0: task 0: Terminated",
]
# the job requeued by a decision: Slurm stops the step from outside
REQUEUED = [
    "srun: got SIGCONT",
    "srun: forcing job termination",
    "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.",
    "srun: error: node-0: task 0: Terminated",
    "srun: error: node-1: task 1: Killed",
]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("srun: error: node-1: task 1: Killed", TaskEnd("node-1", None, signal.SIGKILL, "")),
        ("srun: error: node-0: task 0: Terminated", TaskEnd("node-0", None, signal.SIGTERM, "")),
        (
            "srun: error: gpu-a17: tasks 0-3: Segmentation fault (core dumped)",
            TaskEnd("gpu-a17", None, signal.SIGSEGV, ""),
        ),
        ("srun: error: node-1: task 1: Exited with exit code 1", TaskEnd("node-1", 1, None, "")),
        (
            "srun: error: node-3: tasks 4,6: Exited with exit code 137",
            TaskEnd("node-3", 137, None, ""),
        ),
    ],
)
def test_a_task_end_names_its_node_and_how_it_ended(line, expected):
    got = parse_line(line + "\n")
    assert isinstance(got, TaskEnd)
    assert (got.node, got.exit_code, got.signal) == (
        expected.node,
        expected.exit_code,
        expected.signal,
    )
    assert got.line == line


@pytest.mark.parametrize(
    "line",
    [
        "srun: launch/slurm: _step_signal: Terminating StepId=8856.0",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
        "srun: forcing job termination",
        "srun: Force Terminated StepId=9.0",
    ],
)
def test_the_steps_teardown_is_read(line):
    assert isinstance(parse_line(line), Teardown)


@pytest.mark.parametrize(
    "line",
    [
        "srun: got SIGCONT",
        "faultlens slurm: node-0: 4 process event(s) stored",
        "srun: error: Unable to create step for job 12: Invalid generic resource",
        "srun: error: node-1: task 1: something srun never says",
        "",
    ],
)
def test_other_lines_are_no_event(line):
    assert parse_line(line) is None


def _rows(tmp_path, lines, attempt=0):
    store = str(tmp_path / "store")
    recorder = open_recorder(store, "job-a")
    watch = SrunWatch(recorder, attempt, srun_pid=4242)
    for line in lines:
        watch.line(line)
    with Store(store) as opened:
        table = opened.query("SELECT * FROM process_events ORDER BY ts")
    return watch, table.to_pandas()


def test_a_node_task_killed_before_the_teardown_is_a_lost_agent(tmp_path):
    watch, events = _rows(tmp_path, NODE_TASK_KILLED)
    assert [e.node for e in watch.ends] == ["node-1", "node-0"]
    assert list(events["kind"]) == ["agent_exit", "signal_sent", "agent_exit"]
    assert set(events["source"]) == {"supervisor"}
    lost = lost_agents(events)
    assert list(lost) == [("job-a", 0)]
    # node-0's task, killed by the teardown srun began, is no lost agent
    assert [(node, sig) for node, _, sig, _ in lost[("job-a", 0)]] == [("node-1", "SIGKILL")]
    assert ("job-a", 0) in teardown_starts(events)


def test_a_rank_failure_and_a_requeue_lose_no_agent(tmp_path):
    _, events = _rows(tmp_path / "exc", EXCEPTION)
    failed = events[events["kind"] == "agent_exit"].iloc[0]
    assert failed["node"] == "node-1" and failed["exit_code"] == 1 and pd.isna(failed["signal"])
    assert lost_agents(events) == {}
    _, events = _rows(tmp_path / "requeue", REQUEUED, attempt=3)
    assert lost_agents(events) == {}
    assert list(teardown_starts(events)) == [("job-a", 3)]


def test_no_store_records_nothing_and_never_raises():
    watch = SrunWatch(open_recorder(None, "job-a"), 0, srun_pid=1)
    for line in NODE_TASK_KILLED:
        watch.line(line)
    assert watch.tore_down and len(watch.ends) == 2
