"""A plain DDP training script with an evaluation every EVAL_EVERY steps (each rank scores its share
of the validation set, then one all_reduce of the metric) and a checkpoint every SAVE_EVERY steps
(each rank saves its shard with torch.save, then a barrier), instrumented as docs/integration.md
says (step timer with eval and checkpoint phases, flight-recorder trigger). It resumes from its own
shards when they are there.

    faultlens run --nnodes 2 --nproc-per-node 2 -- ddp_eval_save.py

Its own faults, from the environment (nothing here knows faultlens injects anything):
- HANG_RANK, HANG_IN (eval | save), HANG_HOW (sleep | read | lock): that rank stops in the
  attempt's first evaluation (before the metric's all_reduce) or first save: asleep, in a read of a
  pipe nobody writes, or waiting on a lock another thread holds; once, while ONCE_FILE is absent.
- SLOW_SAVE_RANK, SLOW_SAVE_S, SLOW_SAVE_HOW (cpu | io): that rank's first save takes SLOW_SAVE_S
  and keeps working all the while: serialising its state again and again (cpu), or writing it in
  1 MiB pieces to a slow disk (io).
STEPS (default 24), EVAL_EVERY (10), SAVE_EVERY (10), CKPT_DIR (./ckpt), TIMEOUT (s, 120).
"""

import datetime as dt
import io
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from faultlens.collectors.training.step_timer import StepTimer


def env(name, default):
    return type(default)(os.environ.get(name, default))


def once():
    """True the first time in this job (ONCE_FILE marks it), always without ONCE_FILE."""
    marker = os.environ.get("ONCE_FILE")
    if not marker:
        return True
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def stop_here(how):
    """What a stuck rank does: nothing, for good."""
    if how == "read":
        readable, _unused = os.pipe()
        os.read(readable, 1)  # nobody ever writes
    elif how == "lock":
        lock = threading.Lock()
        threading.Thread(target=lock.acquire, daemon=True).start()
        time.sleep(0.1)
        lock.acquire()  # held by a thread that never lets go
    time.sleep(3600)


def slow_save(state, path, seconds, how):
    """A first save that takes `seconds` and works all the while."""
    end = time.monotonic() + seconds
    if how == "cpu":
        while time.monotonic() < end:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            torch.randn(256, 256) @ torch.randn(256, 256)
    else:
        piece = os.urandom(1 << 20)
        with open(f"{path}.slow", "wb") as handle:
            while time.monotonic() < end:
                handle.write(piece)
                handle.flush()
                os.fsync(handle.fileno())
                time.sleep(0.1)  # the slow disk
        os.unlink(f"{path}.slow")
    torch.save(state, path)


def main():
    trigger = FlightRecorderTrigger.from_env()
    if trigger is not None:
        trigger.install()
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=env("TIMEOUT", 120.0)))
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, eval_every, save_every = env("STEPS", 24), env("EVAL_EVERY", 10), env("SAVE_EVERY", 10)
    hang_rank, hang_in, hang_how = env("HANG_RANK", -1), env("HANG_IN", "eval"), env(
        "HANG_HOW", "sleep")
    slow_rank, slow_s, slow_how = env("SLOW_SAVE_RANK", -1), env("SLOW_SAVE_S", 0.0), env(
        "SLOW_SAVE_HOW", "cpu")
    ckpt = Path(env("CKPT_DIR", "ckpt"))
    ckpt.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    shard = ckpt / f"rank{rank}.pt"
    start = 0
    if shard.exists():
        state = torch.load(shard)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    data = torch.Generator().manual_seed(rank)
    val_x, val_y = torch.randn(256, 32, generator=data), torch.randint(0, 4, (256,), generator=data)
    first_eval = first_save = True

    timer = StepTimer.from_env(total_steps=steps)
    with timer:
        for step in range(start, steps):
            with timer.step(step):
                with timer.section("data"):
                    x = torch.randn(32, 32, generator=data)
                    y = torch.randint(0, 4, (32,), generator=data)
                with timer.section("forward"):
                    time.sleep(0.01)
                    loss = F.cross_entropy(model(x), y)
                with timer.section("backward"):
                    loss.backward()
                with timer.section("optimizer"):
                    opt.step()
                    opt.zero_grad()
            if (step + 1) % eval_every == 0:
                with timer.step(step, phase="eval"), torch.no_grad():
                    model.eval()
                    correct = (model(val_x).argmax(1) == val_y).sum().float()
                    if first_eval and rank == hang_rank and hang_in == "eval" and once():
                        stop_here(hang_how)
                    total = torch.stack([correct, torch.tensor(float(len(val_y)))])
                    dist.all_reduce(total)
                    model.train()
                first_eval = False
                if rank == 0:
                    print(f"step {step}: accuracy {float(total[0] / total[1]):.3f}", flush=True)
            if (step + 1) % save_every == 0:
                with timer.step(step, phase="checkpoint"):
                    state = {"model": model.module.state_dict(), "opt": opt.state_dict(),
                             "step": step}
                    if first_save and rank == hang_rank and hang_in == "save" and once():
                        stop_here(hang_how)
                    if first_save and rank == slow_rank:
                        slow_save(state, shard, slow_s, slow_how)
                    else:
                        torch.save(state, shard)
                    dist.barrier()
                first_save = False
    dist.destroy_process_group()
    print(f"rank {rank}/{world}: done", flush=True)


if __name__ == "__main__":
    main()
