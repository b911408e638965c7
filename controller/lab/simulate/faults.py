"""The fault catalog and its injectors.

The mix follows the Llama 3 405B interruption table (reference/failures.md, 419 unexpected interruptions): each
row's count is split over the concrete ways that component fails. Stragglers (not interruptions) are drawn from
their own rate. Every injector leaves the telemetry the real fault leaves, in the collectors' row conventions,
and a label (kept outside the store) with what a correct system would conclude.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from faultlens.controller.lab.fault_labels import ExpectedAction, FaultLabel, LabelClass
from faultlens.controller.lab.simulate import process as proc
from faultlens.controller.lab.simulate import xid as xids
from faultlens.controller.lab.simulate.collectives import HangSpec, dump_rows, first_incomplete, op_seq, op_type
from faultlens.controller.lab.simulate.gpu import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_THERMAL,
    CounterChange,
    GpuCondition,
)
from faultlens.controller.lab.simulate.timing import LossEffect, Slowdown
from faultlens.controller.lab.simulate.world import NS, World, to_datetime


class Mode(StrEnum):
    CRASH = "crash"  # processes exit; the job restarts
    HANG = "hang"  # progress stops; the watchdog (or a dead node) ends the attempt
    HEALTH = "health"  # a critical GPU health event, the job keeps running
    STRAGGLER = "straggler"  # something slows the job down for a while


@dataclass
class Target:
    """What a fault hits, chosen when it is prepared (the placement of the running attempt)."""

    t: int
    node: Any
    gpu: int
    rank: int
    onset: int | None = None
    until: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    label: FaultLabel
    down_ts: int | None = None  # when the attempt's last process was gone (None: the job keeps running)
    exclude: str | None = None  # the node a supervisor takes out
    restart_delay_s: float = 0.0
    repeat: Target | None = None  # a deterministic bug that fires again at the same step after a plain restart
    restore_before: int | None = None  # restore a checkpoint older than this (corruption)


Prepare = Callable[[World, np.random.Generator, int], Target]
Strike = Callable[[World, np.random.Generator, "FaultKind", Target], Outcome]


@dataclass(frozen=True)
class FaultKind:
    kind: str
    category: str
    weight: float
    mode: Mode
    label_class: LabelClass
    cause: str
    action: ExpectedAction
    strike: Strike
    prepare: Prepare | None = None


# --- shared pieces -------------------------------------------------------------------------------------------

def pick_target(world: World, rng: np.random.Generator, t: int) -> Target:
    attempt = world.current
    rank = int(rng.integers(0, attempt.placement.world_size))
    place = attempt.placement.place(rank)
    return Target(t, place.node, place.local_rank, rank)


def make_label(world: World, kind: FaultKind, target: Target, *, nodes: tuple[str, ...] | None = None,
               ranks: tuple[int, ...] | None = None, gpus: tuple[str, ...] | None = None, end: int | None = None,
               step: int | None = None, notes: str = "", repeat_of: str | None = None,
               extra: dict[str, Any] | None = None) -> FaultLabel:
    attempt = world.current
    gpu = target.node.gpus[target.gpu]
    extra = dict(extra or {})
    if kind.mode in (Mode.CRASH, Mode.HANG):
        last = attempt.steps.last_end_before(target.t)
        if last is not None:  # progress stopped here: the reference point for hang detection latency
            extra["last_step_end_ts"] = to_datetime(last).isoformat()
    return FaultLabel(
        fault_id=world.next_fault_id(), kind=kind.kind, category=kind.category, label_class=kind.label_class,
        cause=kind.cause, expected_action=kind.action, injected_ts=to_datetime(target.t),
        effect_end_ts=to_datetime(end if end is not None else target.t), job_id=world.cfg.job,
        attempt=attempt.number, step=step,
        culprit_nodes=(target.node.name,) if nodes is None else nodes,
        culprit_ranks=(target.rank,) if ranks is None else ranks,
        culprit_gpus=(gpu.uuid,) if gpus is None else gpus,
        repeat_of=repeat_of, onset_ts=to_datetime(target.onset) if target.onset is not None else None,
        notes=notes, extra=extra,
    )


def add_xid(world: World, rng: np.random.Generator, t: int, node, gpu_index: int, line: xids.XidLine,
            nvml: bool = True) -> None:
    gpu = node.gpus[gpu_index]
    attempt = world.current.number
    for row in world.xid.kmsg_xid(t, node, gpu, attempt, line):
        world.add("gpu_events", row)
    if nvml:
        world.add("gpu_events", world.xid.nvml_xid(t + int(rng.integers(1_000_000, 400_000_000)), node, gpu, attempt,
                                                   line.code))


def recovery_action(world: World, rng: np.random.Generator, t: int, node, gpu_index: int, action: int) -> None:
    add_xid(world, rng, t, node, gpu_index, xids.xid154(0, action), nvml=False)
    world.effects.changes.append(CounterChange(node.name, gpu_index, t, "recovery_action", value=action))


def communicating_peers(world: World, ranks: set[int]) -> set[int]:
    """Ranks that share a data-parallel or pipeline group with any of `ranks` (they talk to them directly)."""
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
    """Each node's torchrun failure report: its ranks' exits, the earliest one named the Root Cause."""
    attempt = world.current
    placement = attempt.placement
    by_node: dict[str, list[Exit]] = {}
    for item in exits:
        by_node.setdefault(placement.place(item.rank).node.name, []).append(item)
    for items in by_node.values():
        root = min(items, key=lambda e: (proc.whole_seconds(e.ts), e.rank))
        for item in items:
            place = placement.place(item.rank)
            for row in world.proc.report(item.ts, place, attempt.number, attempt.pid(item.rank),
                                         exit_code=item.exit_code, signal=item.signal, spec=item.spec,
                                         root_cause=item is root):
                world.add("process_events", row)


def log_stderr(world: World, ts: int, rank: int, text: str) -> None:
    attempt = world.current
    for row in world.proc.stderr(ts, attempt.placement.place(rank), attempt.number, text):
        world.add("process_events", row)


def crash(world: World, rng: np.random.Generator, t: int, primaries: list[tuple[int, proc.ExceptionSpec, int]],
          *, echo: str | None = None, culprit_ips: tuple[str, ...] = ()) -> int:
    """The end of an attempt after primary exceptions on `primaries` (rank, spec, ts). Survivors on the primaries'
    nodes are stopped by their agent; the others echo (NCCL remote error or gloo "Connection closed by peer")
    and get SIGTERM when the rendezvous restarts. Returns when the last process was gone."""
    attempt = world.current
    placement = attempt.placement
    primary_ranks = {r for r, _, _ in primaries}
    exits: list[Exit] = []
    for rank, spec, ts in primaries:
        place = placement.place(rank)
        world.add("process_events", world.proc.exception(ts, place, attempt.number, attempt.pid(rank), spec))
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
        # torchrun (monitor interval 0.1 s): the failed node's agent stops its workers at once and re-enters the
        # rendezvous; the other agents see a node waiting on their next tick and stop theirs
        if place.node.name in primary_nodes:
            ts = first_exit + int(rng.uniform(0.05, 1.0) * NS)
        else:
            if rank in peers and rng.random() < 0.7:
                err_ts = first_exit + int(rng.uniform(0.1, 5.0) * NS)
                peer_ip = ips[int(rng.integers(0, len(ips)))]
                if echo == "gloo":
                    text = proc.gloo_closed_by_peer(peer_ip, int(rng.integers(20000, 60000)))
                else:
                    text = proc.nccl_remote_error(peer_ip, int(rng.integers(30000, 60000)), place.node.ip,
                                                  place.local_rank)
                log_stderr(world, err_ts, rank, text)
            ts = first_exit + int(rng.uniform(1.0, 6.0) * NS)
        exits.append(Exit(rank, ts, -15, "SIGTERM"))
        if xid43_left and place.node.name not in primary_nodes and rng.random() < 0.05:
            add_xid(world, rng, ts + int(rng.uniform(0.1, 1.0) * NS), place.node, place.local_rank,
                    xids.xid43(attempt.pid(rank), "python3"))
            xid43_left -= 1
    report_exits(world, exits)
    return max(e.ts for e in exits)


def hang(world: World, rng: np.random.Generator, t: int, spec: HangSpec, *, no_dump: set[int] | frozenset = frozenset(),
         link_errors_from: tuple[str, ...] = (), gloo_barrier: bool = False) -> int:
    """The end of an attempt whose progress stopped at t: flight-recorder dumps when the stall is noticed, the
    NCCL watchdog's timeouts and aborts on the ranks stalled in a collective, SIGTERM for the rest. With
    `link_errors_from` (IPs of a dead node), ranks stalled on it see IB retry errors well before the watchdog;
    with `gloo_barrier` the survivors were waiting in a CPU-side gloo barrier instead (a checkpoint save) and raise
    gloo's timeout when the group timeout expires."""
    cfg = world.cfg
    attempt = world.current
    placement = attempt.placement
    steps = attempt.steps
    step = steps.step_at(t)
    last_end = steps.last_end_before(t) or attempt.first_step_start
    median = steps.median_step_s() or cfg.step_seconds
    step_start = steps.next_start if step == steps.next_step else steps.starts[steps.steps.index(step)]
    dump_ts = max(last_end + int(cfg.hang_dump_after_steps * median * NS), t + NS) + int(rng.uniform(0.5, 2.5) * NS)
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
        spec_timeout = proc.ExceptionSpec("RuntimeError", proc.gloo_timeout(int(cfg.nccl_timeout_s * 1000)).split(
            ": ", 1)[1], proc.CKPT_FRAMES[:1] + proc.BARRIER_FRAMES)
        for rank in sorted(live):
            err_ts = t + timeout_ns + int(rng.uniform(0.0, 2.0) * NS)
            world.add("process_events", world.proc.exception(err_ts, placement.place(rank), attempt.number,
                                                             attempt.pid(rank), spec_timeout))
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
            log_stderr(world, err_ts, rank, proc.nccl_remote_error(peer_ip, int(rng.integers(30000, 60000)),
                                                                   place.node.ip, place.local_rank))
            aborts[rank] = err_ts + int(rng.uniform(0.1, 1.0) * NS)
    for rank, op in stuck_ops.items():
        if op is None or rank in aborts:
            continue
        wd_ts = step_start + timeout_ns + int(rng.uniform(0.05, 3.0) * NS)
        seq = op_seq(rank, step, op, attempt.first_step, placement, attempt.member_of)
        log_stderr(world, wd_ts, rank, world.proc.watchdog_line(rank, seq=seq, op=op_type(op), numel=op.numel,
                                                                timeout_ms=int(cfg.nccl_timeout_s * 1000),
                                                                ran_ms=int((wd_ts - step_start) / 1e6)))
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


