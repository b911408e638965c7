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

from pathlib import Path

import pytest

from tests.faultlens_cli import decisions, faultlens_run, job_state
from tests.run_pool import ModuleJobs, jobs_fixture
from tests.test_run_restart import SCRIPT

pytest.importorskip("torch")


LEAVERS = [(3, 6, "node-1"), (0, 3, "node-0")]


def _leaver(rank: int, after: int):  # type: ignore[no-untyped-def]
    def run(directory: Path):  # type: ignore[no-untyped-def]
        return faultlens_run(
            directory,
            f"left-r{rank}",
            [str(SCRIPT), "--steps", "14", "--leave-rank", str(rank), "--leave-after", str(after)],
        )
    return run


def _dataloader(directory: Path):  # type: ignore[no-untyped-def]
    return faultlens_run(
        directory,
        "dataloader",
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
            str(directory / "killed.once"),
        ],
    )


# the three jobs start together, two at a time (tests/run_pool.py), the two-attempt one first
JOBS = ModuleJobs({
    "test_a_killed_dataloader_worker_is_restarted_in_place": _dataloader,
    **{
        f"test_a_rank_that_leaves_early_is_the_one_named[{rank}-{after}-{node}]":
            _leaver(rank, after)
        for rank, after, node in LEAVERS
    },
})
jobs = jobs_fixture(JOBS, "leavers")


@pytest.mark.parametrize(("rank", "after", "node"), LEAVERS)
def test_a_rank_that_leaves_early_is_the_one_named(jobs, request, rank, after, node):
    job = f"left-r{rank}"
    (proc, _), tmp_path = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert f"crash / software on {node} ranks [{rank}] (crash-rank-left-early" in out
    assert f"rank {rank} on {node} left after step {after}" in out
    made = decisions(tmp_path / "store", job)
    assert [d["action"] for d in made] == ["escalate"] and made[0]["exclude_nodes"] == []
    assert job_state(tmp_path / "store", job) == "stopped"


def test_a_killed_dataloader_worker_is_restarted_in_place(jobs, request):
    job = "dataloader"
    (proc, _), tmp_path = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "crash / unknown on node-1 ranks [2] (dataloader-worker-killed" in out
    made = decisions(tmp_path / "store", job)
    assert [(d["action"], d["exclude_nodes"], d["status"]) for d in made] == [
        ("restart", [], "applied")
    ]
    assert job_state(tmp_path / "store", job) == "completed"
