"""The pieces every injector uses: the target it hits, its label, Xid lines and recovery actions,
the restart delay after a hardware fault."""

from __future__ import annotations

from typing import Any

import numpy as np

from faultlens.controller.lab.fault_labels import FaultLabel
from faultlens.controller.lab.simulate import xid as xids
from faultlens.controller.lab.simulate.faults.kinds import FaultKind, Mode, Target
from faultlens.controller.lab.simulate.gpu import CounterChange
from faultlens.controller.lab.simulate.world import World, to_datetime


def pick_target(world: World, rng: np.random.Generator, t: int) -> Target:
    attempt = world.current
    rank = int(rng.integers(0, attempt.placement.world_size))
    place = attempt.placement.place(rank)
    return Target(t, place.node, place.local_rank, rank)


def make_label(
    world: World,
    kind: FaultKind,
    target: Target,
    *,
    nodes: tuple[str, ...] | None = None,
    ranks: tuple[int, ...] | None = None,
    gpus: tuple[str, ...] | None = None,
    end: int | None = None,
    step: int | None = None,
    notes: str = "",
    repeat_of: str | None = None,
    extra: dict[str, Any] | None = None,
) -> FaultLabel:
    attempt = world.current
    gpu = target.node.gpus[target.gpu]
    extra = dict(extra or {})
    if kind.mode in (Mode.CRASH, Mode.HANG):
        last = attempt.steps.last_end_before(target.t)
        # progress stopped here: the reference point for hang detection latency
        if last is not None:
            extra["last_step_end_ts"] = to_datetime(last).isoformat()
    return FaultLabel(
        fault_id=world.next_fault_id(),
        kind=kind.kind,
        category=kind.category,
        label_class=kind.label_class,
        cause=kind.cause,
        expected_action=kind.action,
        injected_ts=to_datetime(target.t),
        effect_end_ts=to_datetime(end if end is not None else target.t),
        job_id=world.cfg.job,
        attempt=attempt.number,
        step=step,
        culprit_nodes=(target.node.name,) if nodes is None else nodes,
        culprit_ranks=(target.rank,) if ranks is None else ranks,
        culprit_gpus=(gpu.uuid,) if gpus is None else gpus,
        repeat_of=repeat_of,
        onset_ts=to_datetime(target.onset) if target.onset is not None else None,
        notes=notes,
        extra=extra,
    )


def add_xid(
    world: World,
    rng: np.random.Generator,
    t: int,
    node,
    gpu_index: int,
    line: xids.XidLine,
    nvml: bool = True,
) -> None:
    gpu = node.gpus[gpu_index]
    attempt = world.current.number
    for row in world.xid.kmsg_xid(t, node, gpu, attempt, line):
        world.add("gpu_events", row)
    if nvml:
        world.add(
            "gpu_events",
            world.xid.nvml_xid(
                t + int(rng.integers(1_000_000, 400_000_000)), node, gpu, attempt, line.code
            ),
        )


def recovery_action(
    world: World, rng: np.random.Generator, t: int, node, gpu_index: int, action: int
) -> None:
    add_xid(world, rng, t, node, gpu_index, xids.xid154(0, action), nvml=False)
    world.effects.changes.append(
        CounterChange(node.name, gpu_index, t, "recovery_action", value=action)
    )


def hw_restart_delay(rng: np.random.Generator) -> float:
    return float(rng.uniform(120.0, 420.0))
