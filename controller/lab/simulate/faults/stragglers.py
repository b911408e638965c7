"""The straggler injectors: a slow GPU, a node with failed cooling, a slow pipeline stage."""

from __future__ import annotations

import numpy as np

from faultlens.controller.lab.simulate.faults.kinds import Outcome
from faultlens.controller.lab.simulate.faults.pieces import make_label
from faultlens.controller.lab.simulate.gpu import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_THERMAL,
    CounterChange,
    GpuCondition,
)
from faultlens.controller.lab.simulate.timing import Slowdown
from faultlens.controller.lab.simulate.world import NS, World


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
        world.effects.conditions.append(
            GpuCondition(node, g, t, until, sm_clock_mult=0.78, reasons=HW_SLOWDOWN)
        )
    elif variant == "power_brake":
        world.effects.conditions.append(
            GpuCondition(
                node, g, t, until, sm_clock_mult=0.74, power_mult=0.62, reasons=HW_POWER_BRAKE
            )
        )
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
        world.effects.conditions.append(
            GpuCondition(
                node.name,
                g,
                t,
                until,
                temp_add=float(rng.uniform(18, 25)),
                sm_clock_mult=float(rng.uniform(0.8, 0.88)),
                reasons=SW_THERMAL | (HW_THERMAL if rng.random() < 0.4 else 0),
            )
        )
    ranks = tuple(world.current.placement.ranks_of_node(node.name))
    return Outcome(
        make_label(
            world,
            kind,
            target,
            ranks=ranks,
            gpus=tuple(g.uuid for g in node.gpus),
            end=until,
            notes="cooling failure on the whole node",
            extra={"factor": round(factor, 3)},
        )
    )


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