def hw_restart_delay(rng: np.random.Generator) -> float:
    return float(rng.uniform(120.0, 420.0))


# --- GPU hardware ---------------------------------------------------------------------------------------------

def _gpu_crash(world: World, rng: np.random.Generator, kind: FaultKind, target: Target, lines: list[xids.XidLine],
               error: str, *, lost: bool = False, kmsg_fallen: bool = False, changes: tuple = (),
               recovery: int | None = None, notes: str = "") -> Outcome:
    node, g, t = target.node, target.gpu, target.t
    for i, line in enumerate(lines):
        add_xid(world, rng, t + i * int(rng.uniform(0.001, 0.05) * NS), node, g, line)
    if kmsg_fallen:
        for row in world.xid.kmsg_fallen_off_bus(t, node, node.gpus[g], world.current.number):
            world.add("gpu_events", row)
    if lost:
        world.effects.gpu_stop[(node.name, g)] = t
        world.add("gpu_events", world.xid.sample_event(
            t + int(rng.uniform(0.1, world.cfg.sample_seconds) * NS), node, node.gpus[g], world.current.number,
            "gpu_lost", None, "GPU is lost: fallen off the bus or otherwise inaccessible; reboot the node to recover "
            "this GPU"))
    for name, delta, value in changes:
        world.effects.changes.append(CounterChange(node.name, g, t, name, delta=delta, value=value))
    if recovery is not None:
        recovery_action(world, rng, t + int(rng.uniform(0.01, 0.3) * NS), node, g, recovery)
    exc_ts = t + int(rng.uniform(0.1, 2.0) * NS)
    down = crash(world, rng, t, [(target.rank, proc.cuda_error(error), exc_ts)])
    step = world.current.steps.step_at(t)
    return Outcome(make_label(world, kind, target, end=down, step=step, notes=notes), down_ts=down,
                   exclude=node.name, restart_delay_s=hw_restart_delay(rng))


