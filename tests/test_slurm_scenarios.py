"""Scenario kinds of the Slurm campaign (bench/bench_slurm.py runs them all) on the real cluster,
with `faultlens serve`, the Slurm hook and the Alertmanager pager, scored on Slurm's own records:
Xid 79 through the recorded NVML backend on one node's agent (`faultlens slurm run --agent-sources
nvml --agent-nvml-timeline`): the job is requeued excluding that node, the node drained, and the
job finishes elsewhere from the newest checkpoint before the fault; node loss: failed over, the
lost node drained, no survivor.
"""

from __future__ import annotations

import subprocess

import pytest

from bench.bench_slurm import SCENARIOS, cli_on_path, run_scenario, start_serve

pytest.importorskip("torch")
BY_NAME = {sc.name: sc for sc in SCENARIOS}


@pytest.fixture
def served(slurm, tmp_path):
    serve = start_serve(slurm, tmp_path)
    try:
        yield slurm, tmp_path, cli_on_path(tmp_path / "bin")
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()


def test_xid79_on_one_nodes_agent_fails_over_excluding_that_node(served):
    slurm, root, bin_dir = served
    row = run_scenario(slurm, BY_NAME["xid79"], root, bin_dir)
    assert row["observed"] == "failover" and row["right"], row
    node = slurm.node("node-1")
    assert "DRAIN" in node["State"] and "faultlens failover" in node["Reason"]
    assert "hardware evidence" in node["Reason"]
    assert row["finished"] and row["restored_right"] and row["healthy_drained"] == 0



def test_node_loss_fails_over_the_lost_node_and_drains_no_survivor(served):
    """The node's slurmd, its slurmstepd and its job step SIGKILLed together while its peers train:
    the survivors die on the closed connections, the lost node (its ranks' heartbeats stopped
    together, nothing of it reported) is the culprit, failed over; the survivors' node stays up."""
    slurm, root, bin_dir = served
    row = run_scenario(slurm, BY_NAME["node-loss"], root, bin_dir, until_action=True)
    assert row["observed"] == "failover", row
    assert row["healthy_drained"] == 0, row
    node = slurm.node("node-1")
    assert "DRAIN" in node["State"] and "faultlens failover" in node["Reason"]
    assert "DRAIN" not in slurm.node("node-0")["State"]
