"""A small pipeline-parallel training job (gloo, CPU) with data-parallel replicas, as a user would
write it with Megatron-style timer names, that can be made slow in chosen places.

    python -m torch.distributed.run --nproc-per-node 8 train_pipeline.py CONFIG_JSON

CONFIG_JSON: {"store": DIR, "replicas": D, "stages": P, "microbatches": M, "steps": N,
"ranks_per_node": K, "base_s": seconds of "device" work per microbatch and pass, "slow":
[{"replica": d or null, "stage": p or null, "section": "forward-compute" | "backward-compute",
"extra_s": seconds, "from_step": k, "to_step": k2 (exclusive, optional), "background": true
(optional: a standing slowness, not the one measured)}, ...], "total_steps": N (optional: the length
the job declares to the step timer)}. A slow "forward-send" is a slow pipeline link: the extra sleep
is spent in the sender's send section (communication, not compute). CONFIG_JSON may instead hold
{"replicas", "stages", "ranks_per_node", "cases": [{"job": JOB_ID, "store", "timings",
"microbatches", "steps", "base_s", "slow", "total_steps"}, ...]}: the cases run one after the other
in the same processes and process group (a barrier between them), each with its own step timer, job
id, store and timer log, so several cases pay one start-up (importing torch in 8 processes costs
more than a case's steps).

Rank r is replica r // P, stage r % P, on node "node-<r // K>". Every step runs a GPipe schedule: M
microbatch forwards (recv from the previous stage, compute, send to the next), M backwards in
reverse, then the gradients are all_reduced across the replicas of each stage (a sub-group per
stage), then a tiny optimizer step. Device work is a sleep of base_s (a GPU kernel costs the host no
CPU; sleeping keeps the timing honest on a loaded CPU) plus a real small matmul; slowness is extra
sleep in the chosen section of the chosen ranks ("null" = every replica or every stage). Sections
are timed with the step timer into the store, ranks declare dp_rank/pp_rank. With "timings": DIR
every rank also writes the raw timer log a user would export (DIR/rank_<r>.csv: global_rank,
iteration, timer, start_ns, elapsed_ms, one row per section instance, so once per microbatch) and
rank 0 the placement (DIR/placement.csv: global_rank, host, data_parallel_rank, pipeline_rank).
"""

from __future__ import annotations

import contextlib
import csv
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from faultlens.collectors.training.step_timer import ParallelCoords, RankIdentity, StepTimer

WIDTH = 32


def main() -> None:
    config = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    replicas, stages = int(config["replicas"]), int(config["stages"])
    if replicas * stages != world:
        raise SystemExit(f"replicas x stages = {replicas * stages}, world size {world}")
    groups = [dist.new_group([d * stages + p for d in range(replicas)]) for p in range(stages)]
    for case in config.get("cases") or [config]:
        run_case(case, rank, world, replicas, stages, int(config.get("ranks_per_node", 1)), groups)
        dist.barrier()
    dist.destroy_process_group()


def run_case(
    config: dict, rank: int, world: int, replicas: int, stages: int, per_node: int, groups: list
) -> None:
    """One case: `config["steps"]` GPipe steps, timed into the case's store under its job id."""
    micro = int(config["microbatches"])
    replica, stage = divmod(rank, stages)
    base = float(config["base_s"])
    slow = [s for s in config.get("slow", [])
            if s.get("replica") in (None, replica) and s.get("stage") in (None, stage)]
    dp_group = groups[stage]
    identity = RankIdentity.from_env(node=f"node-{rank // per_node}",
                                     **({"job_id": config["job"]} if config.get("job") else {}))
    timer = StepTimer.from_env(
        store=config["store"], flush_interval_s=0.5, identity=identity,
        parallel=ParallelCoords(dp_rank=replica, pp_rank=stage, tp_rank=0, pp_size=stages),
        total_steps=config.get("total_steps"))
    torch.manual_seed(7 + stage)
    weight = torch.randn(WIDTH, WIDTH, requires_grad=True)
    log: list[tuple[int, int, str, int, float]] = []
    current = {"step": 0}

    @contextlib.contextmanager
    def section(name: str):
        began = time.time_ns()
        with timer.section(name):
            yield
        log.append((rank, current["step"], name, began, (time.time_ns() - began) / 1e6))

    def extra_s(section: str, step: int) -> float:
        return sum(float(s["extra_s"]) for s in slow if s["section"] == section
                   and int(s.get("from_step", 0)) <= step < int(s.get("to_step") or 1 << 62))

    def device_work(section: str, step: int) -> None:
        time.sleep(base + extra_s(section, step))

    prev_rank, next_rank = (
        (rank - 1 if stage > 0 else None),
        (rank + 1 if stage < stages - 1 else None),
    )
    try:
        for step in range(int(config["steps"])):
            current["step"] = step
            with timer.step(step, samples=micro):
                saved = []
                for _ in range(micro):
                    act = torch.zeros(4, WIDTH)
                    if prev_rank is not None:
                        with section("forward-recv"):
                            dist.recv(act, src=prev_rank)
                    else:
                        with section("batch-generator"):
                            act = torch.randn(4, WIDTH)
                    with section("forward-compute"):
                        device_work("forward-compute", step)
                        out = torch.tanh(act @ weight)
                        saved.append((act, out))
                    if next_rank is not None:
                        with section("forward-send"):
                            link = extra_s("forward-send", step)
                            if link:
                                time.sleep(link)  # a slow link: the transfer takes longer
                            dist.send(out.detach(), dst=next_rank)
                weight.grad = None
                for _act, out in reversed(saved):
                    grad = torch.ones(4, WIDTH)
                    if next_rank is not None:
                        with section("backward-recv"):
                            dist.recv(grad, src=next_rank)
                    with section("backward-compute"):
                        device_work("backward-compute", step)
                        out.backward(grad)
                        grad_in = (grad * (1 - out.detach() ** 2)) @ weight.detach().t()
                    if prev_rank is not None:
                        with section("backward-send"):
                            dist.send(grad_in.contiguous(), dst=prev_rank)
                with section("all-grads-sync"):
                    dist.all_reduce(weight.grad, group=dp_group)
                with section("optimizer"), torch.no_grad():
                    weight -= 1e-4 * weight.grad / replicas
    finally:
        timer.close()
    if config.get("timings"):
        out = Path(config["timings"])
        out.mkdir(parents=True, exist_ok=True)
        with open(out / f"rank_{rank}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["global_rank", "iteration", "timer", "start_ns", "elapsed_ms"])
            writer.writerows(log)
        if rank == 0:
            with open(out / "placement.csv", "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["global_rank", "host", "data_parallel_rank", "pipeline_rank"])
                writer.writerows(
                    [r, f"node-{r // per_node}", r // stages, r % stages] for r in range(world)
                )


if __name__ == "__main__":
    main()
