"""One rank of a completed-mismatch job (gloo, CPU; generate.py launches it): STEPS steps of a
world all_reduce and one scenario collective each; at step MISMATCH_STEP the scenario's odd ranks
call that collective with another shape or dtype of the same byte count, which gloo completes (it
moves bytes). Every rank then writes its flight-recorder dump and waits to be ended.

Env: RANK WORLD INIT OUT SCENARIO ODD (comma-separated ranks) STEPS MISMATCH_STEP MODE (`raw`:
torch's own dump, unedited; `repaired`: faultlens' FlightRecorderTrigger, pg_config repaired)."""

import datetime as dt
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD"])
out = os.environ["OUT"]
scenario = os.environ["SCENARIO"]
odd = {int(r) for r in os.environ["ODD"].split(",") if r}
steps = int(os.environ.get("STEPS", "4"))
mismatch_step = int(os.environ.get("MISMATCH_STEP", "1"))
parent = os.getppid()

dist.init_process_group(
    "gloo",
    init_method=os.environ["INIT"],
    rank=rank,
    world_size=world,
    timeout=dt.timedelta(seconds=60),
)
# pair groups [0, 1], [2, 3], ...: every rank creates every group, in the same order
pairs = [dist.new_group([p, p + 1], group_desc=f"pair_{p // 2}") for p in range(0, world, 2)]
pair = pairs[rank // 2]


def collective(step: int) -> None:
    bad = step == mismatch_step and rank in odd
    if scenario == "broadcast_shape":  # the world broadcasts 16 floats; odd ranks as 4 x 4
        dist.broadcast(torch.ones(4, 4) if bad else torch.ones(16), src=0)
    elif scenario == "all_reduce_dtype":  # odd ranks reduce int32 where the others reduce float32
        dist.all_reduce(torch.ones(16, dtype=torch.int32) if bad else torch.ones(16))
    elif scenario == "pair_broadcast_shape":  # each pair broadcasts; odd ranks as 2 x 8
        dist.broadcast(
            torch.ones(2, 8) if bad else torch.ones(16),
            src=dist.get_process_group_ranks(pair)[0],
            group=pair,
        )
    else:
        raise SystemExit(f"unknown scenario {scenario}")


for step in range(steps):
    dist.all_reduce(torch.ones(8))
    collective(step)

if os.environ.get("MODE", "raw") == "raw":
    data = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
    with open(os.path.join(out, f".rank_{rank}.tmp"), "wb") as f:
        f.write(data)
    os.replace(os.path.join(out, f".rank_{rank}.tmp"), os.path.join(out, f"rank_{rank}.pkl"))
else:
    from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger

    trigger = FlightRecorderTrigger(
        out,
        rank=rank,
        world_size=world,
        signum=None,
        include_stack_traces=False,
        include_own_stacks=False,
    )
    trigger.dump("probe")
    os.remove(os.path.join(out, f"rank_{rank}.json"))
# the launcher ends every rank once all have dumped
while os.getppid() == parent:
    time.sleep(0.5)
os._exit(0)
