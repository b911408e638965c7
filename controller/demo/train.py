"""The demo's training job: a small MLP trained with DDP over gloo on the CPU, instrumented with
faultlens.

    python -m torch.distributed.run ... -m faultlens.controller.demo.train --steps 60

Every rank installs the flight-recorder trigger before init_process_group, times its steps (data,
forward, backward, comm, optimizer sections) into the store, checkpoints through the tiered
checkpointer (local every `--ckpt-every` steps, durable every `--durable-every`), resumes from the
restore plan the supervisor hands it (FAULTLENS_RESTORE_PLAN), and applies the fault it was given
for this attempt (FAULTLENS_DEMO_FAULT).

Without a supervisor, under plain `torchrun --max-restarts N`: FAULTLENS_RESUME_LATEST=1 makes it
resume by itself from the newest complete checkpoint every rank can load (its node's local tier or
the durable tier), and FAULTLENS_DEMO_FAULTS gives the faults per torchrun restart
(controller/demo/faults.py). A restarted attempt joins the process group through a per-attempt key
prefix in torchrun's store.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from faultlens import environment
from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import ParallelCoords, RankIdentity, StepTimer
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiered import TieredCheckpointer
from faultlens.controller.demo.faults import ENV_RESTART_COUNT, Fault, FaultKind, faults_from_env
from faultlens.controller.demo.resume import rank_tiers, resume_latest
from faultlens.controller.restore import load_rank_state, load_restore_plan

STUCK_S = 600.0


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-sleep", type=float, default=0.05, help="simulated compute per step "
                                                                       "(s)")
    parser.add_argument("--ckpt-every", type=int, default=5)
    parser.add_argument("--durable-every", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=60.0, help="collective timeout (s)")
    parser.add_argument("--teardown-sleep", type=float, default=0.0,
                        help="seconds every rank spends after its last step before it exits (a "
                             "slow teardown)")
    return parser.parse_args()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 1),
    )


class DemoJob:
    def __init__(self, args: argparse.Namespace, fault: Fault | Sequence[Fault]) -> None:
        self.args = args
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node = environment.NODE.get(default="node")
        torch.manual_seed(7)  # same initial weights everywhere; DDP broadcasts rank 0's anyway
        self.model = DistributedDataParallel(_model())
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        # one (simulated) GPU per local rank, as on a real node: gpu_index joins steps to the node's
        # GPU telemetry
        self.timer = StepTimer.from_env(
            flush_interval_s=0.2,
            identity=RankIdentity.from_env(gpu_index=self.local_rank),
            parallel=ParallelCoords(dp_rank=self.rank, pp_rank=0, tp_rank=0, pp_size=1),
        )
        self.checkpointer = TieredCheckpointer.from_env(
            environment.CKPT_LOCAL.raw(), durable=environment.CKPT_DURABLE.get(),
            every_local=args.ckpt_every, every_durable=args.durable_every, node=self.node,
            job_id=environment.JOB_ID.get())
        self.start_step = 0
        plan = load_restore_plan()
        if plan is not None and not plan.fresh_start:
            state = load_rank_state(plan, self.rank)
            self.model.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.start_step = int(state["step"]) + 1
        elif plan is None and environment.RESUME_LATEST.raw() == "1":
            self._resume_latest()
        faults = (fault,) if isinstance(fault, Fault) else tuple(fault)
        self.faults = tuple(f.resolved(self.start_step) for f in faults)
        self.data = torch.Generator().manual_seed(1000 + self.rank)

    def _resume_latest(self) -> None:
        """No supervisor: the newest complete checkpoint every rank can read by itself (own node's
        local tier or the durable tier), as a training script under plain torchrun does."""
        catalog = CheckpointCatalog(rank_tiers(environment.CKPT_LOCAL.get(),
                                               environment.CKPT_DURABLE.get(), self.node),
                                    job_id=environment.JOB_ID.get())
        step, state = resume_latest(catalog, self.rank)
        if step is not None:
            self.model.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.start_step = int(state["step"]) + 1

    def _state(self, step: int) -> dict:
        return {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": step,
        }

    def _inject_before_forward(self, step: int) -> None:
        for fault in self.faults:
            self._inject(fault, step)

    def _inject(self, fault: Fault, step: int) -> None:
        if step < fault.step:
            return
        if fault.kind is FaultKind.STRAGGLER and self.rank == fault.rank:
            # the GPU starts to overheat: the supervisor's simulated NVML shows it
            if step == fault.step:
                (Path(environment.DEMO_DIR.get()) / f"gpu_hot-{self.node}").write_text(str(step))
            time.sleep(fault.extra_s)
        if step != fault.step:
            return
        if fault.kind is FaultKind.SIGKILL and self.rank == fault.rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind is FaultKind.GPU_LOST and self.node == fault.node and self.local_rank == 0:
            # this rank's GPU falls off the bus: the driver logs Xid 79, then the CUDA runtime fails
            # the process; the node's other ranks die of the broken collectives, as they would
            marker = Path(environment.DEMO_DIR.get()) / f"gpu_lost-{self.node}"
            marker.write_text(dt.datetime.now(dt.UTC).isoformat())
            time.sleep(1.0)
            raise RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors might "
                               "be asynchronously "
                               "reported at some other API call, so the stacktrace below might be "
                               "incorrect.")
        if fault.kind is FaultKind.EXCEPTION and fault.rank in (None, self.rank):
            raise ValueError(fault.message or "the injected exception")
        if fault.kind in (FaultKind.AGENT_LOSS, FaultKind.NODE_LOSS) and self._on_fault_node(fault):
            if self.local_rank == 0:
                # this node's torchrun agent: the worker's parent
                os.kill(os.getppid(), signal.SIGKILL)
            if fault.kind is FaultKind.NODE_LOSS:
                os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind is FaultKind.SOFTWARE:
            attempt = environment.ATTEMPT.get() or os.environ.get(ENV_RESTART_COUNT, "0")
            marker = Path(environment.DEMO_DIR.get()) / f"software_bug-a{attempt}-r{self.rank}"
            marker.write_text(repr(time.time()))
            batch = {"inputs": None}
            _ = batch["labels"]  # the bug: the data pipeline no longer yields labels

    def _on_fault_node(self, fault: Fault) -> bool:
        if fault.node is not None:
            return self.node == fault.node
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return fault.rank is not None and fault.rank // local_world == self.rank // local_world

    def run(self) -> None:
        for step in range(self.start_step, self.args.steps):
            with self.timer.step(
                step, tokens=self.args.batch * 64, samples=self.args.batch
            ) as record_step:
                with self.timer.section("data"):
                    inputs = torch.randn(self.args.batch, 64, generator=self.data)
                    targets = inputs[:, :1].clone()
                with self.timer.section("forward"):
                    self._inject_before_forward(step)
                    # stands in for the model's compute on a real GPU
                    time.sleep(self.args.step_sleep)
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
        if any(
            f.kind is FaultKind.HANG and step == f.step and self.rank == f.rank for f in self.faults
        ):
            # the bug: this rank skips the all_reduce and is stuck outside any collective
            time.sleep(STUCK_S)
        dist.all_reduce(loss)

    def close(self) -> None:
        self.checkpointer.close(timeout=30)
        self.timer.close()


def _init_process_group(timeout: dt.timedelta) -> None:
    restart = int(os.environ.get(ENV_RESTART_COUNT, "0"))
    if restart == 0:
        dist.init_process_group("gloo", timeout=timeout)
        return
    # torchrun (2.13) keeps one agent store across restarts and gloo finds the dead attempt's
    # addresses in it ("connectFullMesh failed ... Connection refused"); a per-attempt key prefix
    # avoids them
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timeout,
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"attempt_{restart}", store),
        timeout=timeout,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
    )


@record
def main() -> None:
    args = _args()
    faults = faults_from_env()
    trigger = FlightRecorderTrigger.from_env()
    if trigger is not None:
        # before init_process_group, so torch's threads inherit the blocked signal
        trigger.install()
    _init_process_group(dt.timedelta(seconds=args.timeout))
    job = DemoJob(args, faults)
    try:
        job.run()
        dist.barrier()
        if args.teardown_sleep > 0:
            # training is over; a slow teardown (a long flush, a slow exit)
            time.sleep(args.teardown_sleep)
    finally:
        job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
