"""How an attempt ends: a crash (primary exceptions, their echoes on the peers, torchrun's failure
reports) or a hang (flight-recorder dumps, watchdog timeouts and aborts, SIGTERM for the rest)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from faultlens.controller.lab.simulate import process as proc
from faultlens.controller.lab.simulate import xid as xids
from faultlens.controller.lab.simulate.collectives import (
    HangSpec,
    dump_rows,
    first_incomplete,
    op_seq,
    op_type,
)
from faultlens.controller.lab.simulate.faults.pieces import add_xid
from faultlens.controller.lab.simulate.world import NS, World


def communicating_peers(world: World, ranks: set[int]) -> set[int]:
    """Ranks that share a data-parallel or pipeline group with any of `ranks` (they talk to them
    directly).
    """
    attempt = world.current
    peers: set[int] = set()
    for group in attempt.groups.values():
        if group.kind in ("dp", "pp") and ranks.intersection(group.ranks):
            peers.update(group.ranks)
    return peers - ranks


@dataclass
class Exit:
    """One rank process ending, as its node's torchrun agent reports it."""

    rank: int
    ts: int
    exit_code: int
    signal: str | None
    spec: proc.ExceptionSpec | None = None


def report_exits(world: World, exits: list[Exit]) -> None:
    """Each node's torchrun failure report: its ranks' exits, the earliest one named the Root Cause.
    """
    attempt = world.current
    placement = attempt.placement
    by_node: dict[str, list[Exit]] = {}
    for item in exits:
        by_node.setdefault(placement.place(item.rank).node.name, []).append(item)
    for items in by_node.values():
        root = min(items, key=lambda e: (proc.whole_seconds(e.ts), e.rank))
        for item in items:
            place = placement.place(item.rank)
            for row in world.proc.report(
                item.ts,
                place,
                attempt.number,
                attempt.pid(item.rank),
                exit_code=item.exit_code,
                signal=item.signal,
                spec=item.spec,
                root_cause=item is root,
            ):
                world.add("process_events", row)


def log_stderr(world: World, ts: int, rank: int, text: str) -> None:
    attempt = world.current
    for row in world.proc.stderr(ts, attempt.placement.place(rank), attempt.number, text):
        world.add("process_events", row)


def crash(
    world: World,
    rng: np.random.Generator,
    t: int,
    primaries: list[tuple[int, proc.ExceptionSpec, int]],
    *,
    echo: str | None = None,
    culprit_ips: tuple[str, ...] = (),
) -> int:
    """The end of an attempt after primary exceptions on `primaries` (rank, spec, ts). Survivors on
    the primaries' nodes are stopped by their agent; the others echo (NCCL remote error or gloo
    "Connection closed by peer") and get SIGTERM when the rendezvous restarts. Returns when the last
    process was gone."""
    attempt = world.current
    placement = attempt.placement
    primary_ranks = {r for r, _, _ in primaries}
    exits: list[Exit] = []
    for rank, spec, ts in primaries:
        place = placement.place(rank)
        world.add(
            "process_events",
            world.proc.exception(ts, place, attempt.number, attempt.pid(rank), spec),
        )
        exits.append(Exit(rank, ts + int(rng.uniform(0.2, 1.5) * NS), 1, None, spec))
    first_exit = min(e.ts for e in exits)
    primary_nodes = {placement.place(r).node.name for r in primary_ranks}
    ips = culprit_ips or tuple(sorted({placement.place(r).node.ip for r in primary_ranks}))
    peers = communicating_peers(world, primary_ranks)
    echo = echo or ("gloo" if rng.random() < 0.3 else "nccl")
    xid43_left = int(rng.integers(1, 3)) if rng.random() < 0.25 else 0
    for rank in range(placement.world_size):
        if rank in primary_ranks:
            continue
        place = placement.place(rank)
        # torchrun (monitor interval 0.1 s): the failed node's agent stops its workers at once and
        # re-enters the rendezvous; the other agents see a node waiting on their next tick and stop
        # theirs
        if place.node.name in primary_nodes:
            ts = first_exit + int(rng.uniform(0.05, 1.0) * NS)
        else:
            if rank in peers and rng.random() < 0.7:
                err_ts = first_exit + int(rng.uniform(0.1, 5.0) * NS)
                peer_ip = ips[int(rng.integers(0, len(ips)))]
                if echo == "gloo":
                    text = proc.gloo_closed_by_peer(peer_ip, int(rng.integers(20000, 60000)))
                else:
                    text = proc.nccl_remote_error(
                        peer_ip, int(rng.integers(30000, 60000)), place.node.ip, place.local_rank
                    )
                log_stderr(world, err_ts, rank, text)
            ts = first_exit + int(rng.uniform(1.0, 6.0) * NS)
        exits.append(Exit(rank, ts, -15, "SIGTERM"))
        if xid43_left and place.node.name not in primary_nodes and rng.random() < 0.05:
            add_xid(world, rng, ts + int(rng.uniform(0.1, 1.0) * NS), place.node, place.local_rank,
                    xids.xid43(attempt.pid(rank), "python3"))
            xid43_left -= 1
    report_exits(world, exits)
    return max(e.ts for e in exits)


