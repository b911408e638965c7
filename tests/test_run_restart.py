"""Issue 33 under `faultlens run`, on a user's own DDP job (tests/torch_jobs/user_faults.py, gloo on
CPU, 2 simulated nodes x 2 ranks, real torchrun agents):

- a one-off exception of one rank (rank 0 at step 2, rank 3 at step 8) is restarted in place: the
  same nodes, nothing excluded, resumed from the newest checkpoint, and the job finishes;
- the same exception again after the restart is escalated: the job stops for a human;
- every rank failing the same way before step 0 is a job error naming no node (no restart);
- a script that exits 1 at once or whose import fails is a job error with the script's own error
  and stderr shown; one that does not exist or does not compile is refused before launch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.faultlens_cli import decisions, faultlens_run, job_state, last_steps
from tests.run_pool import ModuleJobs, jobs_fixture

pytest.importorskip("torch")

SCRIPT = REPO_ROOT / "tests" / "torch_jobs" / "user_faults.py"


ONE_OFF = [(3, 8), (0, 2)]
START_FAILURES = [
    pytest.param(
        "import sys\n"
        'print("config file not found: ./cfg.yaml", file=sys.stderr)\n'
        "sys.exit(1)\n",
        "config file not found: ./cfg.yaml",
        id="exits-1",
    ),
    pytest.param(
        "import os\nimport no_such_package_xyz\n",
        "ModuleNotFoundError: No module named 'no_such_package_xyz'",
        id="import-fails",
    ),
]


def _one_off(rank: int, step: int):  # type: ignore[no-untyped-def]
    def run(directory: Path):  # type: ignore[no-untyped-def]
        return faultlens_run(
            directory,
            f"oneoff-r{rank}-s{step}",
            [
                str(SCRIPT),
                "--steps",
                "12",
                "--raise-rank",
                str(rank),
                "--raise-step",
                str(step),
                "--once-file",
                str(directory / "flaky.done"),
            ],
        )
    return run


def _twice(directory: Path):  # type: ignore[no-untyped-def]
    return faultlens_run(
        directory,
        "twice",
        [
            str(SCRIPT),
            "--steps",
            "12",
            "--raise-rank",
            "1",
            "--raise-step",
            "5",
            "--raise-type",
            "ValueError",
            "--raise-message",
            "shape mismatch in batch",
        ],
    )


def _start_error(directory: Path):  # type: ignore[no-untyped-def]
    return faultlens_run(directory, "start-error", [str(SCRIPT), "--start-error"])


def _broken(source: str):  # type: ignore[no-untyped-def]
    def run(directory: Path):  # type: ignore[no-untyped-def]
        script = directory / "train.py"
        script.write_text(source)
        return faultlens_run(directory, "broken", [str(script), "--lr", "0.1"])
    return run


# the module's launched jobs start together, two at a time (tests/run_pool.py), the two-attempt
# ones first
JOBS = ModuleJobs({
    **{
        f"test_a_one_off_exception_is_restarted_in_place_and_the_job_finishes[{rank}-{step}]":
            _one_off(rank, step)
        for rank, step in ONE_OFF
    },
    "test_the_same_exception_again_is_escalated": _twice,
    "test_every_rank_failing_before_step_0_is_a_job_error": _start_error,
    **{
        f"test_a_script_that_fails_at_start_is_a_job_error[{param.id}]": _broken(param.values[0])
        for param in START_FAILURES
    },
})
jobs = jobs_fixture(JOBS, "restart")


@pytest.mark.parametrize(("rank", "step"), ONE_OFF)
def test_a_one_off_exception_is_restarted_in_place_and_the_job_finishes(jobs, request, rank, step):
    job = f"oneoff-r{rank}-s{step}"
    (proc, _), tmp_path = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "training completed" in out and "restart in place" in out
    made = decisions(tmp_path / "store", job)
    assert [d["action"] for d in made] == ["restart"], made
    assert made[0]["exclude_nodes"] == [] and made[0]["status"] == "applied"
    # resumed from a checkpoint before the failure (none before step 2: from scratch)
    assert (made[0]["restore_step"] is None) == (step < 3)
    assert last_steps(tmp_path / "store", job) == {0: 11, 1: 11, 2: 11, 3: 11}
    # both attempts on the same two nodes
    assert out.count("starting on node-0, node-1") == 2
    # the end summary is the store's: the restart, applied, nothing excluded
    assert f"job {job}: completed after 2 attempt(s); state completed; 1 incident(s)" in proc.stdout
    assert "decision  restart [applied], excluded nothing" in proc.stdout
    assert job_state(tmp_path / "store", job) == "completed"


def test_the_same_exception_again_is_escalated(jobs, request):
    job = "twice"
    (proc, _), tmp_path = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    made = decisions(tmp_path / "store", job)
    assert [d["action"] for d in made] == ["restart", "escalate"], made
    assert all(d["exclude_nodes"] == [] for d in made)
    assert "escalated to a human" in out
    assert "decision  escalate [applied], excluded nothing" in proc.stdout
    assert job_state(tmp_path / "store", job) == "stopped"


def test_every_rank_failing_before_step_0_is_a_job_error(jobs, request):
    job = "start-error"
    (proc, _), tmp_path = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "job error (no node to blame)" in out
    assert "KeyError: 'model.hidden_size'" in out
    # stopped at once: no restart, no failover, no node excluded
    assert "attempt 1" not in out
    assert decisions(tmp_path / "store", job) == []
    assert job_state(tmp_path / "store", job) == "failed"


@pytest.mark.parametrize(("source", "expected"), START_FAILURES)
def test_a_script_that_fails_at_start_is_a_job_error(jobs, request, source, expected):
    (proc, _), tmp_path = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "job error (no node to blame)" in out and expected in out
    assert "failover" not in out and "attempt 1" not in out
    assert decisions(tmp_path / "store", "broken") == []


@pytest.mark.parametrize(
    ("name", "source", "expected"),
    [
        ("missing.py", None, "missing.py: no such file"),
        ("syntax.py", "import torch\ndef main(:\n    pass\n", "SyntaxError: invalid syntax"),
        ("indent.py", "def main():\nreturn 1\n", "IndentationError"),
    ],
)
def test_a_script_that_cannot_run_is_refused_before_launch(tmp_path, name, source, expected):
    if source is not None:
        (tmp_path / name).write_text(source)
    proc, _ = faultlens_run(tmp_path, "refused", [name])
    assert proc.returncode == 1
    assert proc.stderr.startswith("faultlens run: job error (no node to blame)")
    assert expected in proc.stderr
    assert not (tmp_path / "work").exists()  # nothing launched
