"""A user's DDP training script (torch, gloo, CPU) for the live-judgment tests, written as a user
would: the step timer from the environment, loss recorded, the timer closed at interpreter exit.

    torchrun ... train_live.py SCENARIO

Scenarios (env FAULTLENS_LIVE_STEPS: steps, FAULTLENS_LIVE_FLUSH_S: the timer's flush interval):
  healthy      trains every step, then tears down slowly (FAULTLENS_LIVE_TEARDOWN_S) and exits 0
  sigsegv      global rank FAULTLENS_LIVE_RANK SIGSEGVs inside step FAULTLENS_LIVE_AT (every
  attempt) nan          from step FAULTLENS_LIVE_AT the loss is NaN on every rank; training goes on
  to the end
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from faultlens.collectors.training.step_timer import StepTimer


def main() -> None:
    scenario = sys.argv[1]
    steps = int(os.environ.get("FAULTLENS_LIVE_STEPS", "40"))
    at = int(os.environ.get("FAULTLENS_LIVE_AT", "20"))
    bad_rank = int(os.environ.get("FAULTLENS_LIVE_RANK", "3"))
    pause = float(os.environ.get("FAULTLENS_LIVE_STEP_S", "0.03"))
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = StepTimer.from_env(
        flush_interval_s=float(os.environ.get("FAULTLENS_LIVE_FLUSH_S", "2"))
    )
    data = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(100 + rank))
    for step in range(steps):
        with timer.step(step) as record:
            with timer.section("forward"):
                loss = torch.nn.functional.mse_loss(model(data), target)
                if scenario == "nan" and step >= at:
                    loss = loss * float("nan")
            if scenario == "sigsegv" and step == at and rank == bad_rank:
                os.kill(os.getpid(), signal.SIGSEGV)
            with timer.section("backward"):
                optimizer.zero_grad()
                loss.backward()
            with timer.section("optimizer"):
                optimizer.step()
            time.sleep(pause)
            record.loss = loss.item()
    if scenario == "healthy":
        # a slow teardown: no step open
        time.sleep(float(os.environ.get("FAULTLENS_LIVE_TEARDOWN_S", "0")))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
