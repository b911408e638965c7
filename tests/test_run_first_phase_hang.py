"""Progress judged against the peers (issue 33), under `faultlens run` on a user's own DDP job
(tests/torch_jobs/user_faults.py, gloo on CPU, 2 simulated nodes x 2 ranks, a 300 s collective
timeout): a rank stuck in the attempt's first checkpoint while its peers are already inside the next
step (waiting for it in its all_reduce) gets no untimed-phase allowance (600 s): the normal hang
threshold holds, the dumps name it, it is failed over, and the job finishes on a spare.
"""

from __future__ import annotations

import pytest

from tests.test_run_restart import SCRIPT, decisions, faultlens_run

pytest.importorskip("torch")


def test_a_rank_stuck_in_its_first_checkpoint_is_caught_at_the_normal_floor(tmp_path):
    job = "first-ckpt"
    proc, _ = faultlens_run(
        tmp_path,
        job,
        [
            str(SCRIPT),
            "--steps",
            "16",
            "--ckpt-every",
            "10",
            "--timeout",
            "300",
            "--hang-rank",
            "2",
            "--once-file",
            str(tmp_path / "hung.once"),
        ],
        spares=1,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "collective_hang / unknown on node-1 ranks [2] (hang-never-joined" in out
    made = decisions(tmp_path / "store", job)
    assert [(d["action"], d["exclude_nodes"]) for d in made] == [("failover", ["node-1"])]
    from faultlens.attribution.reading.store import Store

    with Store(tmp_path / "store") as store:
        texts = [
            r["t"]
            for r in store.query(
                "SELECT unnest(evidence).text AS t FROM incidents WHERE job_id = ?", [job]
            ).to_pylist()
        ]
    # judged by the normal threshold (k x step time, floor), not the first-checkpoint allowance
    assert any("after step 10 (allowed" in t and "x recent step time" in t for t in texts), texts
    assert not any("first checkpoint step" in t for t in texts), texts
