"""Issue 33 under `faultlens run` on a user's own DDP job (tests/torch_jobs/user_faults.py, gloo on
CPU, 2 simulated nodes x 2 ranks, real torchrun agents):

- a rank whose data ends early returns (exit 0) while its peers go on and fail in the next
  collective: the rank that left is named (with the step it left after), cause software,
  escalated; not a crash of nobody;
- a DataLoader worker of one rank SIGKILLed on its host ("DataLoader worker (pid N) is killed by
  signal: Killed"): the rank and its node named, not a host OOM of no node; restarted in place the
  first time, and the job finishes.
"""

from __future__ import annotations

import pytest

from tests.test_run_restart import SCRIPT, decisions, faultlens_run, job_state

pytest.importorskip("torch")


@pytest.mark.parametrize(("rank", "after", "node"), [(3, 6, "node-1"), (0, 3, "node-0")])
def test_a_rank_that_leaves_early_is_the_one_named(tmp_path, rank, after, node):
    job = f"left-r{rank}"
    proc, _ = faultlens_run(
        tmp_path,
        job,
        [str(SCRIPT), "--steps", "14", "--leave-rank", str(rank), "--leave-after", str(after)],
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert f"crash / software on {node} ranks [{rank}] (crash-rank-left-early" in out
    assert f"rank {rank} on {node} left after step {after}" in out
    made = decisions(tmp_path / "store", job)
    assert [d["action"] for d in made] == ["escalate"] and made[0]["exclude_nodes"] == []
    assert job_state(tmp_path / "store", job) == "stopped"


def test_a_killed_dataloader_worker_is_restarted_in_place(tmp_path):
    job = "dataloader"
    proc, _ = faultlens_run(
        tmp_path,
        job,
        [
            str(SCRIPT),
            "--steps",
            "12",
            "--workers",
            "1",
            "--kill-worker-rank",
            "2",
            "--kill-worker-step",
            "5",
            "--once-file",
            str(tmp_path / "killed.once"),
        ],
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "crash / unknown on node-1 ranks [2] (dataloader-worker-killed" in out
    made = decisions(tmp_path / "store", job)
    assert [(d["action"], d["exclude_nodes"], d["status"]) for d in made] == [
        ("restart", [], "applied")
    ]
    assert job_state(tmp_path / "store", job) == "completed"