def strike_xid79(world, rng, kind, target):
    return _gpu_crash(world, rng, kind, target, [xids.xid79()], "unspecified launch failure", lost=True)


def strike_fallen_no_xid(world, rng, kind, target):
    return _gpu_crash(world, rng, kind, target, [], "unknown error", lost=True, kmsg_fallen=True)


def strike_xid109(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    return _gpu_crash(world, rng, kind, target, [xids.xid109(pid)], "the launch timed out and was terminated",
                      recovery=1 if rng.random() < 0.5 else None)


def strike_xid62(world, rng, kind, target):
    return _gpu_crash(world, rng, kind, target, [xids.xid62()], "unspecified launch failure", recovery=1)


def strike_xid94(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    changes = (("ecc_dbe_volatile", 1, None), ("ecc_dbe_aggregate", 1, None), ("ecc_sram_uncorrected", 1, None))
    return _gpu_crash(world, rng, kind, target, [xids.xid94(pid)], "uncorrectable ECC error encountered",
                      changes=changes, recovery=1 if rng.random() < 0.6 else None)


def strike_hbm_dbe(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    row = int(rng.integers(1 << 20, 1 << 34))
    lines = [xids.xid48(int(rng.integers(1 << 30, 1 << 36)), int(rng.integers(0, 8)), int(rng.integers(0, 2))),
             xids.xid63(pid, row)]
    changes = (("ecc_dbe_volatile", 1, None), ("ecc_dbe_aggregate", 1, None), ("ecc_dram_uncorrected", 1, None),
               ("remapped_rows_uncorrectable", 1, None), ("remap_pending", 0, True))
    return _gpu_crash(world, rng, kind, target, lines, "uncorrectable ECC error encountered", changes=changes,
                      recovery=1 if rng.random() < 0.5 else None)


def strike_sram(world, rng, kind, target):
    changes = (("ecc_dbe_volatile", 1, None), ("ecc_dbe_aggregate", 1, None), ("ecc_sram_uncorrected", 1, None))
    return _gpu_crash(world, rng, kind, target, [xids.xid95_sram()], "uncorrectable ECC error encountered",
                      changes=changes, recovery=1)


def strike_gsp_crash(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    node, g, t = target.node, target.gpu, target.t
    repeats = int(rng.integers(1, 4))
    for i in range(repeats):
        add_xid(world, rng, t + i * int(6.2 * NS), node, g, xids.xid119(pid, g))
    if rng.random() < 0.4:
        add_xid(world, rng, t + repeats * int(6.2 * NS), node, g, xids.xid120(int(rng.integers(1 << 20, 1 << 28))))
    exc_ts = t + repeats * int(6.2 * NS) + int(rng.uniform(0.1, 1.0) * NS)
    down = crash(world, rng, t, [(target.rank, proc.cuda_error("unknown error"), exc_ts)])
    return Outcome(make_label(world, kind, target, end=down, step=world.current.steps.step_at(t)), down_ts=down,
                   exclude=node.name, restart_delay_s=hw_restart_delay(rng))


def strike_gsp_hang(world, rng, kind, target):
    """The rank's CUDA call never returns (GSP RPC timeouts): it holds the GIL, so its dump trigger cannot run."""
    pid = world.current.pid(target.rank)
    node, g, t = target.node, target.gpu, target.t
    for i in range(int(rng.integers(2, 5))):
        add_xid(world, rng, t + i * int(6.2 * NS), node, g, xids.xid119(pid, g))
    spec = HangSpec(stuck={target.rank: int(rng.integers(0, 3))}, dead=frozenset(), broken_groups=frozenset())
    down = hang(world, rng, t, spec, no_dump={target.rank})
    return Outcome(make_label(world, kind, target, end=down, step=world.current.steps.step_at(t)), down_ts=down,
                   exclude=node.name, restart_delay_s=hw_restart_delay(rng))


def strike_nvlink(world, rng, kind, target):
    """A failed NVLink: the node's tensor-parallel collectives start and never finish; Xid 74 and link counters."""
    attempt = world.current
    node, g, t = target.node, target.gpu, target.t
    add_xid(world, rng, t, node, g, xids.xid74(attempt.pid(target.rank), int(rng.integers(0, 18))))
    for name, delta in (("nvlink_replay_errors", int(rng.integers(200, 5000))), ("nvlink_recovery_errors", 1),
                        ("nvlink_crc_errors", int(rng.integers(50, 2000)))):
        world.effects.changes.append(CounterChange(node.name, g, t, name, delta=delta))
    tp_group = attempt.member_of[target.rank]["tp"]
    spec = HangSpec(stuck={}, dead=frozenset(), broken_groups=frozenset({tp_group}))
    down = hang(world, rng, t, spec)
    ranks = tuple(attempt.placement.ranks_of_node(node.name))
    return Outcome(make_label(world, kind, target, ranks=ranks, end=down, step=attempt.steps.step_at(t)),
                   down_ts=down, exclude=node.name, restart_delay_s=hw_restart_delay(rng))


def prepare_thermal_runaway(world: World, rng: np.random.Generator, t: int) -> Target:
    """A failed thermal interface: the GPU heats up and throttles for a while before it drops off the bus."""
    target = pick_target(world, rng, t)
    onset = max(world.current.first_step_start, t - int(rng.uniform(600, 1800) * NS))
    target.onset = onset
    world.effects.conditions.append(GpuCondition(target.node.name, target.gpu, onset, t, temp_add=24.0,
                                                 sm_clock_mult=0.72, power_mult=0.8,
                                                 reasons=SW_THERMAL | HW_THERMAL))
    world.slowdowns.append(Slowdown(onset, t, float(rng.uniform(1.2, 1.35)), node=target.node.name, gpu=target.gpu))
    return target


def strike_thermal_runaway(world, rng, kind, target):
    return _gpu_crash(world, rng, kind, target, [xids.xid79()], "unspecified launch failure", lost=True,
                      notes="throttled before it fell off the bus")


NAN_CHECK_FRAME = (f"{proc.PREFIX}/megatron/core/distributed/param_and_grad_buffer.py", 161, "check_grads",
                   "rerun_state_machine.validate_result(")


def prepare_sdc(world: World, rng: np.random.Generator, t: int) -> Target:
    """Silent data corruption: a loss spike on the replica first, then Megatron's NaN check fires."""
    target = pick_target(world, rng, t)
    dp = int(world.current.placement.dp_of_rank()[target.rank])
    onset = max(world.current.first_step_start, t - int(rng.uniform(2, 6) * world.cfg.step_seconds * NS))
    target.onset = onset
    world.losses.append(LossEffect(onset, t, dp, float(rng.uniform(1.4, 3.0))))
    target.extra["dp"] = dp
    return target


def strike_sdc(world, rng, kind, target):
    attempt = world.current
    placement = attempt.placement
    t = target.t
    step = attempt.steps.step_at(t)
    dp = target.extra["dp"]
    # NaN reaches every rank of the culprit's data-parallel replica (tensor- and pipeline-parallel peers)
    replica = [r for r in range(placement.world_size) if int(placement.dp_of_rank()[r]) == dp]
    primaries = []
    for rank in replica:
        place = placement.place(rank)
        message = (f"Rank {rank}, node {place.node.name}, device {place.local_rank}, iteration {step}: Unexpected "
                   "result nan (message='found NaN in local grad norm for bucket #0 in backward pass before "
                   "data-parallel communication collective')")
        spec = proc.ExceptionSpec("RuntimeError", message, (*proc.TRAIN_FRAMES, NAN_CHECK_FRAME))
        primaries.append((rank, spec, t + int(rng.uniform(0.0, 0.4) * NS)))
    down = crash(world, rng, t, primaries)
    return Outcome(make_label(world, kind, target, end=down, step=step, notes="NaN in the replica's gradients"),
                   down_ts=down, exclude=target.node.name, restart_delay_s=hw_restart_delay(rng),
                   restore_before=target.onset)


# --- network and host -----------------------------------------------------------------------------------------

def _link_crash(world, rng, kind, target, event: str) -> Outcome:
    """One rail's HCA or cable: NCCL on that rank logs the async event and fails; its peers see remote errors."""
    attempt = world.current
    place = attempt.placement.place(target.rank)
    t = target.t
    # NCCL's WARN line about the HCA event goes to stderr (the stderr scanner keeps only lines it recognises)
    log_stderr(world, t + int(rng.uniform(0.0, 0.5) * NS), target.rank,
               proc.nccl_async_event(place.local_rank, event))
    peer = sorted(communicating_peers(world, {target.rank}))
    peer_ip = attempt.placement.place(peer[0]).node.ip if peer else place.node.ip
    spec = proc.nccl_error("unhandled system error", "ncclSystemError",
                           "System call (e.g. socket, malloc) or external library call failed or device error.",
                           f"NET/IB : Got completion from peer {peer_ip}<{int(rng.integers(30000, 60000))}> with "
                           "status=5 opcode=0 len=0 vendor err 249 (Send)")
    exc_ts = t + int(rng.uniform(0.5, 3.0) * NS)
    down = crash(world, rng, t, [(target.rank, spec, exc_ts)])
    return Outcome(make_label(world, kind, target, end=down, step=attempt.steps.step_at(t)), down_ts=down,
                   exclude=target.node.name, restart_delay_s=hw_restart_delay(rng))


def strike_port_error(world, rng, kind, target):
    return _link_crash(world, rng, kind, target, "port error")


def strike_nic_fatal(world, rng, kind, target):
    return _link_crash(world, rng, kind, target, "local catastrophic error")


def strike_stuck_rank(world, rng, kind, target):
    """A rank stops in host code before the step's first collective (a deadlocked loader, a stuck syscall); it
    still answers the dump request. No log line anywhere says which rank it was."""
    spec = HangSpec(stuck={target.rank: 0}, dead=frozenset(), broken_groups=frozenset())
    down = hang(world, rng, target.t, spec)
    return Outcome(make_label(world, kind, target, end=down, step=world.current.steps.step_at(target.t)),
                   down_ts=down, exclude=target.node.name, restart_delay_s=hw_restart_delay(rng))


def strike_host_down(world, rng, kind, target):
    """The node dies (power, kernel panic, memory, board): its agent, ranks and telemetry stop at once."""
    attempt = world.current
    node = target.node
    dead = frozenset(attempt.placement.ranks_of_node(node.name))
    world.effects.leave(node.name, target.t)
    spec = HangSpec(stuck={}, dead=dead, broken_groups=frozenset())
    down = hang(world, rng, target.t, spec, link_errors_from=(node.ip,), gloo_barrier=rng.random() < 0.3)
    return Outcome(make_label(world, kind, target, ranks=tuple(sorted(dead)), gpus=tuple(g.uuid for g in node.gpus),
                              end=down, step=attempt.steps.step_at(target.t)),
                   down_ts=down, exclude=node.name, restart_delay_s=float(rng.uniform(300, 900)))


# --- software -------------------------------------------------------------------------------------------------

SOFTWARE_BUGS: tuple[proc.ExceptionSpec, ...] = (
    proc.ExceptionSpec("IndexError", "index 8192 is out of bounds for dimension 0 with size 8192",
                       proc.DATA_FRAMES),
    proc.ExceptionSpec("RuntimeError", "The size of tensor a (4096) must match the size of tensor b (4097) at "
                       "non-singleton dimension 1", proc.TRAIN_FRAMES + proc.FORWARD_FRAMES),
    proc.ExceptionSpec("AttributeError", "'NoneType' object has no attribute 'main_grad'",
                       proc.TRAIN_FRAMES + proc.COMM_FRAMES[:1]),
    proc.ExceptionSpec("KeyError", "'attention_mask'", proc.DATA_FRAMES[:3]),
    proc.ExceptionSpec("ValueError", "Expected input batch_size (2) to match target batch_size (1).",
                       proc.TRAIN_FRAMES + proc.FORWARD_FRAMES[:2]),
    proc.ExceptionSpec("TypeError", "unsupported operand type(s) for *: 'NoneType' and 'float'",
                       proc.TRAIN_FRAMES[:4]),
)
DEPENDENCY_BUGS: tuple[proc.ExceptionSpec, ...] = (
    proc.ExceptionSpec("OSError", "[Errno 5] Input/output error: '/checkpoints/pretrain/iter_0004000/__3_1.distcp'",
                       proc.CKPT_FRAMES),
    proc.ExceptionSpec("OSError", "[Errno 122] Disk quota exceeded", proc.CKPT_FRAMES),
)
STAGE_BUG = proc.ExceptionSpec(
    "RuntimeError", "Expected all tensors to be on the same device, but found at least two devices, cuda:7 and cpu!",
    (*proc.TRAIN_FRAMES, (f"{proc.PREFIX}/megatron/core/models/gpt/gpt_model.py", 301, "compute_language_model_loss",
                          "loss = tensor_parallel.vocab_parallel_cross_entropy(logits, labels)")))


def _software(world: World, rng: np.random.Generator, kind: FaultKind, target: Target, ranks: list[int],
              spec: proc.ExceptionSpec, *, notes: str = "", app_xid: int | None = None,
              label_ranks: tuple[int, ...] = ()) -> Outcome:
    attempt = world.current
    t = target.t
    step = attempt.steps.step_at(t)
    primaries = [(r, spec, t + int(rng.uniform(0.0, 0.5) * NS)) for r in ranks]
    if app_xid is not None:
        for r, _, ts in primaries:
            place = attempt.placement.place(r)
            pid = attempt.pid(r)
            line = (xids.xid13(pid, "python3") if app_xid == 13 else
                    xids.xid31(pid, "python3", int(rng.integers(1 << 40, 1 << 46))))
            add_xid(world, rng, ts - int(rng.uniform(0.01, 0.2) * NS), place.node, place.local_rank, line)
    down = crash(world, rng, t, primaries)
    repeat_of = target.extra.get("repeat_of")
    label = make_label(world, kind, target, nodes=(), ranks=label_ranks, gpus=(), end=down, step=step, notes=notes,
                       repeat_of=repeat_of, extra={"fingerprint": spec.fingerprint})
    repeat = None
    if repeat_of is None and rng.random() < 0.4:
        # a plain supervisor restarts once; the bug is deterministic and fires again at the same step
        repeat = Target(0, target.node, target.gpu, target.rank,
                        extra={**target.extra, "repeat_of": label.fault_id, "step": step, "spec": spec,
                               "ranks": ranks, "app_xid": app_xid, "label_ranks": label_ranks, "notes": notes})
        delay = float(rng.uniform(60, 180))
    else:
        delay = float(rng.uniform(1800, 5400))  # a human reads the escalation and ships a fix
    return Outcome(label, down_ts=down, exclude=None, restart_delay_s=delay, repeat=repeat)


def _replay(world, rng, kind, target) -> Outcome | None:
    extra = target.extra
    if "spec" not in extra:
        return None
    return _software(world, rng, kind, target, extra["ranks"], extra["spec"], notes=extra["notes"],
                     app_xid=extra["app_xid"], label_ranks=extra["label_ranks"])


def strike_software_all(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    spec = SOFTWARE_BUGS[int(rng.integers(0, len(SOFTWARE_BUGS)))]
    return _software(world, rng, kind, target, list(range(world.current.placement.world_size)), spec,
                     notes="same exception on every rank")


def strike_software_app_xid(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    spec = proc.cuda_error("an illegal memory access was encountered")
    return _software(world, rng, kind, target, list(range(world.current.placement.world_size)), spec,
                     app_xid=13 if rng.random() < 0.5 else 31, notes="a kernel bug: application Xid on every GPU")


def strike_software_stage(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    placement = world.current.placement
    last = placement.pp_size - 1
    ranks = [r for r in range(placement.world_size) if int(placement.stage_of_rank()[r]) == last]
    return _software(world, rng, kind, target, ranks, STAGE_BUG, notes="bug in the loss: last pipeline stage only")


def strike_dependency(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    spec = DEPENDENCY_BUGS[int(rng.integers(0, len(DEPENDENCY_BUGS)))]
    return _software(world, rng, kind, target, list(range(world.current.placement.world_size)), spec,
                     notes="checkpoint storage failure")


def strike_oom(world, rng, kind, target):
    """A data-dependent CUDA OOM on one rank (a long-sequence batch): software, no node to blame."""
    attempt = world.current
    place = attempt.placement.place(target.rank)
    free = float(rng.uniform(0.3, 2.5))
    spec = proc.ExceptionSpec(
        "torch.OutOfMemoryError",
        f"CUDA out of memory. Tried to allocate {rng.uniform(2, 8):.2f} GiB. GPU {place.local_rank} has a total "
        f"capacity of 79.11 GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this process has "
        f"{79.11 - free:.2f} GiB memory in use. Of the allocated memory {rng.uniform(68, 74):.2f} GiB is allocated by "
        "PyTorch, and 3.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
        "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        proc.TRAIN_FRAMES + proc.FORWARD_FRAMES)
    out = _software(world, rng, kind, target, [target.rank], spec, notes="out of memory on one rank",
                    label_ranks=(target.rank,))
    out.repeat = None
    return out


# --- health (no failure yet) ------------------------------------------------------------------------------------

def strike_remap_failure(world, rng, kind, target):
    node, g, t = target.node, target.gpu, target.t
    add_xid(world, rng, t, node, g, xids.xid64(int(rng.integers(1 << 20, 1 << 34))))
    for name, delta, value in (("ecc_sbe_volatile", 1, None), ("ecc_sbe_aggregate", 1, None),
                               ("remapped_rows_uncorrectable", 1, None), ("remap_failure", 0, True)):
        world.effects.changes.append(CounterChange(node.name, g, t, name, delta=delta, value=value))
    recovery_action(world, rng, t + int(0.2 * NS), node, g, 4)
    return Outcome(make_label(world, kind, target, end=t + int(1800 * NS), step=None,
                              notes="row-remap failure with no crash: drain"))


# --- stragglers -------------------------------------------------------------------------------------------------

def _duration(rng: np.random.Generator, world: World, t: int) -> int:
    return t + int(rng.uniform(20, 90) * 60 * NS)


def strike_slow_gpu(world, rng, kind, target):
    t = target.t
    until = min(_duration(rng, world, t), target.until or t + 1)
    node, g = target.node.name, target.gpu
    factor = float(rng.uniform(1.15, 1.5))
    world.slowdowns.append(Slowdown(t, until, factor, node=node, gpu=g))
    variant = ("hw_slowdown", "power_brake", "nvlink_replays", "no_reason")[int(rng.integers(0, 4))]
    if variant == "hw_slowdown":
        world.effects.conditions.append(GpuCondition(node, g, t, until, sm_clock_mult=0.78, reasons=HW_SLOWDOWN))
    elif variant == "power_brake":
        world.effects.conditions.append(GpuCondition(node, g, t, until, sm_clock_mult=0.74, power_mult=0.62,
                                                     reasons=HW_POWER_BRAKE))
    elif variant == "nvlink_replays":
        for k, at in enumerate(range(t, until, int(180 * NS))):
            world.effects.changes.append(CounterChange(node, g, at, "nvlink_replay_errors",
                                                       delta=int(rng.integers(20, 400)) + k))
    return Outcome(make_label(world, kind, target, end=until, notes=variant,
                              extra={"factor": round(factor, 3), "variant": variant}))


def strike_thermal_node(world, rng, kind, target):
    t = target.t
    until = min(_duration(rng, world, t), target.until or t + 1)
    node = target.node
    factor = float(rng.uniform(1.1, 1.3))
    world.slowdowns.append(Slowdown(t, until, factor, node=node.name))
    for g in range(len(node.gpus)):
        world.effects.conditions.append(GpuCondition(node.name, g, t, until, temp_add=float(rng.uniform(18, 25)),
                                                     sm_clock_mult=float(rng.uniform(0.8, 0.88)),
                                                     reasons=SW_THERMAL | (HW_THERMAL if rng.random() < 0.4 else 0)))
    ranks = tuple(world.current.placement.ranks_of_node(node.name))
    return Outcome(make_label(world, kind, target, ranks=ranks, gpus=tuple(g.uuid for g in node.gpus), end=until,
                              notes="cooling failure on the whole node", extra={"factor": round(factor, 3)}))


def strike_stage_imbalance(world, rng, kind, target):
    placement = world.current.placement
    t = target.t
    until = min(t + int(rng.uniform(60, 240) * 60 * NS), target.until or t + 1)
    stage = int(rng.integers(0, placement.pp_size))
    factor = float(rng.uniform(1.2, 1.4))
    world.slowdowns.append(Slowdown(t, until, factor, stage=stage))
    return Outcome(make_label(world, kind, target, nodes=(), ranks=(), gpus=(), end=until,
                              notes=f"pipeline stage {stage} has more layers than the others",
                              extra={"stage": stage, "factor": round(factor, 3)}))


# --- the catalog ----------------------------------------------------------------------------------------------

_F, _E, _D = ExpectedAction.FAILOVER, ExpectedAction.ESCALATE, ExpectedAction.DRAIN
_C, _H, _HE, _S = LabelClass.CRASH, LabelClass.COLLECTIVE_HANG, LabelClass.HEALTH, LabelClass.STRAGGLER

# (Llama 3 row, count) split over kinds; the weights sum to the 419 unexpected interruptions.
FAULTS: tuple[FaultKind, ...] = (
    FaultKind("gpu_xid79", "Faulty GPU", 54, Mode.CRASH, _C, "gpu_hardware", _F, strike_xid79),
    FaultKind("gpu_fallen_off_bus", "Faulty GPU", 16, Mode.CRASH, _C, "gpu_hardware", _F, strike_fallen_no_xid),
    FaultKind("gpu_xid109", "Faulty GPU", 20, Mode.CRASH, _C, "gpu_hardware", _F, strike_xid109),
    FaultKind("gpu_xid62", "Faulty GPU", 14, Mode.CRASH, _C, "gpu_hardware", _F, strike_xid62),
    FaultKind("gpu_xid94", "Faulty GPU", 20, Mode.CRASH, _C, "gpu_hardware", _F, strike_xid94),
    FaultKind("nvlink_xid74", "Faulty GPU", 24, Mode.HANG, _H, "nvlink", _F, strike_nvlink),
    FaultKind("hbm_dbe", "GPU HBM3 Memory", 58, Mode.CRASH, _C, "hbm", _F, strike_hbm_dbe),
    FaultKind("hbm_remap_failure", "GPU HBM3 Memory", 14, Mode.HEALTH, _HE, "hbm", _D, strike_remap_failure),
    FaultKind("sram_xid95", "GPU SRAM Memory", 19, Mode.CRASH, _C, "gpu_hardware", _F, strike_sram),
    FaultKind("gsp_xid119_crash", "GPU System Processor", 9, Mode.CRASH, _C, "gpu_hardware", _F, strike_gsp_crash),
    FaultKind("gsp_xid119_hang", "GPU System Processor", 8, Mode.HANG, _H, "gpu_hardware", _F, strike_gsp_hang),
    FaultKind("sdc_nan", "Silent Data Corruption", 6, Mode.CRASH, _C, "data_corruption", _F, strike_sdc,
              prepare_sdc),
    FaultKind("thermal_runaway", "GPU Thermal Interface + Sensor", 6, Mode.CRASH, _C, "thermal", _F,
              strike_thermal_runaway, prepare_thermal_runaway),
    FaultKind("software_bug", "Software Bug", 28, Mode.CRASH, _C, "software", _E, strike_software_all),
    FaultKind("software_app_xid", "Software Bug", 8, Mode.CRASH, _C, "software", _E, strike_software_app_xid),
    FaultKind("software_stage_bug", "Software Bug", 10, Mode.CRASH, _C, "software", _E, strike_software_stage),
    FaultKind("software_oom", "Software Bug", 8, Mode.CRASH, _C, "oom", _E, strike_oom),
    FaultKind("dependency_storage", "Dependency", 2, Mode.CRASH, _C, "software", _E, strike_dependency),
    FaultKind("network_port_error", "Network Switch/Cable", 35, Mode.CRASH, _C, "network", _F, strike_port_error),
    FaultKind("nic_fatal", "NIC", 7, Mode.CRASH, _C, "network", _F, strike_nic_fatal),
    FaultKind("nccl_stuck_rank", "NCCL Watchdog Timeouts", 7, Mode.HANG, _H, "unknown", _F, strike_stuck_rank),
    FaultKind("host_down", "Host (maintenance, SSD, PSU, chassis, board, CPU, memory)", 46, Mode.HANG, _H, "host",
              _F, strike_host_down),
)

STRAGGLERS: tuple[FaultKind, ...] = (
    FaultKind("straggler_slow_gpu", "Straggler", 45, Mode.STRAGGLER, _S, "gpu_hardware", _F, strike_slow_gpu),
    FaultKind("straggler_thermal_node", "Straggler", 30, Mode.STRAGGLER, _S, "thermal", _F, strike_thermal_node),
    FaultKind("straggler_stage_imbalance", "Straggler", 25, Mode.STRAGGLER, _S, "workload_imbalance", _E,
              strike_stage_imbalance),
)

BY_KIND: dict[str, FaultKind] = {k.kind: k for k in FAULTS + STRAGGLERS}


def draw(kinds: tuple[FaultKind, ...], rng: np.random.Generator) -> FaultKind:
    weights = np.array([k.weight for k in kinds], dtype=float)
    return kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
