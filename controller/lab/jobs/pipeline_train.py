"""A user's pipeline-parallel training script: the model split in stages along the ranks of a node,
activations and gradients passed with send/recv between neighbouring stages, gradients averaged over
each stage's data-parallel sub-group (new_group), loss reported over the world group. Gloo, CPU;
faultlens's step timer, flight-recorder trigger and tiered checkpointer; resumes from the restore
plan the supervisor hands it.

    faultlens run --nnodes 2 --nproc-per-node 2 -- controller/lab/jobs/pipeline_train.py --stages 2
    --steps 30

Rank layout: stage = rank % stages, data-parallel index = rank // stages.

The send/recv calls are timed in sections nested in forward and backward (`forward/recv`, ...): a
stage waiting for its neighbour has not computed, and without those sections a slow stage makes
every stage's forward grow by the same wait (measured: +0.10 s on both stages), which no timing can
tell from the whole job slowing down.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from faultlens import environment
from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import ParallelCoords, RankIdentity, StepTimer
from faultlens.controller.checkpoints.tiered import TieredCheckpointer
from faultlens.controller.restore import load_rank_state, load_restore_plan

WIDTH = 48


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="pipeline-parallel MLP training (gloo, CPU)")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--compute-s", type=float, default=0.03, help="extra compute per "
                                                                      "micro-batch and stage (s)")
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--durable-every", type=int, default=10)
    parser.add_argument("--flush-s", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    return parser.parse_args()


def stage_module(stage: int, stages: int) -> torch.nn.Module:
    torch.manual_seed(10 + stage)
    layers: list[torch.nn.Module] = [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    if stage == stages - 1:
        layers.append(torch.nn.Linear(WIDTH, 1))
    return torch.nn.Sequential(*layers)


@record
def main() -> None:
    args = parse_args()
    trigger = FlightRecorderTrigger.from_env()  # answers the supervisor's flight-recorder requests
    if trigger is not None:
        trigger.install()  # before init_process_group
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.stages:
        raise SystemExit(f"world size {world} is not a multiple of --stages {args.stages}")
    stage, dp_rank, dp_size = rank % args.stages, rank // args.stages, world // args.stages
    first, last = stage == 0, stage == args.stages - 1
    dp_groups = [
        dist.new_group([d * args.stages + s for d in range(dp_size)]) for s in range(args.stages)
    ]
    dp_group = dp_groups[stage]
    model = stage_module(stage, args.stages)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timer = StepTimer.from_env(
        flush_interval_s=args.flush_s,
        identity=RankIdentity.from_env(gpu_index=local_rank),
        parallel=ParallelCoords(dp_rank=dp_rank, pp_rank=stage, tp_rank=0, pp_size=args.stages),
    )
    checkpointer = TieredCheckpointer.from_env(
        environment.CKPT_LOCAL.raw(),
        durable=environment.CKPT_DURABLE.get(),
        every_local=args.ckpt_every,
        every_durable=args.durable_every,
        node=environment.NODE.get(),
        job_id=environment.JOB_ID.get(),
    )
    start = 0
    plan = load_restore_plan()
    if plan is not None and not plan.fresh_start:
        state = load_rank_state(plan, rank)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"]) + 1
    # the stages of one pipeline see the same batches
    data = torch.Generator().manual_seed(200 + dp_rank)
    mb = args.batch // args.microbatches

    try:
        for step in range(start, args.steps):
            with timer.step(step, samples=args.batch) as record_step:
                with timer.section("data"):
                    xs = [torch.randn(mb, WIDTH, generator=data) for _ in range(args.microbatches)]
                    ys = [x.sum(dim=1, keepdim=True).tanh() for x in xs]
                outputs, inputs, losses = [], [], []
                with timer.section("forward"):
                    for x, y in zip(xs, ys, strict=True):
                        if not first:
                            x = torch.empty(mb, WIDTH)
                            # the wait for the previous stage, not this one's work
                            with timer.section("recv"):
                                dist.recv(x, src=rank - 1)
                            x.requires_grad_(True)
                        time.sleep(args.compute_s)
                        out = model(x)
                        inputs.append(x)
                        if last:
                            losses.append(torch.nn.functional.mse_loss(out, y) / args.microbatches)
                        else:
                            with timer.section("send"):
                                dist.send(out.detach(), dst=rank + 1)
                            outputs.append(out)
                with timer.section("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    for i in range(args.microbatches):
                        if last:
                            losses[i].backward()
                        else:
                            grad = torch.empty(mb, WIDTH)
                            with timer.section("recv"):
                                dist.recv(grad, src=rank + 1)
                            outputs[i].backward(grad)
                        if not first:
                            with timer.section("send"):
                                dist.send(inputs[i].grad, dst=rank - 1)
                with timer.section("comm"):
                    grads = [p.grad for p in model.parameters()]
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    dist.all_reduce(flat, group=dp_group)
                    flat /= dp_size
                    offset = 0
                    for g in grads:
                        g.copy_(flat[offset:offset + g.numel()].view_as(g))
                        offset += g.numel()
                    reported = torch.tensor(
                        [float(sum(loss.item() for loss in losses)) if last else 0.0]
                    )
                    dist.all_reduce(reported)
                with timer.section("optimizer"):
                    optimizer.step()
                record_step.loss = float(reported.item()) / dp_size
            if checkpointer.due(step) or checkpointer.durable_due(step):
                with timer.step(step, phase="checkpoint"):
                    checkpointer.save(
                        step,
                        {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "step": step,
                        },
                    )
        dist.barrier()
    finally:
        checkpointer.close(timeout=30)
        timer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
