"""A user's DDP training script: an MLP regression over gloo on the CPU, with faultlens's in-job
instrumentation as docs/operations.md describes it (step timer, flight-recorder trigger, tiered
checkpointer), resuming from the restore plan the supervisor hands it.

    faultlens run --nnodes 2 --nproc-per-node 2 -- controller/lab/jobs/ddp_train.py --steps 40

Nothing here knows about fault injection: the campaign injects from outside
(controller/lab/inject.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from faultlens import environment
from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.numerics import NumericsProbe
from faultlens.collectors.training.step_timer import ParallelCoords, RankIdentity, StepTimer
from faultlens.controller.checkpoints.tiered import TieredCheckpointer
from faultlens.controller.restore import load_rank_state, load_restore_plan


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="DDP MLP training (gloo, CPU)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compute-s", type=float, default=0.05, help="extra compute per step (s): "
                                                                      "a bigger model")
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--durable-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=0, help="run an eval phase every N steps "
                                                                  "(0: never)")
    parser.add_argument("--eval-batches", type=int, default=5)
    parser.add_argument("--flush-s", type=float, default=2.0, help="step-row flush interval of the "
                                                                   "timer")
    parser.add_argument("--timeout", type=float, default=30.0, help="collective timeout (s)")
    parser.add_argument("--seed", type=int, default=0, help="the model's and the data's seed")
    parser.add_argument("--numerics-every", type=int, default=0, help="in-job numerics signals "
                        "(loss, local gradient norm; a parameter digest every N steps; 0: off)")
    parser.add_argument("--lr", type=float, default=1e-3, help="the learning rate (AdamW)")
    parser.add_argument("--warmup-steps", type=int, default=0, help="a linear learning-rate "
                        "warm-up from lr/warmup to lr over this many steps")
    parser.add_argument("--lr-change", default="", help="STEP:LR: the learning rate from STEP on")
    return parser.parse_args()


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """The step's learning rate: a function of the step, so a resumed run follows the same
    schedule."""
    lr = args.lr
    if args.lr_change:
        at, value = args.lr_change.split(":")
        if step >= int(at):
            lr = float(value)
    if args.warmup_steps > 0 and step < args.warmup_steps:
        lr = lr * (step + 1) / args.warmup_steps
    return lr


def build_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )


@record
def main() -> None:
    args = parse_args()
    trigger = FlightRecorderTrigger.from_env()  # answers the supervisor's flight-recorder requests
    if trigger is not None:
        trigger.install()  # before init_process_group
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    node = environment.NODE.get()
    model = DistributedDataParallel(build_model(args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    timer = StepTimer.from_env(
        flush_interval_s=args.flush_s,
        identity=RankIdentity.from_env(gpu_index=local_rank),
        parallel=ParallelCoords(dp_rank=rank, pp_rank=0, tp_rank=0, pp_size=1),
    )
    probe = None
    if args.numerics_every > 0:
        probe = NumericsProbe(timer, digest_every=args.numerics_every)
        model.register_comm_hook(None, probe.comm_hook)
    checkpointer = TieredCheckpointer.from_env(
        environment.CKPT_LOCAL.raw(),
        durable=environment.CKPT_DURABLE.get(),
        every_local=args.ckpt_every,
        every_durable=args.durable_every,
        node=node,
        job_id=environment.JOB_ID.get(),
    )
    start = 0
    plan = load_restore_plan()
    skip = set(plan.skip_steps) if plan is not None else set()
    if plan is not None and not plan.fresh_start:
        state = load_rank_state(plan, rank)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"]) + 1
    data = torch.Generator().manual_seed(100 + rank + 1000 * args.seed)
    target_w = torch.linspace(-1, 1, 32)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(args.batch, 32, generator=data)
        return x, (x @ target_w).unsqueeze(1)

    # the data stream is a function of the step: a resumed run sees the batches the first one saw
    for _ in range(start):
        batch()

    try:
        for step in range(start, args.steps):
            if step in skip:  # the restore plan says: leave this step's batch out
                batch()
                continue
            with timer.step(step, tokens=args.batch * 32, samples=args.batch) as record_step:
                with timer.section("data"):
                    x, y = batch()
                with timer.section("forward"):
                    time.sleep(args.compute_s)
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with timer.section("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with timer.section("comm"):
                    reported = loss.detach().clone()
                    dist.all_reduce(reported)
                with timer.section("optimizer"):
                    for group in optimizer.param_groups:
                        group["lr"] = learning_rate(args, step)
                    optimizer.step()
                record_step.loss = float(reported.item()) / world
            if probe is not None:
                probe.record(step, loss=loss, module=model.module, batch=step)
            if args.eval_every and step > 0 and step % args.eval_every == 0:
                with timer.step(step, phase="eval"), torch.no_grad():
                    total = torch.zeros(1)
                    for _ in range(args.eval_batches):
                        x, y = batch()
                        time.sleep(args.compute_s)
                        total += torch.nn.functional.mse_loss(model(x), y)
                    dist.all_reduce(total)
            if checkpointer.due(step) or checkpointer.durable_due(step):
                with timer.step(step, phase="checkpoint"):
                    checkpointer.save(step, {"model": model.module.state_dict(),
                                             "optimizer": optimizer.state_dict(), "step": step})
        dist.barrier()
    finally:
        checkpointer.close(timeout=30)
        timer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
