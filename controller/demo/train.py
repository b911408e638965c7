"""The demo's training job: a small MLP trained with DDP over gloo on the CPU, instrumented with faultlens.

    python -m torch.distributed.run ... -m controller.demo.train --steps 60

Every rank installs the flight-recorder trigger before init_process_group, times its steps (data, forward,
backward, comm, optimizer sections) into the store, checkpoints through the tiered checkpointer (local every
`--ckpt-every` steps, durable every `--durable-every`), resumes from the restore plan the supervisor hands it
(FAULTLENS_RESTORE_PLAN), and applies the fault it was given for this attempt (FAULTLENS_DEMO_FAULT).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from collectors.fr_trigger import FlightRecorderTrigger
from collectors.step_timer import ParallelCoords, RankIdentity, StepTimer
from controller.checkpoints.tiered import TieredCheckpointer
from controller.demo.faults import Fault, FaultKind
from controller.restore import load_rank_state, load_restore_plan

STUCK_S = 600.0


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-sleep", type=float, default=0.05, help="simulated compute per step (s)")
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--durable-every", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=60.0, help="collective timeout (s)")
    return parser.parse_args()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 1))


class DemoJob:
    def __init__(self, args: argparse.Namespace, fault: Fault) -> None:
        self.args = args
        self.fault = fault
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node = os.environ.get("FAULTLENS_NODE", "node")
        torch.manual_seed(7)  # same initial weights everywhere; DDP broadcasts rank 0's anyway
        self.model = DistributedDataParallel(_model())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        # one (simulated) GPU per local rank, as on a real node: gpu_index joins steps to the node's GPU telemetry
        self.timer = StepTimer.from_env(flush_interval_s=0.2, identity=RankIdentity.from_env(gpu_index=self.local_rank),
                                        parallel=ParallelCoords(dp_rank=self.rank, pp_rank=0, tp_rank=0, pp_size=1))
        self.checkpointer = TieredCheckpointer.from_env(
            os.environ["FAULTLENS_CKPT_LOCAL"], durable=os.environ.get("FAULTLENS_CKPT_DURABLE"),
            every_local=args.ckpt_every, every_durable=args.durable_every, node=self.node,
            job_id=os.environ.get("FAULTLENS_JOB_ID"))
        self.start_step = 0
        plan = load_restore_plan()
        if plan is not None and not plan.fresh_start:
            state = load_rank_state(plan, self.rank)
            self.model.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.start_step = int(state["step"]) + 1
        self.data = torch.Generator().manual_seed(1000 + self.rank)

    def _state(self, step: int) -> dict:
        return {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(), "step": step}

    def _inject_before_forward(self, step: int) -> None:
        fault = self.fault
        if step < fault.step:
            return
        if fault.kind is FaultKind.STRAGGLER and self.rank == fault.rank:
            if step == fault.step:  # the GPU starts to overheat: the supervisor's simulated NVML shows it
                (Path(os.environ.get("FAULTLENS_DEMO_DIR", ".")) / f"gpu_hot-{self.node}").write_text(str(step))
            time.sleep(fault.extra_s)
        if step != fault.step:
            return
        if fault.kind is FaultKind.SIGKILL and self.rank == fault.rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind is FaultKind.GPU_LOST and self.node == fault.node and self.local_rank == 0:
            # this rank's GPU falls off the bus: the driver logs Xid 79, then the CUDA runtime fails the process;
            # the node's other ranks die of the broken collectives, as they would
            marker = Path(os.environ.get("FAULTLENS_DEMO_DIR", ".")) / f"gpu_lost-{self.node}"
            marker.write_text(dt.datetime.now(dt.UTC).isoformat())
            time.sleep(1.0)
            raise RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors might be asynchronously "
                               "reported at some other API call, so the stacktrace below might be incorrect.")
        if fault.kind is FaultKind.SOFTWARE:
            batch = {"inputs": None}
            _ = batch["labels"]  # the bug: the data pipeline no longer yields labels

    def run(self) -> None:
        for step in range(self.start_step, self.args.steps):
            with self.timer.step(step, tokens=self.args.batch * 64, samples=self.args.batch) as record_step:
                with self.timer.section("data"):
                    inputs = torch.randn(self.args.batch, 64, generator=self.data)
                    targets = inputs[:, :1].clone()
                with self.timer.section("forward"):
                    self._inject_before_forward(step)
                    time.sleep(self.args.step_sleep)  # stands in for the model's compute on a real GPU
                    loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
                with self.timer.section("backward"):
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()  # DDP all_reduces gradients here
                with self.timer.section("comm"):
                    self._average_loss(loss.detach().clone(), step)
                with self.timer.section("optimizer"):
                    self.optimizer.step()
                record_step.loss = float(loss.item())
            if self.checkpointer.due(step) or self.checkpointer.durable_due(step):
                with self.timer.step(step, phase="checkpoint"):
                    self.checkpointer.save(step, self._state(step))

    def _average_loss(self, loss: torch.Tensor, step: int) -> None:
        if self.fault.kind is FaultKind.HANG and step == self.fault.step and self.rank == self.fault.rank:
            # the bug: this rank skips the all_reduce and is stuck outside any collective
            time.sleep(STUCK_S)
        dist.all_reduce(loss)

    def close(self) -> None:
        self.checkpointer.close(timeout=30)
        self.timer.close()


@record
def main() -> None:
    args = _args()
    fault = Fault.from_json(os.environ.get("FAULTLENS_DEMO_FAULT"))
    trigger = FlightRecorderTrigger.from_env()
    if trigger is not None:
        trigger.install()  # before init_process_group, so torch's threads inherit the blocked signal
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=args.timeout))
    job = DemoJob(args, fault)
    try:
        job.run()
        dist.barrier()
    finally:
        job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
