"""Benign noise that must not be blamed: application Xids from processes that are not the job's
(13/31/43), brief thermal throttling of one GPU, and one-off slow steps (a GC pause on one rank, a
data-loader hiccup, a shared filesystem stall for everybody). Periodic evaluation and checkpoint
steps, warm-up after every restart, software power capping and a trickle of corrected ECC errors are
part of the normal timeline (timing/, gpu.py)."""

from __future__ import annotations

import numpy as np

from faultlens.controller.lab.fault_labels import ExpectedAction, FaultLabel, LabelClass
from faultlens.controller.lab.simulate import xid as xids
from faultlens.controller.lab.simulate.faults import add_xid
from faultlens.controller.lab.simulate.gpu import SW_THERMAL, GpuCondition
from faultlens.controller.lab.simulate.timing import Slowdown, Spike
from faultlens.controller.lab.simulate.world import NS, World, to_datetime

# kind -> weight
BENIGN_KINDS: dict[str, float] = {
    "benign_app_xid": 0.30,
    "benign_thermal_blip": 0.25,
    "benign_gc_pause": 0.20,
    "benign_loader_stall": 0.15,
    "benign_filesystem_stall": 0.10,
}
SIDE_PROCESSES = ("python3", "pt_data_worker", "dcgmproftester12", "nvidia-smi", "jupyter-lab")


def _label(
    world: World, kind: str, t: int, end: int, node: str | None, gpu: str | None, notes: str
) -> FaultLabel:
    attempt = world.current
    return FaultLabel(
        fault_id=world.next_fault_id(benign=True),
        kind=kind,
        category="Benign",
        label_class=LabelClass.BENIGN,
        cause="none",
        expected_action=ExpectedAction.NONE,
        injected_ts=to_datetime(t),
        effect_end_ts=to_datetime(end),
        job_id=world.cfg.job,
        attempt=attempt.number,
        culprit_nodes=(node,) if node else (),
        culprit_gpus=(gpu,) if gpu else (),
        notes=notes,
    )


def inject_benign(
    world: World, rng: np.random.Generator, kind: str, t: int, running: bool
) -> FaultLabel | None:
    """Inject one piece of benign noise at t on the running attempt's nodes. Timing noise needs
    running steps.
    """
    placement = world.current.placement
    rank = int(rng.integers(0, placement.world_size))
    place = placement.place(rank)
    node, g = place.node, place.local_rank
    if kind == "benign_app_xid":
        code = int(rng.choice([13, 31, 43]))
        pid = world.new_pid(rng)
        name = SIDE_PROCESSES[int(rng.integers(0, len(SIDE_PROCESSES)))]
        line = {
            13: xids.xid13(pid, name),
            31: xids.xid31(pid, name, int(rng.integers(1 << 40, 1 << 46))),
            43: xids.xid43(pid, name),
        }[code]
        add_xid(world, rng, t, node, g, line)
        return _label(world, kind, t, t + NS, node.name, node.gpus[g].uuid, f"Xid {code} from "
                                                                            f"{name} (pid {pid})")
    if not running:
        return None
    if kind == "benign_thermal_blip":
        end = t + int(rng.uniform(20, 60) * NS)
        world.effects.conditions.append(
            GpuCondition(
                node.name,
                g,
                t,
                end,
                temp_add=float(rng.uniform(10, 16)),
                sm_clock_mult=0.93,
                reasons=SW_THERMAL,
            )
        )
        world.slowdowns.append(Slowdown(t, end, 1.05, node=node.name, gpu=g))
        return _label(world, kind, t, end, node.name, node.gpus[g].uuid, "brief software thermal "
                                                                         "slowdown")
    if kind == "benign_gc_pause":
        world.spikes.append(
            Spike(t, "rank_compute", float(rng.uniform(2.0, 4.0)), node=node.name, gpu=g)
        )
        return _label(world, kind, t, t + int(world.cfg.step_seconds * 5 * NS), node.name, None,
                      "one slow step on one rank")
    if kind == "benign_loader_stall":
        world.spikes.append(
            Spike(t, "rank_data", float(rng.uniform(3.0, 20.0)), node=node.name, gpu=g)
        )
        return _label(
            world,
            kind,
            t,
            t + int(world.cfg.step_seconds * 5 * NS) + int(20 * NS),
            node.name,
            None,
            "one data-loader hiccup on one rank",
        )
    if kind == "benign_filesystem_stall":
        world.spikes.append(Spike(t, "job_data", float(rng.uniform(5.0, 30.0))))
        return _label(
            world,
            kind,
            t,
            t + int(world.cfg.step_seconds * 5 * NS) + int(30 * NS),
            None,
            None,
            "shared filesystem stall: one slow step everywhere",
        )
    raise ValueError(f"unknown benign kind {kind!r}")
