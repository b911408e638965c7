"""The demo job without a supervisor (plain torchrun, bench/bench_demo_vs_torchrun.py): faults per
torchrun restart, resuming by itself from the newest checkpoint every rank can load, and the bench's
lineage / lost-steps arithmetic.
"""

import datetime as dt
import json
import os
import socket
from pathlib import Path

import pytest

from bench.bench_demo_vs_torchrun import AttemptSteps, ettr_figures, lineage, plain_schedule
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiered import TieredCheckpointer, shard_name, step_dir_name
from faultlens.controller.demo.faults import Fault, FaultKind, faults_from_env
from faultlens.controller.demo.resume import loadable, rank_tiers, resume_latest

SCHEDULE = json.dumps(
    [
        [
            {"kind": "straggler", "step": 6, "rank": 3, "extra_s": 0.25},
            {"kind": "hang", "step": 17, "rank": 1},
        ],
        {"kind": "sigkill", "step": 6, "rank": 2, "relative": True},
    ]
)


def test_faults_follow_torchrun_restart_count():
    first = faults_from_env({"FAULTLENS_DEMO_FAULTS": SCHEDULE, "TORCHELASTIC_RESTART_COUNT": "0"})
    assert [(f.kind, f.step, f.rank) for f in first] == [
        (FaultKind.STRAGGLER, 6, 3),
        (FaultKind.HANG, 17, 1),
    ]
    (kill,) = faults_from_env(
        {"FAULTLENS_DEMO_FAULTS": SCHEDULE, "TORCHELASTIC_RESTART_COUNT": "1"}
    )
    assert kill.kind is FaultKind.SIGKILL and kill.relative
    assert kill.resolved(16).step == 22 and not kill.resolved(16).relative
    assert first[0].resolved(16).step == 6  # absolute steps stay
    assert (
        faults_from_env({"FAULTLENS_DEMO_FAULTS": SCHEDULE, "TORCHELASTIC_RESTART_COUNT": "2"})
        == ()
    )


def test_supervisor_fault_is_unchanged_and_comes_first():
    single = Fault(FaultKind.SOFTWARE, step=26)
    assert Fault.from_json(single.to_json()) == single
    faults = faults_from_env({"FAULTLENS_DEMO_FAULT": single.to_json()})
    assert faults == (single,)
    # no "relative"
    legacy = '{"kind": "gpu_lost", "step": 22, "rank": null, "node": "node-4", "extra_s": 0.0}'
    assert faults_from_env({"FAULTLENS_DEMO_FAULT": legacy})[0] == Fault(
        FaultKind.GPU_LOST, 22, node="node-4"
    )


@pytest.mark.parametrize("value", ["{not json", '{"kind": "hang"}', "[1, 2]"])
def test_malformed_schedule_names_the_variable(value):
    with pytest.raises(ValueError, match="FAULTLENS_DEMO_FAULTS"):
        faults_from_env({"FAULTLENS_DEMO_FAULTS": value, "TORCHELASTIC_RESTART_COUNT": "0"})


def test_plain_schedule_keeps_node_faults_on_every_restart():
    schedule = plain_schedule(3, hang_step=17)
    kinds = [[f["kind"] for f in item] for item in schedule]
    assert kinds == [["straggler", "hang"], ["straggler", "sigkill"], ["straggler", "gpu_lost"],
                     # the lost GPU is still lost; the bug is never reached
                     ["straggler", "gpu_lost"]]
    assert schedule[0][1]["step"] == 17 and not schedule[0][1]["relative"]
    # still hot from the start
    assert all(item[0]["relative"] and item[0]["step"] == 0 for item in schedule[1:])
    assert schedule[3][1] == {**schedule[2][1], "step": 0}
    assert [f["kind"] for f in plain_schedule(5, 17)[-1]] == ["straggler", "gpu_lost"]


