"""Flight-recorder dumps of a hung NCCL job, as `collectives` rows (one per entry per rank).

Each rank's CPU thread enqueues the collectives of a step asynchronously and only blocks at the
end-of-step synchronisation; the GPU stream runs them in order. A collective completes when every
member has enqueued it and finished everything before it; a send/recv pair completes when both sides
reach it. The dump of a hang therefore follows from who stopped where: a rank stuck in host code
never enqueues the step (its peers enqueue everything and stall in the first collective that needs
it); a broken NVLink leaves the group's collectives started but never completed; a dead node writes
no dump at all. Entry states are NCCL's: completed, started (the kernel that waits), scheduled
(queued behind it). Nothing in a row says who is to blame: the analysis has to find it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from faultlens.controller.lab.simulate.cluster import Placement

FR_VERSION = "2.10"
COMM_LIB = "2.21.5"
HIDDEN = 8192
SEQ = 4096
MICRO = 1

FRAMES = {
    "tp": ["_all_gather_base (torch/distributed/distributed_c10d.py:4019)",
           "gather_along_first_dim (megatron/core/tensor_parallel/mappings.py:246)",
           "forward (megatron/core/tensor_parallel/layers.py:688)"],
    "dp": ["all_reduce (torch/distributed/distributed_c10d.py:2806)",
           "start_grad_sync (megatron/core/distributed/param_and_grad_buffer.py:368)",
           "finish_grad_sync (megatron/core/distributed/distributed_data_parallel.py:410)"],
    "world": ["barrier (torch/distributed/distributed_c10d.py:4630)",
              "initialize_model_parallel (megatron/core/parallel_state.py:591)"],
    "pp": ["_batch_p2p_ops (megatron/core/pipeline_parallel/p2p_communication.py:118)",
           "_communicate (megatron/core/pipeline_parallel/p2p_communication.py:342)",
           "forward_backward_pipelining_without_interleaving "
           "(megatron/core/pipeline_parallel/schedules.py:1390)"],
}


@dataclass(frozen=True)
class Group:
    name: str
    desc: str
    ranks: tuple[int, ...]
    kind: str  # tp, dp, pp


@dataclass(frozen=True)
class Op:
    group: str
    kind: str  # collective | send | recv
    label: str  # profiling name
    key: tuple  # what both/all sides of the operation share
    sizes: tuple[int, ...]
    numel: int


INIT_BARRIER = Op("0", "collective", "nccl:all_reduce", ("world", "init"), (1,), 1)


def build_groups(placement: Placement) -> tuple[dict[str, Group], dict[int, dict[str, str]]]:
    """Megatron-style process groups; names are creation-order counters, as torch assigns them."""
    groups: dict[str, Group] = {
        "0": Group("0", "default_pg", tuple(range(placement.world_size)), "world")
    }
    member_of: dict[int, dict[str, str]] = {r: {"world": "0"} for r in range(placement.world_size)}
    counter = 1
    for kind, desc, ranks_list in (("tp", "TENSOR_MODEL_PARALLEL_GROUP", placement.tp_groups()),
                                   ("dp", "DATA_PARALLEL_GROUP", placement.dp_groups()),
                                   ("pp", "PIPELINE_MODEL_PARALLEL_GROUP", placement.pp_groups())):
        if kind == "pp" and placement.pp_size == 1:
            continue
        for ranks in ranks_list:
            name = str(counter)
            counter += 1
            groups[name] = Group(name, desc, tuple(ranks), kind)
            for r in ranks:
                member_of[r][kind] = name
    return groups, member_of


def step_program(
    rank: int, step: int, placement: Placement, member_of: dict[int, dict[str, str]]
) -> list[Op]:
    """The communication of one training step of one rank, in stream order."""
    tp_size, dp_size, pp_size = placement.tp_size, placement.dp_size, placement.pp_size
    stage = (rank // tp_size) // dp_size
    groups = member_of[rank]
    act = (SEQ // tp_size, MICRO, HIDDEN)
    numel_act = math.prod(act)
    ops: list[Op] = []
    prev_rank = rank - tp_size * dp_size
    next_rank = rank + tp_size * dp_size

    def tp(i: int, gather: bool) -> Op:
        label = "nccl:_all_gather_base" if gather else "nccl:_reduce_scatter_base"
        sizes = act if gather else (SEQ, MICRO, HIDDEN)
        return Op(
            groups["tp"],
            "collective",
            label,
            ("tp", groups["tp"], step, i),
            sizes,
            math.prod(sizes),
        )

    def p2p(direction: str, peer: int, send: bool) -> Op:
        src, dst = (rank, peer) if send else (peer, rank)
        label = f"nccl:send {rank}->{peer}" if send else f"nccl:recv {rank}<-{peer}"
        return Op(
            groups["pp"],
            "send" if send else "recv",
            label,
            ("pp", step, direction, src, dst),
            act,
            numel_act,
        )

    if stage > 0:
        ops.append(p2p("fwd", prev_rank, send=False))
    ops += [tp(0, True), tp(1, False)]
    if stage < pp_size - 1:
        ops.append(p2p("fwd", next_rank, send=True))
        ops.append(p2p("bwd", next_rank, send=False))
    ops += [tp(2, True), tp(3, False)]
    if stage > 0:
        ops.append(p2p("bwd", prev_rank, send=True))
    grad_numel = 1 << 27
    ops.append(
        Op(
            groups["dp"],
            "collective",
            "nccl:all_reduce",
            ("dp", groups["dp"], step),
            (grad_numel,),
            grad_numel,
        )
    )
    return ops


@dataclass(frozen=True)
class HangSpec:
    """Who stopped where. stuck: rank -> number of this step's ops it enqueued before it stopped (0:
    none).
    dead: ranks that write no dump. broken_groups: groups whose collectives never complete (a failed
    link)."""

    stuck: dict[int, int]
    dead: frozenset[int]
    broken_groups: frozenset[str]


def resolve(placement: Placement, step: int, spec: HangSpec,
            member_of: dict[int, dict[str, str]]) -> tuple[dict[int, list[Op]], dict[int, int]]:
    """Per rank: the ops of `step` it enqueued, and how many of them completed."""
    posted: dict[int, list[Op]] = {}
    for r in range(placement.world_size):
        if r in spec.dead:
            posted[r] = []
            continue
        program = step_program(r, step, placement, member_of)
        posted[r] = program[: spec.stuck[r]] if r in spec.stuck else program
    done = {r: 0 for r in posted}
    members: dict[tuple, set[int]] = {}
    for r in range(placement.world_size):
        for op in step_program(r, step, placement, member_of):
            members.setdefault(op.key, set()).add(r)
    changed = True
    while changed:
        changed = False
        for r in posted:
            while done[r] < len(posted[r]):
                op = posted[r][done[r]]
                if op.kind == "collective" and op.group in spec.broken_groups:
                    break
                ready = all(
                    m not in spec.dead
                    and done[m] < len(posted[m])
                    and posted[m][done[m]].key == op.key
                    for m in members[op.key]
                )
                if not ready:
                    break
                for m in members[op.key]:
                    done[m] += 1
                changed = True
    return posted, done


def dump_rows(
    *,
    placement: Placement,
    groups: dict[str, Group],
    member_of: dict[int, dict[str, str]],
    attempt_first_step: int,
    step: int,
    step_starts: dict[int, int],
    step_ends: dict[int, int],
    spec: HangSpec,
    dump_ts: int,
    dump_id: str,
    entries_per_rank: int,
    identity,
    timeout_ms: int,
    rng: np.random.Generator,
    responding: set[int],
) -> list[dict[str, Any]]:
    """The collectives rows of one dump set taken at dump_ts. `responding`: ranks whose dump trigger
    ran.
    """
    posted, done = resolve(placement, step, spec, member_of)
    history_steps = max(1, entries_per_rank // 9 + 1)
    rows: list[dict[str, Any]] = []
    for r in sorted(responding):
        if r in spec.dead:
            continue
        entries: list[tuple[Op, int, str]] = []  # (op, step, state)
        first_history = max(attempt_first_step, step - history_steps)
        # the start-up barrier of the attempt is still in the ring buffer
        if first_history == attempt_first_step:
            entries.append((INIT_BARRIER, attempt_first_step, "completed"))
        for s in range(first_history, step):
            entries += [(op, s, "completed") for op in step_program(r, s, placement, member_of)]
        for i, op in enumerate(posted[r]):
            state = "completed" if i < done[r] else ("started" if i == done[r] else "scheduled")
            entries.append((op, step, state))
        # sequence numbers count from the start of the attempt (new communicators after every
        # restart)
        steps_done = {s: s - attempt_first_step for s in range(attempt_first_step, step + 1)}
        coll_seq: dict[str, int] = {}
        p2p_seq: dict[str, int] = {}
        tp_per_step, dp_per_step = 4, 1
        base_tp = steps_done[entries[0][1]] * tp_per_step if entries else 0
        base_dp = steps_done[entries[0][1]] * dp_per_step if entries else 0
        first_stage = (r // placement.tp_size) // placement.dp_size
        p2p_per_step = (1 if first_stage > 0 else 0) * 2 + (
            1 if first_stage < placement.pp_size - 1 else 0
        ) * 2
        base_p2p = steps_done[entries[0][1]] * p2p_per_step if entries else 0
        for kind, name in member_of[r].items():
            coll_seq[name] = base_tp if kind == "tp" else base_dp if kind == "dp" else 0
            p2p_seq[name] = base_p2p if kind == "pp" else 0
        numbered = []
        for op, s, state in entries:
            if op.kind == "collective":
                coll_seq[op.group] += 1
            else:
                p2p_seq[op.group] += 1
            numbered.append((op, s, state, coll_seq[op.group], p2p_seq[op.group]))
        numbered = numbered[-entries_per_rank:]
        status: dict[str, dict[str, int]] = {}
        for op, _s, state, cseq, pseq in numbered:
            seq = cseq if op.kind == "collective" else pseq
            st = status.setdefault(op.group, {"enq": -1, "start": -1, "comp": -1})
            st["enq"] = max(st["enq"], seq)
            if state in ("started", "completed"):
                st["start"] = max(st["start"], seq)
            if state == "completed":
                st["comp"] = max(st["comp"], seq)
        place = placement.place(r)
        record_base = int(rng.integers(10_000, 900_000))
        for j, (op, s, state, cseq, pseq) in enumerate(numbered):
            group = groups[op.group]
            t0 = step_starts.get(s, dump_ts)
            created = t0 + int((j % 9) * 0.05e9) + int(rng.integers(0, 2_000_000))
            started = (
                created + int(rng.integers(50_000, 900_000))
                if state in ("started", "completed")
                else None
            )
            end_of = step_ends.get(s)
            completed = None
            if state == "completed":
                completed = started + int(rng.integers(200_000, 40_000_000))
                if end_of is not None:
                    completed = min(completed, end_of)
            st = status[op.group]
            rows.append(
                {
                    **identity(place, dump_ts),
                    "dump_id": dump_id,
                    "fr_version": FR_VERSION,
                    "comm_lib": COMM_LIB,
                    "pg_id": group.name,
                    "pg_name": group.name,
                    "pg_desc": group.desc,
                    "pg_ranks": list(group.ranks),
                    "pg_last_enqueued": st["enq"],
                    "pg_last_started": st["start"],
                    "pg_last_completed": st["comp"],
                    "record_id": record_base + j,
                    "collective_seq_id": cseq,
                    "p2p_seq_id": pseq if op.kind != "collective" else 0,
                    "op_id": cseq if op.kind == "collective" else pseq,
                    "op": op.label,
                    "state": state,
                    "is_p2p": op.kind != "collective",
                    "retired": state == "completed",
                    "time_created": created,
                    "time_started": started,
                    "time_completed": completed,
                    "input_sizes": [list(op.sizes)],
                    "input_dtypes": ["BFloat16"],
                    "output_sizes": [list(op.sizes)],
                    "output_dtypes": ["BFloat16"],
                    "timeout_ms": timeout_ms,
                    "frames": FRAMES[group.kind],
                }
            )
    return rows


def first_incomplete(placement: Placement, step: int, spec: HangSpec,
                     member_of: dict[int, dict[str, str]]) -> dict[int, Op | None]:
    """For each live rank, the op its stream is stuck in (None: it enqueued nothing it could not
    finish).
    """
    posted, done = resolve(placement, step, spec, member_of)
    return {
        r: (posted[r][done[r]] if done[r] < len(posted[r]) else None)
        for r in posted
        if r not in spec.dead
    }


NCCL_OP_TYPES = {"nccl:all_reduce": "ALLREDUCE", "nccl:_all_gather_base": "_ALLGATHER_BASE",
                 "nccl:_reduce_scatter_base": "_REDUCE_SCATTER_BASE"}


def op_seq(rank: int, step: int, op: Op, attempt_first_step: int, placement: Placement,
           member_of: dict[int, dict[str, str]]) -> int:
    """The sequence number NCCL gave `op` on `rank` (collective_seq_id, or p2p_seq_id for
    send/recv), counting from the start of the attempt, as the dump rows number them."""
    per_step = step_program(rank, step, placement, member_of)
    same = [
        o
        for o in per_step
        if o.group == op.group and (o.kind == "collective") == (op.kind == "collective")
    ]
    before = (step - attempt_first_step) * len(same)
    return before + same.index(op) + 1


def op_type(op: Op) -> str:
    if op.kind == "send":
        return "SEND"
    if op.kind == "recv":
        return "RECV"
    return NCCL_OP_TYPES.get(op.label, op.label.split(":")[-1].upper())
