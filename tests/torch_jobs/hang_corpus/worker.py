"""One rank of the hang-corpus job: runs every scenario of scenarios.py at once, each in its own
thread on its own process groups, and writes this rank's real flight-recorder dump per scenario when
the generator asks.

    python -m tests.torch_jobs.hang_corpus.worker RANK INIT_METHOD OUT_DIR [SUITE]

SUITE (default: this corpus' scenarios module) names what to run as 'module' or 'module:attribute':
an object with WORLD_SIZE (the processes of the launch) and SCENARIOS, each scenario with name,
phase, faults, steps, world_size (its job's ranks: 0 .. world_size - 1 of the launch; the other
processes create its groups and sit it out), group_specs() (its groups in creation order, see
GroupSpec), program_of(rank) and, optionally, step_sleep_s (tests/torch_jobs/hang_heldout runs other
layouts through it).

Why one process per rank for all scenarios: 8 ranks x 23 scenarios as separate torch jobs would
import torch 184 times (minutes of CPU); here 8 processes import it once. Each scenario's groups are
created with new_group (every rank calls new_group for every group in the same order, so names
agree), and each scenario runs in a thread named "scenario:<name>". The flight recorder is per
process: a scenario's dump is this rank's torch dump (`_dump_fr_trace`) restricted to that
scenario's groups (entries, pg_status, and pg_config written from torch's own group tables, as
collectors/training/fr_trigger.py repairs gloo's), its record ids renumbered 0, 1, ... in their
order (as a process running one job numbers them), with the top-level rank, world_size and pid
added; torch's JSON form of the same moment, restricted alike, goes to the scenario's dumps-json/.

Control files (OUT_DIR/.control): the worker writes status_rank_<r>.json (each scenario's progress
counter and state) every 0.2 s; the generator touches dump_<phase> to ask for dumps, go_2 to start
phase 2; the worker answers dumped_<phase>_rank_<r>.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from faultlens.collectors.artifacts.safe_pickle import safe_loads
from tests.torch_jobs.hang_corpus import scenarios as sc

N = 16
# never set: a stuck rank stays where it is until the generator ends the process
RELEASE = threading.Event()


class DataLoader:
    """Stands for a data loader whose next batch never comes (a stuck rank's usual place)."""

    def __next__(self) -> None:
        while not RELEASE.is_set():
            time.sleep(0.05)


def save_checkpoint() -> None:
    while not RELEASE.is_set():
        time.sleep(0.05)


def load_suite(spec: str):
    module, _, attribute = spec.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


class Groups:
    """A scenario's groups, created as its group_specs() say (every process calls every creation, in
    order).
    """

    def __init__(self, scenario, rank: int, timeout: dt.timedelta) -> None:
        self.names: dict[str, tuple[str, tuple[int, ...]]] = {}  # group name -> (desc, ranks)
        self.mine: dict[str, tuple[dist.ProcessGroup, tuple[int, ...]]] = {}
        for spec in scenario.group_specs():
            lists = [list(ranks) for ranks in spec.groups]
            if spec.via == "default":
                made = [dist.group.WORLD]
            elif spec.via == "new_subgroups":
                _, made = dist.new_subgroups(
                    group_size=len(lists[0]), timeout=timeout, group_desc=spec.desc
                )
            elif spec.via == "enumeration":
                _, made = dist.new_subgroups_by_enumeration(
                    lists, timeout=timeout, group_desc=spec.desc
                )
            else:
                made = [
                    dist.new_group(ranks, timeout=timeout, group_desc=spec.desc) for ranks in lists
                ]
            if spec.via in ("new_subgroups", "enumeration"):
                # every group, in list order; a rank's non-member ones are placeholders
                made = [g if rank in ranks else None for g, ranks in zip(made, lists, strict=True)]
            for group, ranks in zip(made, spec.groups, strict=True):
                if rank in ranks and group is not None:
                    name = dist.distributed_c10d._get_process_group_name(group)
                    desc = getattr(group, "group_desc", None) or spec.desc or "undefined"
                    self.names[name] = (desc, tuple(ranks))
                    self.mine[spec.kind] = (group, tuple(ranks))


class Runner:
    def __init__(self, scenario, groups: Groups, rank: int, status: dict) -> None:
        self.s = scenario
        self.groups = groups
        self.rank = rank
        self.status = status
        self.faults = {(f.step, f.op): f.kind for f in scenario.faults if f.rank == rank}

    def mark(self, state: str) -> None:
        counter, _ = self.status.get(self.s.name, (0, ""))
        self.status[self.s.name] = (counter + 1, state)

    def applied(self, kind: str, step: int, op: int) -> None:
        """A fault this rank carried out (the generator checks each scenario's faults all happened).
        """
        key = f"{self.s.name}{sc.FAULTS_SUFFIX}"
        self.status[key] = [*self.status.get(key, []), f"{kind} step {step} op {op}"]

    def run(self) -> None:
        try:
            self._run()
            self.mark("done")
        except Exception as exc:  # a crash, or a gloo error: the thread ends as the rank would
            self.mark(f"error: {type(exc).__name__}: {str(exc)[:200]}")

    def _run(self) -> None:
        if self.rank >= self.s.world_size:
            return  # not a rank of this scenario's job
        program = self.s.program_of(self.rank)
        pause = float(getattr(self.s, "step_sleep_s", 0.0))
        for step in range(self.s.steps):
            if pause and step:
                time.sleep(pause)
            order = list(range(len(program)))
            for (f_step, f_op), kind in self.faults.items():
                if f_step == step and kind == "invert" and f_op + 1 < len(order):
                    order[f_op], order[f_op + 1] = order[f_op + 1], order[f_op]
                    self.applied(kind, step, f_op)
            for i in order:
                kind = self.faults.get((step, i))
                self.mark(f"step {step} op {i}")
                if kind is not None and kind != "invert":
                    self.applied(kind, step, i)
                if kind == "stuck":
                    self.mark("stuck")
                    next(DataLoader())
                elif kind == "checkpoint":
                    self.mark("stuck")
                    save_checkpoint()
                elif kind == "crash":
                    raise RuntimeError(f"injected crash at step {step} op {i}")
                elif kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif kind == "skip":
                    continue
                self.op(program[i], kind)
                self.mark(f"step {step} op {i} done")

    def op(self, op: sc.Op, kind: str | None) -> None:
        group_kind, name = op
        if group_kind not in self.groups.mine:
            return  # a group this rank is not a member of (the extra group)
        group, ranks = self.groups.mine[group_kind]
        x = torch.ones(N) * (self.rank + 1)
        if kind == "size":
            x = x.reshape(1, N)
        if name == "all_reduce" and kind == "op":
            name = "all_gather"
        if name == "all_reduce":
            dist.all_reduce(x, group=group)
        elif name == "all_gather":
            dist.all_gather([torch.empty_like(x) for _ in ranks], x, group=group)
        elif name == "broadcast":
            dist.broadcast(x, src=ranks[0], group=group)
        elif name == "gather":
            root = ranks[0]
            dist.gather(
                x,
                [torch.empty_like(x) for _ in ranks] if self.rank == root else None,
                dst=root,
                group=group,
            )
        elif name == "scatter":  # only the root (the group's first rank) holds the input list
            root = ranks[0]
            dist.scatter(
                torch.empty_like(x),
                [x.clone() for _ in ranks] if self.rank == root else None,
                src=root,
                group=group,
            )
        elif name == "all_gather_into_tensor":  # FSDP's parameter gather
            dist.all_gather_into_tensor(torch.empty(len(ranks) * N), x, group=group)
        elif name == "reduce_scatter":  # FSDP's gradient reduce (reduce_scatter_tensor)
            dist.reduce_scatter_tensor(torch.empty(N), torch.ones(len(ranks) * N), group=group)
        elif name == "all_to_all":  # an MoE token exchange (all_to_all_single)
            dist.all_to_all_single(
                torch.empty(len(ranks) * N), torch.ones(len(ranks) * N), group=group
            )
        elif name == "barrier":
            dist.barrier(group=group)
        elif name in ("send", "recv"):
            peer = next(r for r in ranks if r != self.rank)
            if name == "send":
                dist.send(x, dst=peer, group=group)
            else:
                dist.recv(x, src=peer, group=group)
        elif name in ("send_next", "send_prev", "recv_next", "recv_prev"):
            # a pipeline of more than two stages: the group's ranks in stage order, the peer one
            # stage on or back
            peer = ranks[ranks.index(self.rank) + (1 if name.endswith("next") else -1)]
            if name.startswith("send"):
                dist.send(x, dst=peer, group=group)
            else:
                dist.recv(x, src=peer, group=group)
        else:
            raise ValueError(f"unknown op {name}")


def _scenario_dump(trace: dict, groups: Groups, rank: int, world_size: int) -> dict:
    names = set(groups.names)
    entries = [
        e for e in trace.get("entries", []) if str(e.get("process_group", ("",))[0]) in names
    ]
    # record ids count this process' entries of every scenario; a process running one job would
    # number its own 0, 1, 2, ... in the same order (torch's analyzer relies on that), so they are
    # renumbered, order kept
    entries = [
        dict(e, record_id=i)
        for i, e in enumerate(sorted(entries, key=lambda e: e.get("record_id", 0)))
    ]
    pg_ids = {str(e.get("pg_id")) for e in entries} | names
    status = {k: v for k, v in (trace.get("pg_status") or {}).items() if str(k) in pg_ids}
    config = {name: {"name": name, "desc": desc, "ranks": str(list(ranks))}
              for name, (desc, ranks) in groups.names.items()}
    out = {k: v for k, v in trace.items() if k not in ("entries", "pg_status", "pg_config")}
    out.update(
        entries=entries,
        pg_status=status,
        pg_config=config,
        rank=rank,
        world_size=world_size,
        pid=os.getpid(),
        node="node-0",
    )
    return out


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


def main(argv: list[str]) -> int:
    rank, init, out = int(argv[0]), argv[1], Path(argv[2])
    suite = load_suite(argv[3]) if len(argv) > 3 else sc
    control = out / ".control"
    timeout = dt.timedelta(seconds=float(os.environ.get("FAULTLENS_CORPUS_PG_TIMEOUT_S", "300")))
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=suite.WORLD_SIZE, timeout=timeout
    )
    groups = {s.name: Groups(s, rank, timeout) for s in suite.SCENARIOS}
    status: dict[str, tuple[int, str]] = {}
    stop = threading.Event()

    parent = os.getppid()

    def report() -> None:
        writes = 0
        while not stop.is_set():
            # the generator is gone (killed outright): never outlive it, spinning
            if os.getppid() != parent:
                os._exit(1)
            # WRITES_KEY counts the reports: the generator takes a quiet spell as settled only where
            # this process was running all along (a starved process reports nothing new either)
            writes += 1
            _write(
                control / f"status_rank_{rank}.json",
                json.dumps({**status, sc.WRITES_KEY: writes}).encode(),
            )
            time.sleep(0.2)

    threading.Thread(target=report, name="status", daemon=True).start()
    dist.barrier()
    threads = {}
    for phase in (1, 2):
        if phase == 2:
            while not (control / "go_2").exists():
                time.sleep(0.05)
        for s in suite.SCENARIOS:
            if s.phase == phase:
                t = threading.Thread(
                    target=Runner(s, groups[s.name], rank, status).run,
                    name=f"scenario:{s.name}",
                    daemon=True,
                )
                threads[s.name] = t
                t.start()
        while not (control / f"dump_{phase}").exists():
            time.sleep(0.05)
        trace = safe_loads(
            torch._C._distributed_c10d._dump_fr_trace(True, False, False), source="torch dump"
        )
        as_json = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, False))
        for s in suite.SCENARIOS:
            if s.phase == phase and rank < s.world_size:
                dump = _scenario_dump(trace, groups[s.name], rank, s.world_size)
                _write(out / s.name / "dumps" / f"rank_{rank}.pkl", pickle.dumps(dump, protocol=2))
                # torch's JSON form of the same moment (every scenario is quiet by now), apart: a
                # set of JSON dumps only, as a cluster that keeps the JSON form has (dumps/ holds
                # the pickles alone)
                dump_json = _scenario_dump(as_json, groups[s.name], rank, s.world_size)
                _write(
                    out / s.name / "dumps-json" / f"rank_{rank}.json",
                    json.dumps(dump_json).encode(),
                )
        _write(control / f"dumped_{phase}_rank_{rank}", b"")
    stop.set()
    while os.getppid() == parent:  # the generator ends the process (or it is gone)
        time.sleep(1)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
