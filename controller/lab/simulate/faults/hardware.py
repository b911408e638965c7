"""The GPU hardware injectors: Xid crashes, HBM and SRAM errors, GSP crashes and hangs, NVLink,
thermal runaway, silent data corruption, and the row-remap failure that only needs a drain (health,
no failure yet)."""

from __future__ import annotations

import numpy as np

from faultlens.controller.lab.simulate import process as proc
from faultlens.controller.lab.simulate import xid as xids
from faultlens.controller.lab.simulate.collectives import HangSpec
from faultlens.controller.lab.simulate.faults.endings import crash, hang
from faultlens.controller.lab.simulate.faults.kinds import FaultKind, Outcome, Target
from faultlens.controller.lab.simulate.faults.pieces import (
    add_xid,
    hw_restart_delay,
    make_label,
    pick_target,
    recovery_action,
)
from faultlens.controller.lab.simulate.gpu import (
    HW_THERMAL,
    SW_THERMAL,
    CounterChange,
    GpuCondition,
)
from faultlens.controller.lab.simulate.timing import LossEffect, Slowdown
from faultlens.controller.lab.simulate.world import NS, World


def _gpu_crash(
    world: World,
    rng: np.random.Generator,
    kind: FaultKind,
    target: Target,
    lines: list[xids.XidLine],
    error: str,
    *,
    lost: bool = False,
    kmsg_fallen: bool = False,
    changes: tuple = (),
    recovery: int | None = None,
    notes: str = "",
) -> Outcome:
    node, g, t = target.node, target.gpu, target.t
    for i, line in enumerate(lines):
        add_xid(world, rng, t + i * int(rng.uniform(0.001, 0.05) * NS), node, g, line)
    if kmsg_fallen:
        for row in world.xid.kmsg_fallen_off_bus(t, node, node.gpus[g], world.current.number):
            world.add("gpu_events", row)
    if lost:
        world.effects.gpu_stop[(node.name, g)] = t
        world.add(
            "gpu_events",
            world.xid.sample_event(
                t + int(rng.uniform(0.1, world.cfg.sample_seconds) * NS),
                node,
                node.gpus[g],
                world.current.number,
                "gpu_lost",
                None,
                "GPU is lost: fallen off the bus or otherwise inaccessible; reboot "
                "the node to recover "
                "this GPU",
            ),
        )
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
    return _gpu_crash(
        world, rng, kind, target, [xids.xid79()], "unspecified launch failure", lost=True
    )


def strike_fallen_no_xid(world, rng, kind, target):
    return _gpu_crash(world, rng, kind, target, [], "unknown error", lost=True, kmsg_fallen=True)


