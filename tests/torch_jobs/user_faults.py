"""A user's own DDP training script (gloo, CPU) with the bugs users have, switched on by its own
arguments (nothing here knows faultlens injects anything): an exception that happens once (a flaky
read: a marker file says it already happened) or every time, a rank that leaves early (uneven
data), a failure at start before any step. Instrumented as docs/operations.md says: step timer,
flight-recorder trigger, tiered checkpointer, resumes from the supervisor's restore plan.

    faultlens run --nnodes 2 --nproc-per-node 2 -- tests/torch_jobs/user_faults.py --steps 14 \
        --raise-rank 3 --raise-step 8 --once-file /tmp/flaky.done
"""

from __future__ import annotations

import argparse
import builtins
import datetime as dt
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from faultlens import environment
from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import ParallelCoords, RankIdentity, StepTimer
from faultlens.controller.checkpoints.tiered import TieredCheckpointer
from faultlens.controller.restore import load_rank_state, load_restore_plan


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a user's DDP job")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--compute-s", type=float, default=0.02)
    parser.add_argument("--ckpt-every", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--raise-rank", type=int, default=None)
    parser.add_argument("--raise-step", type=int, default=None)
    parser.add_argument("--raise-type", default="RuntimeError")
    parser.add_argument("--raise-message", default="corrupt record in shard 17 (bad length)")
    parser.add_argument(
        "--once-file", default=None, help="raise only while this file does not exist (a one-off)"
    )
    parser.add_argument(
        "--start-error",
        action="store_true",
        help="every rank fails before its first step (a broken config)",
    )
    parser.add_argument(
        "--leave-rank",
        type=int,
        default=None,
        help="this rank's data ends early: it leaves after --leave-after steps",
    )
    parser.add_argument("--leave-after", type=int, default=None)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument(
        "--kill-worker-rank",
        type=int,
        default=None,
        help="this rank's DataLoader worker is SIGKILLed on its host (once, with "
        "--once-file) at --kill-worker-step",
    )
    parser.add_argument("--kill-worker-step", type=int, default=None)
    parser.add_argument(
        "--hang-rank",
        type=int,
        default=None,
        help="this rank hangs in the attempt's first --hang-phase step (once, with --once-file)",
    )
    parser.add_argument("--hang-phase", choices=["checkpoint"], default="checkpoint")
    return parser.parse_args()


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


class Batches(torch.utils.data.Dataset):
    """Random regression batches, made in the DataLoader's worker processes."""

    def __init__(self, seed: int, length: int) -> None:
        self.seed, self.length = seed, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(16, 16, generator=torch.Generator().manual_seed(self.seed * 1000 + index))
        return x, x.sum(dim=1, keepdim=True)


def maybe_kill_worker(args: argparse.Namespace, rank: int, step: int, loader: object) -> None:
    """What the host's OOM killer or an operator does to a DataLoader worker: SIGKILL."""
    if args.kill_worker_rank != rank or args.kill_worker_step != step:
        return
    if args.once_file:
        marker = Path(args.once_file)
        if marker.exists():
            return
        marker.write_text(f"killed a DataLoader worker of rank {rank} at step {step}\n")
    for worker in getattr(loader, "_workers", []):  # the loader's worker processes
        os.kill(worker.pid, signal.SIGKILL)
    time.sleep(0.5)


def maybe_hang(args: argparse.Namespace, rank: int) -> None:
    """A rank stuck in its first checkpoint save (a hung filesystem): its peers go on and wait."""
    if args.hang_rank != rank:
        return
    if args.once_file:
        marker = Path(args.once_file)
        if marker.exists():
            return
        marker.write_text(f"rank {rank} hung in its first checkpoint\n")
    time.sleep(3600)


def maybe_raise(args: argparse.Namespace, rank: int, step: int) -> None:
    if args.raise_rank != rank or args.raise_step != step:
        return
    if args.once_file:
        marker = Path(args.once_file)
        if marker.exists():
            return
        marker.write_text(f"raised on rank {rank} at step {step}\n")
    raise getattr(builtins, args.raise_type, RuntimeError)(args.raise_message)


@record
def main() -> None:
    args = parse_args()
    trigger = FlightRecorderTrigger.from_env()
    if trigger is not None:
        trigger.install()
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.start_error:
        raise KeyError("model.hidden_size")  # the config lacks a key: every rank, before step 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    timer = StepTimer.from_env(
        flush_interval_s=0.5,
        identity=RankIdentity.from_env(gpu_index=local_rank),
        parallel=ParallelCoords(dp_rank=rank, pp_rank=0, tp_rank=0, pp_size=1),
    )
    checkpointer = TieredCheckpointer.from_env(
        environment.CKPT_LOCAL.raw(),
        durable=environment.CKPT_DURABLE.get(),
        every_local=args.ckpt_every,
        every_durable=args.ckpt_every,
        node=environment.NODE.get(),
        job_id=environment.JOB_ID.get(),
    )
    start = 0
    plan = load_restore_plan()
    if plan is not None and not plan.fresh_start:
        state = load_rank_state(plan, rank)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"]) + 1
    data = torch.Generator().manual_seed(10 + rank)
    loader = None
    if args.workers:
        dataset = Batches(10 + rank, args.steps)
        loader = iter(
            torch.utils.data.DataLoader(
                dataset, batch_size=None, num_workers=args.workers, sampler=range(start, args.steps)
            )
        )
    try:
        for step in range(start, args.steps):
            if rank == args.leave_rank and args.leave_after is not None and step > args.leave_after:
                # uneven data: this rank's loader is exhausted, it returns (exit 0; the finally
                # below closes its step timer)
                print(f"rank {rank}: no more data after step {step - 1}", file=sys.stderr)
                sys.exit(0)
            with timer.step(step, samples=16) as record_step:
                with timer.section("data"):
                    maybe_kill_worker(args, rank, step, loader)
                    if loader is not None:
                        x, y = next(loader)
                    else:
                        x = torch.randn(16, 16, generator=data)
                        y = x.sum(dim=1, keepdim=True)
                    maybe_raise(args, rank, step)
                with timer.section("forward"):
                    time.sleep(args.compute_s)
                    loss = torch.nn.functional.mse_loss(model(x), y)
                with timer.section("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with timer.section("optimizer"):
                    optimizer.step()
                record_step.loss = float(loss.item())
            if checkpointer.due(step) or checkpointer.durable_due(step):
                with timer.step(step, phase="checkpoint"):
                    maybe_hang(args, rank)
                    checkpointer.save(
                        step,
                        {
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "step": step,
                        },
                    )
        dist.barrier()
    finally:
        checkpointer.close(timeout=30)
        timer.close()
    dist.destroy_process_group()
    print(f"rank {rank}/{world}: done", file=sys.stderr)


if __name__ == "__main__":
    main()