def hang(
    world: World,
    rng: np.random.Generator,
    t: int,
    spec: HangSpec,
    *,
    no_dump: set[int] | frozenset = frozenset(),
    link_errors_from: tuple[str, ...] = (),
    gloo_barrier: bool = False,
) -> int:
    """The end of an attempt whose progress stopped at t: flight-recorder dumps when the stall is
    noticed, the NCCL watchdog's timeouts and aborts on the ranks stalled in a collective, SIGTERM
    for the rest. With `link_errors_from` (IPs of a dead node), ranks stalled on it see IB retry
    errors well before the watchdog; with `gloo_barrier` the survivors were waiting in a CPU-side
    gloo barrier instead (a checkpoint save) and raise gloo's timeout when the group timeout
    expires."""
    cfg = world.cfg
    attempt = world.current
    placement = attempt.placement
    steps = attempt.steps
    step = steps.step_at(t)
    last_end = steps.last_end_before(t) or attempt.first_step_start
    median = steps.median_step_s() or cfg.step_seconds
    step_start = (
        steps.next_start if step == steps.next_step else steps.starts[steps.steps.index(step)]
    )
    dump_ts = max(last_end + int(cfg.hang_dump_after_steps * median * NS), t + NS) + int(
        rng.uniform(0.5, 2.5) * NS
    )
    live = set(range(placement.world_size)) - set(spec.dead)
    responding = live - set(no_dump)
    step_starts = dict(zip(steps.steps, steps.starts, strict=True))
    step_starts[step] = step_start
    step_ends = dict(zip(steps.steps, steps.ends, strict=True))
    dump_id = f"fr-{attempt.number}-{dump_ts // 1_000_000}"
    for row in dump_rows(placement=placement, groups=attempt.groups, member_of=attempt.member_of,
                         attempt_first_step=attempt.first_step, step=step, step_starts=step_starts,
                         step_ends=step_ends, spec=spec, dump_ts=dump_ts, dump_id=dump_id,
                         entries_per_rank=cfg.dump_entries_per_rank, identity=world.identity,
                         timeout_ms=int(cfg.nccl_timeout_s * 1000), rng=rng, responding=responding):
        world.add("collectives", row)
    stuck_ops = first_incomplete(placement, step, spec, attempt.member_of)
    timeout_ns = int(cfg.nccl_timeout_s * NS)
    aborts: dict[int, int] = {}
    failed: dict[int, proc.ExceptionSpec] = {}
    if gloo_barrier:
        spec_timeout = proc.ExceptionSpec(
            "RuntimeError",
            proc.gloo_timeout(int(cfg.nccl_timeout_s * 1000)).split(": ", 1)[1],
            proc.CKPT_FRAMES[:1] + proc.BARRIER_FRAMES,
        )
        for rank in sorted(live):
            err_ts = t + timeout_ns + int(rng.uniform(0.0, 2.0) * NS)
            world.add(
                "process_events",
                world.proc.exception(
                    err_ts, placement.place(rank), attempt.number, attempt.pid(rank), spec_timeout
                ),
            )
            aborts[rank] = err_ts + int(rng.uniform(0.2, 1.0) * NS)
            failed[rank] = spec_timeout
    elif link_errors_from:
        dead = set(spec.dead)
        for rank, op in stuck_ops.items():
            if op is None:
                continue
            group = attempt.groups[op.group]
            if not dead.intersection(group.ranks):
                continue
            place = placement.place(rank)
            err_ts = t + int(rng.uniform(25.0, 45.0) * NS)
            peer_ip = link_errors_from[int(rng.integers(0, len(link_errors_from)))]
            log_stderr(
                world,
                err_ts,
                rank,
                proc.nccl_remote_error(
                    peer_ip, int(rng.integers(30000, 60000)), place.node.ip, place.local_rank
                ),
            )
            aborts[rank] = err_ts + int(rng.uniform(0.1, 1.0) * NS)
    for rank, op in stuck_ops.items():
        if op is None or rank in aborts:
            continue
        wd_ts = step_start + timeout_ns + int(rng.uniform(0.05, 3.0) * NS)
        seq = op_seq(rank, step, op, attempt.first_step, placement, attempt.member_of)
        log_stderr(
            world,
            wd_ts,
            rank,
            world.proc.watchdog_line(
                rank,
                seq=seq,
                op=op_type(op),
                numel=op.numel,
                timeout_ms=int(cfg.nccl_timeout_s * 1000),
                ran_ms=int((wd_ts - step_start) / 1e6),
            ),
        )
        aborts[rank] = wd_ts + int(rng.uniform(0.1, 1.0) * NS)
    first_abort = min(aborts.values()) if aborts else t + timeout_ns
    exits = []
    for rank in sorted(live):
        if rank in failed:
            exits.append(Exit(rank, aborts[rank], 1, None, failed[rank]))
        elif rank in aborts:
            exits.append(Exit(rank, aborts[rank], -6, "SIGABRT"))
        else:
            exits.append(Exit(rank, first_abort + int(rng.uniform(1.0, 10.0) * NS), -15, "SIGTERM"))
    report_exits(world, exits)
    return max(e.ts for e in exits)
