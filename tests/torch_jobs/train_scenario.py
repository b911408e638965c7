"""A small real training job run under torchrun (gloo, CPU) that misbehaves in one of the fixture
scenarios.

    python -m torch.distributed.run --nproc-per-node 4 --log-dir LOGS train_scenario.py SCENARIO
    ARTIFACT_DIR

Every rank installs the flight-recorder trigger (before init_process_group), times its steps and
sections with the step timer into ARTIFACT_DIR/store, and trains a tiny MLP whose gradients are
all_reduced by hand (one collective per step on the world group; ranks 2 and 3 also all_reduce a
small tensor on a sub-group each step). At the scenario's step it misbehaves (see SCENARIOS). Before
entering a collective that will not complete, a rank writes ARTIFACT_DIR/progress/rank_<N>.json
({pid, step, point}) so the harness knows the hang is live.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import ParallelCoords, StepTimer

SCENARIOS = ("hang", "mismatch", "subgroup_hang", "crash_exception", "crash_sigkill", "straggler")
FAULT_STEP = 3
STEPS = {"straggler": 30}
DEFAULT_STEPS = 8
STRAGGLER_RANK = 3
STRAGGLER_EXTRA_S = 0.02
PAIR = [2, 3]
STUCK_S = 60.0
LEARNING_RATE = 0.01


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data))
    os.replace(temp, path)


def _next_seq(group_name: str) -> int | None:
    """The collective_seq_id the next collective on `group_name` will get, from torch's own flight
    recorder.
    """
    from torch._C._distributed_c10d import _dump_fr_trace_json

    trace = json.loads(_dump_fr_trace_json(True, False))
    pg_ids = {
        str(e["pg_id"])
        for e in trace.get("entries", [])
        if str(e["process_group"][0]) == group_name
    }
    for pg_id in pg_ids or {group_name}:
        status = trace.get("pg_status", {}).get(pg_id)
        if status is not None:
            return int(status["last_enqueued_collective"]) + 1
    return None


class Job:
    def __init__(self, scenario: str, artifacts: Path) -> None:
        self.scenario = scenario
        self.artifacts = artifacts
        self.rank = dist.get_rank()
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        torch.manual_seed(1234 + self.rank)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
        )
        # torch.optim imports torch._dynamo (~1 s of CPU), as does the first flight-recorder dump
        # with Python stack traces. Real jobs pay it at start-up; the 'hang' scenario (the one
        # dumping with stack traces) does the same, so its live dump is fast; the other scenarios
        # use plain SGD and dump without stack traces.
        self.optimizer = (
            torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
            if scenario == "hang"
            else None
        )
        # new_group is collective over the world: every rank calls it, only ranks 2 and 3 are
        # members
        self.pair = dist.new_group(PAIR, group_desc="pair_2_3")
        self.timer = StepTimer.from_env(
            store=str(artifacts / "store"), flush_interval_s=0.25,
            parallel=ParallelCoords(dp_rank=self.rank, pp_rank=0, tp_rank=0, pp_size=1),
        )
        self.progress_written = False
        self.mark_seq: int | None = None

    def mark(self, point: str, step: int, **extra: object) -> None:
        """Tell the harness this rank is about to enter a collective that will not complete."""
        if self.progress_written:
            return
        self.progress_written = True
        _write_json(self.artifacts / "progress" / f"rank_{self.rank}.json",
                    {"rank": self.rank, "pid": os.getpid(), "step": step, "point": point, **extra})

    def wait_for_markers(
        self, others: tuple[int, ...], wait_s: float = 120.0, settle_s: float = 0.3
    ) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(
                (self.artifacts / "progress" / f"rank_{r}.json").exists() for r in others):
            time.sleep(0.02)
        time.sleep(settle_s)  # from the marker into the blocking wait

    def world_name(self) -> str:
        return dist.distributed_c10d._get_process_group_name(dist.group.WORLD)

    def pair_name(self) -> str:
        return dist.distributed_c10d._get_process_group_name(self.pair)

    def run(self) -> None:
        steps = STEPS.get(self.scenario, DEFAULT_STEPS)
        for step in range(steps):
            with self.timer.step(step, tokens=8 * 16, samples=8) as record_step:
                with self.timer.section("data"):
                    inputs, targets = torch.randn(8, 16), torch.randn(8, 1)
                with self.timer.section("forward"):
                    if self.scenario == "crash_exception" and self.rank == 2 and step == FAULT_STEP:
                        raise ValueError(f"injected bug: loss became nan at step {step} on rank "
                                         f"{self.rank}")
                    if self.scenario == "crash_sigkill" and self.rank == 1 and step == FAULT_STEP:
                        # killed once the others are inside this step's all_reduce (their markers),
                        # not at a moment that depends on the machine's load: they always fail in
                        # it, and dump on the way out
                        self.wait_for_markers(others=(0, 2, 3))
                        os.kill(os.getpid(), signal.SIGKILL)
                    if self.scenario == "straggler" and self.rank == STRAGGLER_RANK:
                        time.sleep(STRAGGLER_EXTRA_S)
                    loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
                with self.timer.section("backward"):
                    self.model.zero_grad(set_to_none=True)
                    loss.backward()
                with self.timer.section("comm"):
                    self.communicate(step)
                with self.timer.section("optimizer"):
                    self.optimizer_step()
                record_step.loss = loss.item()

    def optimizer_step(self) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
            return
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(p.grad, alpha=-LEARNING_RATE)

    def communicate(self, step: int) -> None:
        grads = torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])
        world = self.world_name()
        hanging = self.scenario in ("hang", "subgroup_hang")
        if self.scenario == "crash_sigkill" and step == FAULT_STEP and self.rank != 1:
            self.mark("world all_reduce", step, group=world, next_seq=_next_seq(world))
        if self.scenario == "hang" and step == FAULT_STEP:
            if self.rank == 2:
                # the bug: rank 2 skips this all_reduce and is stuck outside any collective (a
                # wedged loader)
                self.mark("stuck outside collectives", step, group=world, next_seq=_next_seq(world))
                deadline = time.monotonic() + STUCK_S
                while time.monotonic() < deadline:
                    time.sleep(0.05)
                raise TimeoutError(f"rank {self.rank} stuck for {STUCK_S:.0f}s")
            self.mark("world all_reduce", step, group=world, next_seq=_next_seq(world))
        if self.scenario == "subgroup_hang" and step > FAULT_STEP:
            self.mark("world all_reduce", step, group=world, next_seq=_next_seq(world))
        if self.scenario == "mismatch" and self.rank == 1 and step == FAULT_STEP:
            # same element count, different shape: gloo completes it, only the flight recorder shows
            # it
            self.mark_seq = _next_seq(world)
            grads = grads.reshape(1, -1)
        dist.all_reduce(grads)
        grads = grads.reshape(-1) / dist.get_world_size()
        offset = 0
        for p in self.model.parameters():
            n = p.grad.numel()
            p.grad.copy_(grads[offset:offset + n].view_as(p.grad))
            offset += n
        if self.rank in PAIR:
            pair_name = self.pair_name()
            if self.scenario == "subgroup_hang" and step == FAULT_STEP:
                if self.rank == 3:
                    return  # the bug: rank 3 skips the sub-group all_reduce
                self.mark("pair all_reduce", step, group=pair_name, next_seq=_next_seq(pair_name))
            elif hanging and step >= FAULT_STEP:
                return
            dist.all_reduce(torch.ones(4), group=self.pair)

    def close(self) -> None:
        self.timer.close()


@record
def main() -> None:
    scenario, artifacts = sys.argv[1], Path(sys.argv[2])
    if scenario not in SCENARIOS:
        raise SystemExit(f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dump_dir = artifacts / ("dumps" if attempt == 0 else f"dumps_attempt_{attempt}")
    trigger = FlightRecorderTrigger.from_env(dump_dir=str(dump_dir))
    if trigger is None:
        raise SystemExit("FAULTLENS_FR_DIR is not set")
    # before init_process_group: the threads torch starts inherit the blocked SIGUSR1
    trigger.install()
    timeout_s = float(os.environ.get("FAULTLENS_SCENARIO_TIMEOUT_S", "5"))
    timeout = dt.timedelta(seconds=timeout_s)
    if attempt == 0:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        # torchrun (2.13) keeps one agent store across restarts and gloo finds the dead attempt's
        # addresses in it ("connectFullMesh failed ... Connection refused"); a per-attempt key
        # prefix avoids them
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"attempt_{attempt}", store),
            timeout=timeout,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    with trigger.dump_on_exception():
        job = Job(scenario, artifacts)
        try:
            job.run()
            if scenario in ("mismatch", "straggler"):
                dist.barrier()
                trigger.dump("end of run")
                if scenario == "mismatch" and job.rank == 1:
                    _write_json(artifacts / "progress" / "mismatch.json", {"seq": job.mark_seq})
                dist.barrier()
        finally:
            job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
