"""The network and host injectors: a rail's HCA or cable, a NIC, a rank stuck in host code, a node
that dies.
"""

from __future__ import annotations

from faultlens.controller.lab.simulate import process as proc
from faultlens.controller.lab.simulate.collectives import HangSpec
from faultlens.controller.lab.simulate.faults.endings import (
    communicating_peers,
    crash,
    hang,
    log_stderr,
)
from faultlens.controller.lab.simulate.faults.kinds import Outcome
from faultlens.controller.lab.simulate.faults.pieces import hw_restart_delay, make_label
from faultlens.controller.lab.simulate.world import NS


def _link_crash(world, rng, kind, target, event: str) -> Outcome:
    """One rail's HCA or cable: NCCL on that rank logs the async event and fails; its peers see
    remote errors.
    """
    attempt = world.current
    place = attempt.placement.place(target.rank)
    t = target.t
    # NCCL's WARN line about the HCA event goes to stderr (the stderr scanner keeps only lines it
    # recognises)
    log_stderr(world, t + int(rng.uniform(0.0, 0.5) * NS), target.rank,
               proc.nccl_async_event(place.local_rank, event))
    peer = sorted(communicating_peers(world, {target.rank}))
    peer_ip = attempt.placement.place(peer[0]).node.ip if peer else place.node.ip
    spec = proc.nccl_error("unhandled system error", "ncclSystemError",
                           "System call (e.g. socket, malloc) or external library call failed or "
                           "device error.",
                           "NET/IB : Got completion from peer "
                           f"{peer_ip}<{int(rng.integers(30000, 60000))}> with "
                           "status=5 opcode=0 len=0 vendor err 249 (Send)")
    exc_ts = t + int(rng.uniform(0.5, 3.0) * NS)
    down = crash(world, rng, t, [(target.rank, spec, exc_ts)])
    return Outcome(
        make_label(world, kind, target, end=down, step=attempt.steps.step_at(t)),
        down_ts=down,
        exclude=target.node.name,
        restart_delay_s=hw_restart_delay(rng),
    )


def strike_port_error(world, rng, kind, target):
    return _link_crash(world, rng, kind, target, "port error")


def strike_nic_fatal(world, rng, kind, target):
    return _link_crash(world, rng, kind, target, "local catastrophic error")


def strike_stuck_rank(world, rng, kind, target):
    """A rank stops in host code before the step's first collective (a deadlocked loader, a stuck
    syscall); it still answers the dump request. No log line anywhere says which rank it was."""
    spec = HangSpec(stuck={target.rank: 0}, dead=frozenset(), broken_groups=frozenset())
    down = hang(world, rng, target.t, spec)
    return Outcome(
        make_label(world, kind, target, end=down, step=world.current.steps.step_at(target.t)),
        down_ts=down,
        exclude=target.node.name,
        restart_delay_s=hw_restart_delay(rng),
    )


def strike_host_down(world, rng, kind, target):
    """The node dies (power, kernel panic, memory, board): its agent, ranks and telemetry stop at
    once.
    """
    attempt = world.current
    node = target.node
    dead = frozenset(attempt.placement.ranks_of_node(node.name))
    world.effects.leave(node.name, target.t)
    spec = HangSpec(stuck={}, dead=dead, broken_groups=frozenset())
    down = hang(
        world, rng, target.t, spec, link_errors_from=(node.ip,), gloo_barrier=rng.random() < 0.3
    )
    return Outcome(
        make_label(
            world,
            kind,
            target,
            ranks=tuple(sorted(dead)),
            gpus=tuple(g.uuid for g in node.gpus),
            end=down,
            step=attempt.steps.step_at(target.t),
        ),
        down_ts=down,
        exclude=node.name,
        restart_delay_s=float(rng.uniform(300, 900)),
    )