def test_lineage_walks_back_through_the_resume_steps():
    def attempt(number, first, last, seconds=1.0):
        return AttemptSteps(number, first, last, {s: seconds for s in range(first, last + 1)})

    attempts = {
        0: attempt(0, 0, 19),
        1: attempt(1, 11, 16, 2.0),
        2: attempt(2, 16, 21),
        4: attempt(4, 21, 25),
    }
    kept = lineage(attempts, 25)
    assert kept == (
        [(0, s) for s in range(0, 11)]
        + [(1, s) for s in range(11, 16)]
        + [(2, s) for s in range(16, 21)]
        + [(4, s) for s in range(21, 26)]
    )
    figures = ettr_figures(attempts, 25, wall_s=50.0)
    assert figures["kept_steps"] == 26 and figures["computed_steps"] == 20 + 6 + 6 + 5
    assert figures["lost_steps"] == 37 - 26
    assert figures["productive_s"] == 21 + 2 * 5 and figures["ettr"] == round(31 / 50, 4)
    assert lineage(attempts, None) == [] and ettr_figures(attempts, None, 10.0)["lost_steps"] == 37


# ----------------------------------------------------------------------------------------------
# resume_latest


def _write_checkpoints(root: Path) -> None:
    """2 nodes x 2 ranks, local every 5, durable every 10, written by the real tiered checkpointer;
    node-1 died before its step-20 shards (node-0's local step 20 is complete, the durable step 20
    is not)."""
    pytest.importorskip("torch")
    checkpointers = [
        TieredCheckpointer(
            local=str(root / f"node-{rank // 2}" / "ckpt"),
            rank=rank,
            world_size=4,
            local_rank=rank % 2,
            local_world_size=2,
            durable=str(root / "durable"),
            every_local=5,
            every_durable=10,
            node=f"node-{rank // 2}",
            commit_timeout_s=1.0,
        )
        for rank in range(4)
    ]
    for step in (5, 10, 15, 20):
        for rank, ckpt in enumerate(checkpointers):
            if step < 20 or rank < 2:
                ckpt.save(step, {"step": step, "rank": rank})
    for ckpt in checkpointers:
        ckpt.close(timeout=10)


def _corrupt(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    shard.write_bytes(bytes(data))


def _resume_worker(process: int, root: str, port: int, out: str) -> None:
    """One rank of each node resumes; then rank 2's step-15 shard is corrupted and both resume
    again.
    """
    import torch.distributed as dist

    rank = (0, 2)[process]  # the checkpoints hold 4 ranks; one process per node is enough to agree
    node = f"node-{rank // 2}"
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=process,
        world_size=2,
        timeout=dt.timedelta(seconds=30),
    )
    results = []
    for _ in range(2):
        catalog = CheckpointCatalog(rank_tiers(f"{root}/{node}/ckpt", f"{root}/durable", node))
        step, state = resume_latest(catalog, rank)
        results.append({"step": step, "state": state, "own": sorted(loadable(catalog, rank))})
        dist.barrier()
        if rank == 2:
            _corrupt(Path(root, node, "ckpt", step_dir_name(15), shard_name(2)))
        dist.barrier()
    Path(out, f"{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_ranks_agree_on_the_newest_checkpoint_all_can_load_and_skip_a_corrupt_one(tmp_path):
    import torch.multiprocessing as mp

    root = tmp_path / "ckpt"
    _write_checkpoints(root)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(
        _resume_worker, args=(str(root), port, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    (first0, again0), (first2, again2) = (
        json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 2)
    )
    assert first0["own"] == [10, 15, 20] and first2["own"] == [10, 15]  # node-1 never wrote step 20
    assert (first0["step"], first0["state"]) == (15, {"step": 15, "rank": 0})
    assert (first2["step"], first2["state"]) == (15, {"step": 15, "rank": 2})
    # rank 2's step-15 shard no longer matches its checksum: every rank falls back to step 10
    assert (again0["step"], again2["step"]) == (10, 10)
    assert again2["state"] == {"step": 10, "rank": 2} and again0["state"] == {"step": 10, "rank": 0}
    assert not os.environ.get("FAULTLENS_RESUME_LATEST")
