"""A tiny DDP job (gloo, CPU) for the Slurm tests: STEPS steps of a linear model, a checkpoint
(rank 0, torch.save) every CKPT_EVERY steps in CKPT_DIR, resumed from FAULTLENS_RESTORE_STEP when a
failover chose one, else from the newest checkpoint. A fault from DDP_TEST_FAULT
("KIND:NODE:LOCAL_RANK:STEP", the time written to FAULT_FILE first), only in the attempt
DDP_TEST_FAULT_ATTEMPT (default 0; "all": every attempt, a fault that follows the code):

    sigkill    that rank SIGKILLs itself
    exception  it raises
    stuck      it sleeps outside any collective; the others wait in theirs until the collective
               timeout DDP_TEST_TIMEOUT_S
    cuda       it fails as CUDA does after its GPU fell off the bus
    slow       from that step on its forward takes DDP_TEST_SLOW_S longer
    mark       nothing: a fault carried out from outside (node loss); with DDP_TEST_MARK_HOLD_S it
               first waits that long, so its peers are inside the step's collective when it comes

Rank 0 writes DONE_FILE (JSON: attempt, first step, last step, nodes) when the job finishes. Each
step is timed by faultlens' step timer (sections forward, backward, comm) into $FAULTLENS_STORE
when DDP_TEST_STEP_TIMER is 1; the flight-recorder trigger answers `faultlens serve`'s dump
requests."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import ParallelCoords, RankIdentity, StepTimer


def main() -> None:
    trigger = FlightRecorderTrigger.from_env()  # dumps when `faultlens serve` asks
    if trigger is not None:
        trigger.install()  # before init_process_group
    timeout = dt.timedelta(seconds=float(os.environ.get("DDP_TEST_TIMEOUT_S", "30")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    steps = int(os.environ.get("STEPS", "30"))
    every = int(os.environ.get("CKPT_EVERY", "5"))
    ckpt_dir = Path(os.environ["CKPT_DIR"])
    attempt = int(os.environ.get("FAULTLENS_ATTEMPT", "0"))
    fault = os.environ.get("DDP_TEST_FAULT", "")
    fault_attempt = os.environ.get("DDP_TEST_FAULT_ATTEMPT", "0")
    fires = fault_attempt == "all" or attempt == int(fault_attempt)
    timer = None
    if os.environ.get("DDP_TEST_STEP_TIMER") == "1":
        timer = StepTimer.from_env(
            flush_interval_s=1.0,
            identity=RankIdentity.from_env(gpu_index=local),
            parallel=ParallelCoords(dp_rank=rank, pp_rank=0, tp_rank=0, pp_size=1),
        )

    def timed(what, *args, **kwargs):
        return getattr(timer, what)(*args, **kwargs) if timer else contextlib.nullcontext()

    slow_s = 0.0
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    restore = os.environ.get("FAULTLENS_RESTORE_STEP")
    saved = sorted(int(p.stem.split("-")[1]) for p in ckpt_dir.glob("step-*.pt"))
    if restore is not None:
        start = int(restore)
    elif saved:
        start = saved[-1]
    if start:
        state = torch.load(ckpt_dir / f"step-{start}.pt")
        model.module.load_state_dict(state["model"])
    started = time.time()  # training resumed: the first step of this attempt begins
    for step in range(start + 1, steps + 1):
        if fault and fires:
            kind, node, local_rank, fault_step = fault.split(":")
            here = os.environ.get("FAULTLENS_NODE") == node
            if here and local == int(local_rank) and step == int(fault_step):
                Path(os.environ["FAULT_FILE"]).write_text(f"{time.time()} {rank}")
                if kind == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if kind == "exception":
                    raise ValueError(f"shape mismatch in batch at step {step}")
                if kind == "stuck":
                    time.sleep(3600)
                if kind == "cuda":
                    raise RuntimeError("CUDA error: unspecified launch failure")
                if kind == "mark":
                    time.sleep(float(os.environ.get("DDP_TEST_MARK_HOLD_S", "0")))
                if kind == "slow":
                    slow_s = float(os.environ.get("DDP_TEST_SLOW_S", "0.15"))
        with timed("step", step, samples=16):
            with timed("section", "forward"):
                time.sleep(slow_s)
                x = torch.randn(16, 8)
                loss = model(x).pow(2).mean()
            with timed("section", "backward"):
                opt.zero_grad()
                loss.backward()  # DDP's all_reduce of the gradients
            with timed("section", "comm"):
                reported = loss.detach().clone()
                dist.all_reduce(reported)
            opt.step()
            time.sleep(float(os.environ.get("STEP_S", "0.1")))
        if step % every == 0 and rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            tmp = ckpt_dir / f".step-{step}.pt"
            torch.save({"model": model.module.state_dict()}, tmp)
            tmp.rename(ckpt_dir / f"step-{step}.pt")
    nodes = [None] * world
    dist.all_gather_object(nodes, os.environ.get("FAULTLENS_NODE", socket.gethostname()))
    if rank == 0:
        done = {
            "attempt": attempt,
            "start": start,
            "last": steps,
            "nodes": sorted(set(nodes)),
            "restore": restore,
            "started": started,
        }
        Path(os.environ["DONE_FILE"]).write_text(json.dumps(done))
    if timer is not None:
        timer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