def strike_xid109(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    return _gpu_crash(world, rng, kind, target, [xids.xid109(pid)], "the launch timed out and was "
                                                                    "terminated",
                      recovery=1 if rng.random() < 0.5 else None)


def strike_xid62(world, rng, kind, target):
    return _gpu_crash(
        world, rng, kind, target, [xids.xid62()], "unspecified launch failure", recovery=1
    )


def strike_xid94(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    changes = (
        ("ecc_dbe_volatile", 1, None),
        ("ecc_dbe_aggregate", 1, None),
        ("ecc_sram_uncorrected", 1, None),
    )
    return _gpu_crash(world, rng, kind, target, [xids.xid94(pid)], "uncorrectable ECC error "
                                                                   "encountered",
                      changes=changes, recovery=1 if rng.random() < 0.6 else None)


def strike_hbm_dbe(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    row = int(rng.integers(1 << 20, 1 << 34))
    lines = [
        xids.xid48(
            int(rng.integers(1 << 30, 1 << 36)), int(rng.integers(0, 8)), int(rng.integers(0, 2))
        ),
        xids.xid63(pid, row),
    ]
    changes = (
        ("ecc_dbe_volatile", 1, None),
        ("ecc_dbe_aggregate", 1, None),
        ("ecc_dram_uncorrected", 1, None),
        ("remapped_rows_uncorrectable", 1, None),
        ("remap_pending", 0, True),
    )
    return _gpu_crash(
        world,
        rng,
        kind,
        target,
        lines,
        "uncorrectable ECC error encountered",
        changes=changes,
        recovery=1 if rng.random() < 0.5 else None,
    )


def strike_sram(world, rng, kind, target):
    changes = (
        ("ecc_dbe_volatile", 1, None),
        ("ecc_dbe_aggregate", 1, None),
        ("ecc_sram_uncorrected", 1, None),
    )
    return _gpu_crash(world, rng, kind, target, [xids.xid95_sram()], "uncorrectable ECC error "
                                                                     "encountered",
                      changes=changes, recovery=1)


def strike_gsp_crash(world, rng, kind, target):
    pid = world.current.pid(target.rank)
    node, g, t = target.node, target.gpu, target.t
    repeats = int(rng.integers(1, 4))
    for i in range(repeats):
        add_xid(world, rng, t + i * int(6.2 * NS), node, g, xids.xid119(pid, g))
    if rng.random() < 0.4:
        add_xid(
            world,
            rng,
            t + repeats * int(6.2 * NS),
            node,
            g,
            xids.xid120(int(rng.integers(1 << 20, 1 << 28))),
        )
    exc_ts = t + repeats * int(6.2 * NS) + int(rng.uniform(0.1, 1.0) * NS)
    down = crash(world, rng, t, [(target.rank, proc.cuda_error("unknown error"), exc_ts)])
    return Outcome(
        make_label(world, kind, target, end=down, step=world.current.steps.step_at(t)),
        down_ts=down,
        exclude=node.name,
        restart_delay_s=hw_restart_delay(rng),
    )


def strike_gsp_hang(world, rng, kind, target):
    """The rank's CUDA call never returns (GSP RPC timeouts): it holds the GIL, so its dump trigger
    cannot run.
    """
    pid = world.current.pid(target.rank)
    node, g, t = target.node, target.gpu, target.t
    for i in range(int(rng.integers(2, 5))):
        add_xid(world, rng, t + i * int(6.2 * NS), node, g, xids.xid119(pid, g))
    spec = HangSpec(
        stuck={target.rank: int(rng.integers(0, 3))}, dead=frozenset(), broken_groups=frozenset()
    )
    down = hang(world, rng, t, spec, no_dump={target.rank})
    return Outcome(
        make_label(world, kind, target, end=down, step=world.current.steps.step_at(t)),
        down_ts=down,
        exclude=node.name,
        restart_delay_s=hw_restart_delay(rng),
    )


def strike_nvlink(world, rng, kind, target):
    """A failed NVLink: the node's tensor-parallel collectives start and never finish; Xid 74 and
    link counters.
    """
    attempt = world.current
    node, g, t = target.node, target.gpu, target.t
    add_xid(world, rng, t, node, g, xids.xid74(attempt.pid(target.rank), int(rng.integers(0, 18))))
    for name, delta in (
        ("nvlink_replay_errors", int(rng.integers(200, 5000))),
        ("nvlink_recovery_errors", 1),
        ("nvlink_crc_errors", int(rng.integers(50, 2000))),
    ):
        world.effects.changes.append(CounterChange(node.name, g, t, name, delta=delta))
    tp_group = attempt.member_of[target.rank]["tp"]
    spec = HangSpec(stuck={}, dead=frozenset(), broken_groups=frozenset({tp_group}))
    down = hang(world, rng, t, spec)
    ranks = tuple(attempt.placement.ranks_of_node(node.name))
    return Outcome(
        make_label(world, kind, target, ranks=ranks, end=down, step=attempt.steps.step_at(t)),
        down_ts=down,
        exclude=node.name,
        restart_delay_s=hw_restart_delay(rng),
    )


def prepare_thermal_runaway(world: World, rng: np.random.Generator, t: int) -> Target:
    """A failed thermal interface: the GPU heats up and throttles for a while before it drops off
    the bus.
    """
    target = pick_target(world, rng, t)
    onset = max(world.current.first_step_start, t - int(rng.uniform(600, 1800) * NS))
    target.onset = onset
    world.effects.conditions.append(
        GpuCondition(
            target.node.name,
            target.gpu,
            onset,
            t,
            temp_add=24.0,
            sm_clock_mult=0.72,
            power_mult=0.8,
            reasons=SW_THERMAL | HW_THERMAL,
        )
    )
    world.slowdowns.append(
        Slowdown(onset, t, float(rng.uniform(1.2, 1.35)), node=target.node.name, gpu=target.gpu)
    )
    return target


def strike_thermal_runaway(world, rng, kind, target):
    return _gpu_crash(
        world,
        rng,
        kind,
        target,
        [xids.xid79()],
        "unspecified launch failure",
        lost=True,
        notes="throttled before it fell off the bus",
    )


NAN_CHECK_FRAME = (
    f"{proc.PREFIX}/megatron/core/distributed/param_and_grad_buffer.py",
    161,
    "check_grads",
    "rerun_state_machine.validate_result(",
)


def prepare_sdc(world: World, rng: np.random.Generator, t: int) -> Target:
    """Silent data corruption: a loss spike on the replica first, then Megatron's NaN check fires.
    """
    target = pick_target(world, rng, t)
    dp = int(world.current.placement.dp_of_rank()[target.rank])
    onset = max(
        world.current.first_step_start, t - int(rng.uniform(2, 6) * world.cfg.step_seconds * NS)
    )
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
    # NaN reaches every rank of the culprit's data-parallel replica (tensor- and pipeline-parallel
    # peers)
    replica = [r for r in range(placement.world_size) if int(placement.dp_of_rank()[r]) == dp]
    primaries = []
    for rank in replica:
        place = placement.place(rank)
        message = (f"Rank {rank}, node {place.node.name}, device {place.local_rank}, iteration "
                   f"{step}: Unexpected "
                   "result nan (message='found NaN in local grad norm for bucket #0 in backward "
                   "pass before "
                   "data-parallel communication collective')")
        spec = proc.ExceptionSpec("RuntimeError", message, (*proc.TRAIN_FRAMES, NAN_CHECK_FRAME))
        primaries.append((rank, spec, t + int(rng.uniform(0.0, 0.4) * NS)))
    down = crash(world, rng, t, primaries)
    return Outcome(
        make_label(
            world, kind, target, end=down, step=step, notes="NaN in the replica's gradients"
        ),
        down_ts=down,
        exclude=target.node.name,
        restart_delay_s=hw_restart_delay(rng),
        restore_before=target.onset,
    )



# health (no failure yet)

def strike_remap_failure(world, rng, kind, target):
    node, g, t = target.node, target.gpu, target.t
    add_xid(world, rng, t, node, g, xids.xid64(int(rng.integers(1 << 20, 1 << 34))))
    for name, delta, value in (
        ("ecc_sbe_volatile", 1, None),
        ("ecc_sbe_aggregate", 1, None),
        ("remapped_rows_uncorrectable", 1, None),
        ("remap_failure", 0, True),
    ):
        world.effects.changes.append(CounterChange(node.name, g, t, name, delta=delta, value=value))
    recovery_action(world, rng, t + int(0.2 * NS), node, g, 4)
    return Outcome(make_label(world, kind, target, end=t + int(1800 * NS), step=None,
                              notes="row-remap failure with no crash: drain"))
