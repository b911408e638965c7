"""One rank of a DeviceMesh hang job (gloo, CPU; generate.py launches it): groups from
init_device_mesh, each step an all_reduce per mesh dim, a reduce_scatter and an all_gather on 'dp',
a pipeline send/recv on 'pp' (which gloo does not record) and a world all_reduce. At DUMP_AT seconds
it writes its flight-recorder dump, then waits to be ended (an early exit would break its peers'
collectives).

Env: RANK WORLD INIT DIMS NAMES OUT FAULTS DUMP_AT STEPS MODE. FAULTS: ';'-separated
'kind:rank:step:op', kind `never` (the rank stops in its own code before that op) or `skip` (it
leaves that op out and goes on). MODE `raw`: torch's own dump, unedited; `stacks`: faultlens'
FlightRecorderTrigger (pg_config repaired, own stacks beside)."""
import datetime as dt
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD"])
dims = tuple(int(x) for x in os.environ["DIMS"].split(","))
names = tuple(os.environ["NAMES"].split(","))
out = os.environ["OUT"]
steps = int(os.environ.get("STEPS", "6"))
dump_at = float(os.environ["DUMP_AT"])
faults = [f.split(":") for f in os.environ.get("FAULTS", "").split(";") if f]
parent = os.getppid()


def wait_for_the_end() -> None:
    """Sleep until the launcher ends this process; exit if the launcher is gone (killed outright).
    """
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=world,
                        timeout=dt.timedelta(seconds=120))
mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
groups = {n: mesh.get_group(n) for n in names}
t0 = time.time()

def dumper():
    while time.time() < t0 + dump_at:
        time.sleep(0.05)
    mode = os.environ.get("MODE", "raw")
    if mode == "raw":
        data = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
        with open(os.path.join(out, f".rank_{rank}.tmp"), "wb") as f:
            f.write(data)
        os.replace(os.path.join(out, f".rank_{rank}.tmp"), os.path.join(out, f"rank_{rank}.pkl"))
    else:
        from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger

        trig = FlightRecorderTrigger(
            out,
            rank=rank,
            world_size=world,
            signum=None,
            include_stack_traces=False,
            include_own_stacks=(mode == "stacks"),
        )
        trig.dump("probe")
        os.remove(os.path.join(out, f"rank_{rank}.json"))
    # the launcher ends every rank once all have dumped (an early exit breaks its peers' ones)
    wait_for_the_end()

threading.Thread(target=dumper, daemon=True).start()

def program():
    ops = []
    for n in names:
        if n == "pp":
            continue
        ops.append(("all_reduce", n))
    if "dp" in names:
        ops.append(("reduce_scatter", "dp"))
        ops.append(("all_gather", "dp"))
    if "pp" in names:
        ops.append(("pp", "pp"))
    ops.append(("world", None))
    return ops

def run(op, gname):
    if op == "world":
        dist.all_reduce(torch.ones(4))
        return
    g = groups[gname]
    size = dist.get_world_size(g)
    me = dist.get_rank(g)
    if op == "all_reduce":
        dist.all_reduce(torch.ones(64), group=g)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(torch.empty(16), torch.ones(16 * size), group=g)
    elif op == "all_gather":
        dist.all_gather_into_tensor(torch.empty(16 * size), torch.ones(16), group=g)
    elif op == "pp":
        t = torch.ones(32)
        ranks = dist.get_process_group_ranks(g)
        if me + 1 < size:
            dist.send(t, dst=ranks[me + 1], group=g)
        if me > 0:
            dist.recv(t, src=ranks[me - 1], group=g)

ops = program()
for step in range(steps):
    for i, (op, gname) in enumerate(ops):
        skip = False
        for kind, r, s, o in faults:
            if int(r) == rank and int(s) == step and int(o) == i:
                if kind == "never":
                    wait_for_the_end()  # stuck in its own code
                skip = kind == "skip"
        if not skip:
            run(op, gname)
wait_for_the_end()
