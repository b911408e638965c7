"""Flight-recorder dumps built from the fields the reference lists (NCCL-flavoured by default), and
a small synchronous job simulator that produces the dumps of a multi-group job where one rank
misbehaves.

Only the *shape* of a dump is made here; the real artifacts (the public NCCL set, the gloo torchrun
fixtures) are what the analysis is validated on. These exercise formats and cases no single real set
covers.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0 = 1_758_580_156_000_000_000


def entry(
    *,
    record_id: int,
    seq: int,
    group: tuple[str, str] = ("0", "default_pg"),
    pg_id: int = 0,
    op: str = "nccl:all_reduce",
    sizes: Sequence[Sequence[int]] = ((1024,),),
    dtype: str = "Float",
    out_sizes: Sequence[Sequence[int]] | None = None,
    state: str = "completed",
    t: int | None = None,
    retired: bool | None = None,
    p2p_seq: int = 0,
    is_p2p: bool = False,
    frames: bool = True,
    timeout_ms: int = 600_000,
) -> dict[str, Any]:
    created = T0 + record_id * 1_000_000 if t is None else t
    done = state == "completed"
    return {
        "record_id": record_id,
        "pg_id": pg_id,
        "process_group": group,
        "thread_name": "pt_main_thread",
        "thread_id": "140000000000000",
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": seq,
        "profiling_name": op,
        "time_created_ns": created,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": [dtype] * len(sizes),
        "output_sizes": [list(s) for s in (out_sizes if out_sizes is not None else sizes)],
        "output_dtypes": [dtype] * len(out_sizes if out_sizes is not None else sizes),
        "state": state,
        "time_discovered_started_ns": created + 1000 if state in ("started", "completed") else None,
        "time_discovered_completed_ns": created + 5000 if done else None,
        "retired": done if retired is None else retired,
        "timeout_ms": timeout_ms,
        "is_p2p": is_p2p,
        **(
            {
                "frames": [
                    {
                        "name": op.split(":")[-1],
                        "filename": "/opt/torch/distributed/distributed_c10d.py",
                        "line": 3245,
                    },
                    {
                        "name": "forward",
                        "filename": "/workspace/model/layers.py",
                        "line": 512 + seq % 7,
                    },
                ]
            }
            if frames
            else {}
        ),
    }


def pg_config(groups: dict[str, tuple[str, Sequence[int]]]) -> dict[str, dict[str, str]]:
    """{name: (desc, ranks)} -> pg_config as NCCL writes it (keyed by group name, ranks as a
    string).
    """
    return {
        name: {"name": name, "desc": desc, "ranks": str(list(ranks))}
        for name, (desc, ranks) in groups.items()
    }


def dump(
    entries: list[dict[str, Any]],
    config: dict[str, Any],
    *,
    version: str = "2.9",
    pg_status: dict[str, Any] | None = None,
    rank: int | None = None,
    nccl: bool = True,
) -> dict[str, Any]:
    top: dict[str, Any] = {"version": version, "pg_config": config}
    if nccl:
        top["nccl_version"] = "2.27.3"
    else:
        top["comm_lib_version"] = ""
    top["pg_status"] = pg_status if pg_status is not None else _status(entries)
    top["entries"] = entries
    if rank is not None:
        top["rank"] = rank
    return top


def _status(entries: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    status: dict[str, dict[str, int]] = {}
    for e in entries:
        if e["is_p2p"]:
            continue
        s = status.setdefault(
            str(e["pg_id"]),
            {
                "last_enqueued_collective": -1,
                "last_started_collective": -1,
                "last_completed_collective": -1,
            },
        )
        s["last_enqueued_collective"] = max(s["last_enqueued_collective"], e["collective_seq_id"])
        if e["state"] == "completed" or e["retired"]:
            s["last_completed_collective"] = max(
                s["last_completed_collective"], e["collective_seq_id"]
            )
    return status


def json_form(top: dict[str, Any]) -> dict[str, Any]:
    """The JSON dump's differences (reference): no frames, time_discovered_* 0 instead of None,
    process_group a list, pg_status values strings, an extra nccl_comm_state."""
    out = {k: v for k, v in top.items() if k != "entries"}
    out["pg_status"] = {
        k: {kk: str(vv) for kk, vv in v.items()} for k, v in top.get("pg_status", {}).items()
    }
    out["nccl_comm_state"] = {}
    entries = []
    for e in top.get("entries", []):
        e = {k: v for k, v in e.items() if k != "frames"}
        e["process_group"] = list(e["process_group"])
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[key] = e[key] or 0
        entries.append(e)
    out["entries"] = entries
    return out


def write_set(directory: Path, dumps: dict[int, dict[str, Any]], *, fmt: str = "pickle",
              name: str = "_dump_{rank}", protocol: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, top in dumps.items():
        if fmt == "pickle":
            (directory / name.format(rank=rank)).write_bytes(pickle.dumps(top, protocol=protocol))
        else:
            (directory / name.format(rank=rank)).write_text(json.dumps(json_form(top)))
    return directory


# --------------------------------------------------------------------------------------------------
# a synchronous job: a collective completes when every member has entered it; a rank blocks in it
# until then


@dataclass
class Step:
    group: str  # a group name, or a desc: then each rank uses its own group of that desc
    op: str = "nccl:all_reduce"
    sizes: tuple[tuple[int, ...], ...] = ((4096,),)


@dataclass
class Fault:
    rank: int
    step: int
    index: int  # position in the step's program
    kind: str = "stop"  # 'stop': stuck before it (never joins); 'skip': leaves it out and goes on


@dataclass
class Job:
    groups: dict[str, tuple[str, tuple[int, ...]]]  # name -> (desc, ranks)
    program: list[Step]  # per training step, identical on every member of each group
    steps: int
    faults: list[Fault] = field(default_factory=list)
    comm: str = "nccl"

    def _resolve(self, group: str, rank: int) -> str | None:
        if group in self.groups:
            return group if rank in self.groups[group][1] else None
        for name, (desc, ranks) in self.groups.items():
            if desc == group and rank in ranks:
                return name
        return None

    def run(self) -> dict[int, dict[str, Any]]:
        world = sorted({r for _, ranks in self.groups.values() for r in ranks})
        plans: dict[int, list[tuple[int, int, Step]]] = {}
        for rank in world:
            plan = []
            for step in range(self.steps):
                for index, generic in enumerate(self.program):
                    name = self._resolve(generic.group, rank)
                    if name is None:
                        continue
                    item = Step(name, generic.op, generic.sizes)
                    fault = next(
                        (
                            f
                            for f in self.faults
                            if f.rank == rank and f.step == step and f.index == index
                        ),
                        None,
                    )
                    if fault and fault.kind == "stop":
                        plan.append((step, index, Step("__stop__")))
                        break
                    if fault and fault.kind == "skip":
                        continue
                    plan.append((step, index, item))
                else:
                    continue
                break
            plans[rank] = plan
        local_ids = {rank: {} for rank in world}
        pos = {rank: 0 for rank in world}
        seq = {(rank, g): 0 for rank in world for g in self.groups}
        entered: dict[tuple[str, int], set[int]] = {}
        entries: dict[int, list[dict[str, Any]]] = {rank: [] for rank in world}
        waiting: dict[int, tuple[str, int] | None] = {rank: None for rank in world}
        clock = 0
        progressed = True
        while progressed:
            progressed = False
            for rank in world:
                if waiting[rank] is not None:
                    g, s = waiting[rank]
                    if entered[(g, s)] >= set(self.groups[g][1]):
                        waiting[rank] = None
                        progressed = True
                    else:
                        continue
                if pos[rank] >= len(plans[rank]):
                    continue
                _step, _index, item = plans[rank][pos[rank]]
                if item.group == "__stop__":
                    continue
                pos[rank] += 1
                seq[(rank, item.group)] += 1
                s = seq[(rank, item.group)]
                entered.setdefault((item.group, s), set()).add(rank)
                clock += 1
                pg_id = local_ids[rank].setdefault(item.group, len(local_ids[rank]))
                entries[rank].append(
                    entry(
                        record_id=len(entries[rank]),
                        seq=s,
                        group=(item.group, self.groups[item.group][0]),
                        pg_id=pg_id,
                        op=item.op.replace("nccl:", f"{self.comm}:"),
                        sizes=item.sizes,
                        state="scheduled",
                        retired=False,
                        t=T0 + clock * 1_000_000,
                        frames=False,
                    )
                )
                waiting[rank] = (item.group, s)
                progressed = True
        # completion: a collective every member entered is complete
        for rank in world:
            for e in entries[rank]:
                members = set(self.groups[e["process_group"][0]][1])
                if entered[(e["process_group"][0], e["collective_seq_id"])] >= members:
                    e["state"] = "completed" if self.comm == "nccl" else "scheduled"
                    e["retired"] = True
                    e["time_discovered_completed_ns"] = (
                        e["time_created_ns"] + 500 if self.comm == "nccl" else None
                    )
        config = pg_config(self.groups)
        return {
            rank: dump(
                entries[rank],
                {k: v for k, v in config.items() if rank in self.groups[k][1]},
                rank=rank,
                nccl=self.comm == "nccl",
                version="2.9" if self.comm == "nccl" else "2.10",
            )
            for rank in world
        }


def megatron_like(tp: int = 2, dp: int = 2, pp: int = 2) -> dict[str, tuple[str, tuple[int, ...]]]:
    """TP/DP/PP groups of a tp*dp*pp job, Megatron rank order (tp fastest)."""
    world = tp * dp * pp
    groups: dict[str, tuple[str, tuple[int, ...]]] = {"0": ("default_pg", tuple(range(world)))}
    name = 1
    for stage in range(pp):
        for d in range(dp):
            base = stage * tp * dp + d * tp
            groups[str(name)] = ("TENSOR_MODEL_PARALLEL_GROUP", tuple(range(base, base + tp)))
            name += 1
    for stage in range(pp):
        for t in range(tp):
            groups[str(name)] = (
                "DATA_PARALLEL_GROUP",
                tuple(stage * tp * dp + d * tp + t for d in range(dp)),
            )
            name += 1
    for i in range(tp * dp):
        groups[str(name)] = (
            "PIPELINE_MODEL_PARALLEL_GROUP",
            tuple(i + s * tp * dp for s in range(pp)),
        )
        name += 1
    return groups


def groups_named(groups: dict[str, tuple[str, tuple[int, ...]]], desc: str) -> list[str]:
    return [name for name, (d, _) in groups.items() if d == desc]


def ranks_of(dumps: dict[int, Any]) -> Iterable[int]:
    return sorted(dumps)
