"""Progress judged against the peers (issue 33), under `faultlens run` on a user's own DDP script
(tests/torch_jobs/user_scripts/ddp_eval_save.py: an evaluation with an all_reduce of its metric and
a checkpoint save with a barrier; gloo on CPU, 2 simulated nodes x 2 ranks, real torchrun agents):

- a rank stopped in the attempt's first evaluation (asleep) or first save (waiting on a lock) while
  its peers are blocked in the collective after it: no rank works, so the untimed phase's 600 s
  allowance is withheld; the hang is caught at the normal floor (passed in: 4 s) and the dumps name
  the rank that never joined, failed over;
- a rank whose first save is slow but writing (a slow disk) while its peers wait in the barrier
  keeps the allowance: the job finishes with no incident.

The whole family (read / lock / sleep, eval / save, with and without a CPU hog) and the time to a
decision: bench/bench_first_phase_hang.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.attribution.reading.store import Store
from tests.conftest import REPO_ROOT
from tests.faultlens_cli import decisions, faultlens_run
from tests.run_pool import ModuleJobs, jobs_fixture

pytest.importorskip("torch")

SCRIPT = REPO_ROOT / "tests" / "torch_jobs" / "user_scripts" / "ddp_eval_save.py"
SHORT = {"STEPS": "12", "EVAL_EVERY": "6", "SAVE_EVERY": "6", "TIMEOUT": "300"}


def thresholds(tmp_path: Path, floor_s: float = 4.0) -> Path:
    """The shipped thresholds with a shorter hang floor (the allowance stays 600 s)."""
    text = (REPO_ROOT / "rules" / "thresholds.yaml").read_text()
    assert "\n  floor_s: 10.0\n" in text
    path = tmp_path / "thresholds.yaml"
    path.write_text(text.replace("\n  floor_s: 10.0\n", f"\n  floor_s: {floor_s}\n", 1))
    return path


def evidence(store_dir: Path, job: str) -> list[str]:
    with Store(store_dir) as store:
        return [
            r["t"]
            for r in store.query(
                "SELECT unnest(evidence).text AS t FROM incidents WHERE job_id = ?", [job]
            ).to_pylist()
        ]


STOPPED = [("eval", "sleep", 2, "node-1"), ("save", "lock", 1, "node-0")]


def _stopped_run(where: str, how: str, rank: int):  # type: ignore[no-untyped-def]
    def run(directory: Path):  # type: ignore[no-untyped-def]
        return faultlens_run(
            directory,
            f"first-{where}-{how}",
            [str(SCRIPT)],
            options=("--thresholds", str(thresholds(directory)), "--max-attempts", "1"),
            env={**SHORT, "HANG_RANK": str(rank), "HANG_IN": where, "HANG_HOW": how,
                 "CKPT_DIR": str(directory / "ckpt")},
        )
    return run


def _slow_save_run(directory: Path):  # type: ignore[no-untyped-def]
    return faultlens_run(
        directory,
        "slow-save",
        [str(SCRIPT)],
        options=("--thresholds", str(thresholds(directory)),),
        env={**SHORT, "SLOW_SAVE_RANK": "2", "SLOW_SAVE_S": "12", "SLOW_SAVE_HOW": "io",
             "CKPT_DIR": str(directory / "ckpt")},
    )


# the three jobs start together, two at a time (each mostly waits: a hang floor, the dumps, a slow
# save)
JOBS = ModuleJobs({
    **{
        f"test_a_rank_stopped_in_its_first_slow_phase_is_caught_at_the_normal_floor"
        f"[{where}-{how}-{rank}-{node}]": _stopped_run(where, how, rank)
        for where, how, rank, node in STOPPED
    },
    "test_a_slow_save_that_keeps_writing_is_not_a_hang": _slow_save_run,
})
jobs = jobs_fixture(JOBS, "first-phase")


@pytest.mark.parametrize(("where", "how", "rank", "node"), STOPPED)
def test_a_rank_stopped_in_its_first_slow_phase_is_caught_at_the_normal_floor(
    jobs, request, where, how, rank, node
):
    job = f"first-{where}-{how}"
    (proc, _), directory = jobs.result(request)
    out = proc.stdout + proc.stderr
    said = f"collective_hang / unknown on {node} ranks [{rank}] (hang-never-joined"
    assert said in out, out[-4000:]
    made = decisions(directory / "store", job)
    assert [(d["action"], d["exclude_nodes"]) for d in made] == [("failover", [node])], made
    texts = evidence(directory / "store", job)
    # judged at the normal window, the allowance withheld because nobody worked
    assert any("every rank idle together" in t and "allowance withheld" in t for t in texts), texts
    assert not any("slow-phase floor 600s" in t for t in texts), texts
    assert any("stop_here" in t for t in texts), texts  # the stuck rank's own stack


def test_a_slow_save_that_keeps_writing_is_not_a_hang(jobs, request):
    job = "slow-save"
    (proc, _), directory = jobs.result(request)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "attempt 0: training completed" in out, out[-4000:]
    assert decisions(directory / "store", job) == []
    assert evidence(directory / "store", job) == []
