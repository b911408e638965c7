"""Straggler scenarios at scale on the simulator's step timing (controller/lab/simulate/timing/): a
job of N nodes x G GPUs (tensor parallel inside a node, pipeline stages across nodes, data-parallel
replicas, Megatron's order) runs `steps` steps with one of
- worker: one GPU slow from `onset` (its tensor-parallel peers wait for it: the node is slow);
- stage: one pipeline stage slow in every replica from the start (a heavier stage by design);
- replica: every node of one replica slow from `onset` (a switch the replica's nodes share);
- jitter: a CPU hog beside a healthy job: one-off slow steps on random GPUs, several per step;
- healthy: nothing.
`write_case` writes the ranks and steps rows into a store through the real SegmentSink and returns
the truth.

    python -m faultlens.controller.lab.simulate.straggler_cases STORE CASE [--nodes 128 --gpus 8
    --stages 4 --steps 500]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import dataclass, field

import numpy as np

from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.lab.simulate.cluster import Placement, make_nodes
from faultlens.controller.lab.simulate.timing import NS, Slowdown, Spike, StepTimer

CASES = ("worker", "stage", "replica", "jitter", "healthy")
START = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)


@dataclass(frozen=True)
class CaseTruth:
    case: str
    world_size: int
    replicas: int
    stages: int
    nodes: tuple[str, ...] = ()  # the nodes to blame (worker)
    ranks: tuple[int, ...] = ()  # the slow ranks
    stage: int | None = None
    replica: int | None = None
    factor: float = 1.0
    extra: dict = field(default_factory=dict)


def write_case(
    store: str,
    case: str,
    *,
    nodes: int = 128,
    gpus: int = 8,
    stages: int = 4,
    steps: int = 500,
    step_seconds: float = 6.0,
    onset: int = 100,
    factor: float = 1.3,
    seed: int = 0,
    job_id: str | None = None,
    total_steps: int | None = 100_000,
) -> CaseTruth:
    """`total_steps`: the length the simulated job declares (its ranks rows; None: none declared),
    of which the first `steps` are written."""
    if case not in CASES:
        raise ValueError(f"case {case!r}: expected one of {', '.join(CASES)}")
    rng = np.random.default_rng([seed, 13])
    node_list = make_nodes(nodes, gpus, rng)
    placement = Placement(tuple(node_list), gpus, stages)
    start_ns = int(START.timestamp() * NS)
    t_onset = start_ns + int(onset * step_seconds * NS)
    end_ns = start_ns + int(steps * step_seconds * 1.6 * NS)
    slowdowns: list[Slowdown] = []
    spikes: list[Spike] = []
    truth = CaseTruth(case, placement.world_size, placement.dp_size, stages)
    if case == "worker":
        slot = int(rng.integers(0, nodes))
        gpu = int(rng.integers(0, gpus))
        node = node_list[slot]
        slowdowns.append(Slowdown(t_onset, end_ns, factor, node=node.name, gpu=gpu))
        truth = CaseTruth(
            case,
            placement.world_size,
            placement.dp_size,
            stages,
            (node.name,),
            tuple(placement.ranks_of_node(node.name)),
            factor=factor,
            extra={"gpu": gpu},
        )
    elif case == "stage":
        stage = stages - 1
        slowdowns.append(Slowdown(start_ns, end_ns, factor, stage=stage))
        truth = CaseTruth(
            case, placement.world_size, placement.dp_size, stages, stage=stage, factor=factor
        )
    elif case == "replica":
        replica = int(rng.integers(0, placement.dp_size))
        members = [p for p in placement.ranks() if p.dp_rank == replica]
        for name in sorted({p.node.name for p in members}):
            slowdowns.append(Slowdown(t_onset, end_ns, factor, node=name))
        truth = CaseTruth(case, placement.world_size, placement.dp_size, stages,
                          ranks=tuple(p.rank for p in members), replica=replica, factor=factor)
    elif case == "jitter":
        # a CPU hog beside the job: host-side stalls of the launch thread on random GPUs, a few per
        # step, each a few percent for one step (what the real job beside a hog shows:
        # tests/torch_jobs/straggler_jobs.py)
        times = np.sort(
            rng.uniform(start_ns, start_ns + steps * step_seconds * NS, steps * 4)
        ).astype(np.int64)
        for t in times:
            node = node_list[int(rng.integers(0, nodes))]
            spikes.append(
                Spike(
                    int(t),
                    "rank_compute",
                    float(rng.uniform(1.02, 1.08)),
                    node=node.name,
                    gpu=int(rng.integers(0, gpus)),
                )
            )
    gpu_speed = {
        (n.name, g.index): float(np.clip(rng.normal(1.0, 0.012), 0.96, 1.04))
        for n in node_list
        for g in n.gpus
    }
    job = job_id or f"sim-{case}"
    timer = StepTimer(
        cluster="sim",
        job_id=job,
        step_seconds=step_seconds,
        checkpoint_every=0,
        eval_every=0,
        warmup_steps=5,
        day_origin_ns=start_ns,
        gpu_speed=gpu_speed,
    )
    ranks = [
        {
            "ts": START,
            "cluster": "sim",
            "node": p.node.name,
            "job_id": job,
            "attempt": 0,
            "rank": p.rank,
            "local_rank": p.local_rank,
            "gpu_index": p.gpu.index,
            "gpu_uuid": p.gpu.uuid,
            "pci_bus_id": p.gpu.pci_bus_id,
            "pid": 1000 + p.rank,
            "world_size": placement.world_size,
            "local_world_size": gpus,
            "hostname": p.node.name,
            "dp_rank": p.dp_rank,
            "pp_rank": p.pp_rank,
            "tp_rank": p.tp_rank,
            "cp_rank": 0,
            "ep_rank": 0,
            "pp_size": stages,
            "total_steps": total_steps,
        }
        for p in placement.ranks()
    ]
    with SegmentSink(store, flush_rows=10_000_000, flush_age_s=1e12) as sink:
        sink.write("ranks", ranks)
        timer.run(
            np.random.default_rng([seed, 3]),
            placement,
            0,
            0,
            start_ns,
            end_ns,
            slowdowns,
            spikes,
            [],
            sink.write,
            stop_at_step=steps,
        )
    return truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("store")
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    truth = write_case(args.store, args.case, nodes=args.nodes, gpus=args.gpus, stages=args.stages,
                       steps=args.steps, seed=args.seed)
    print(json.dumps(truth.__dict__, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
