"""One rank of a skip-before-history job (gloo, CPU), written as a user writes a training loop:
init_process_group, its sub-groups from new_group (every rank creates every group, in order), a
loop of steps, and a dump of the flight recorder when a collective fails. generate.py launches it.

The shape (shapes.py) says the groups, the step's collectives and the one rank that leaves one out
at its first step. Every rank dumps in the exception handler of its timeout, in both forms:
RAW_DIR/rank_N.pkl is torch's own dump, unedited; REPAIRED_DIR/rank_N.pkl is faultlens'
FlightRecorderTrigger's (pg_config repaired). Then it waits to be ended, so that a peer's exit is
not what fails the others (each fails on its own timeout).

Env: RANK SHAPE INIT OUT TIMEOUT_S (every collective's group's timeout).
"""

import datetime as dt
import os
import time
import traceback

import torch
import torch.distributed as dist

from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger
from tests.torch_jobs.skip_history.shapes import BY_NAME

rank = int(os.environ["RANK"])
shape = BY_NAME[os.environ["SHAPE"]]
out = os.environ["OUT"]
parent = os.getppid()

# the rendezvous and the groups' creation under a long timeout (a loaded machine's slow start-ups
# must not end the job before it starts), then the job's own collective timeout on every group
start = dt.timedelta(seconds=600)
dist.init_process_group(
    "gloo", init_method=os.environ["INIT"], rank=rank, world_size=shape.world, timeout=start
)
mine = {"world": (dist.group.WORLD, tuple(range(shape.world)))}
for kind, desc, table in shape.groups:
    for ranks in table:
        group = dist.new_group(list(ranks), timeout=start, group_desc=desc)
        if rank in ranks:
            mine[kind] = (group, ranks)
timeout = dt.timedelta(seconds=float(os.environ.get("TIMEOUT_S", "3")))
for group, _ in mine.values():
    dist.distributed_c10d._set_pg_timeout(timeout, group)


def run(kind: str, op: str) -> None:
    if kind not in mine:
        return
    group, ranks = mine[kind]
    x = torch.ones(16) * (rank + 1)
    if op == "all_reduce":
        dist.all_reduce(x, group=group)
    elif op == "send_up":  # the group's lower rank sends its activations to the higher one
        low, high = ranks
        if rank == low:
            dist.send(x, dst=high, group=group)
        else:
            dist.recv(x, src=low, group=group)
    else:
        raise ValueError(f"unknown op {op}")


try:
    for step in range(shape.steps):
        for i, (kind, op) in enumerate(shape.program):
            if (rank, step, i) == (shape.skipper, shape.skip_step, shape.skip_op):
                continue  # the bug: this rank leaves the collective out and goes on
            run(kind, op)
except Exception:
    raw = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
    os.makedirs(os.path.join(out, "raw"), exist_ok=True)
    with open(os.path.join(out, "raw", f".rank_{rank}.tmp"), "wb") as f:
        f.write(raw)
    os.replace(
        os.path.join(out, "raw", f".rank_{rank}.tmp"), os.path.join(out, "raw", f"rank_{rank}.pkl")
    )
    FlightRecorderTrigger(
        os.path.join(out, "repaired"),
        rank=rank,
        world_size=shape.world,
        signum=None,
        include_stack_traces=False,
        include_own_stacks=False,
    ).dump("timeout")
    os.remove(os.path.join(out, "repaired", f"rank_{rank}.json"))
    with open(os.path.join(out, f"error_{rank}.txt"), "w") as f:
        f.write(traceback.format_exc())
# the launcher ends every rank once all have dumped
while os.getppid() == parent:
    time.sleep(0.2)
os._exit(0)
