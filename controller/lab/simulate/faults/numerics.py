"""Silent data corruption that crashes nothing: one flipped bit in one GPU's parameters. The job
runs on; the numerics probe's next parameter digest of that rank differs from its data-parallel
replicas' (simulate/numerics_rows.py writes the digests), and the supervisor fails the node over:
its SIGTERMs end the attempt."""

from __future__ import annotations

import numpy as np

from faultlens.collectors.sources.process_events.rows import EventContext, signal_sent_row
from faultlens.controller.lab.simulate.faults.kinds import FaultKind, Outcome, Target
from faultlens.controller.lab.simulate.faults.pieces import hw_restart_delay, make_label
from faultlens.controller.lab.simulate.world import NS, World


def strike_param_flip(
    world: World, rng: np.random.Generator, kind: FaultKind, target: Target
) -> Outcome:
    """The bit flipped between the last two digests before `target.t` (the supervisor's stop): the
    later one shows it, on the target rank only."""
    attempt = world.current
    every = max(1, world.cfg.numerics_every)
    steps, ends = attempt.steps.steps, attempt.steps.ends
    digests = [i for i, s in enumerate(steps) if s % every == 0 and ends[i] < target.t]
    if digests:
        catch = digests[-1]
        after = ends[digests[-2]] if len(digests) > 1 else attempt.first_step_start
        shown = steps[catch]
        target.onset = int(rng.uniform(after, max(after + 1, ends[catch] - NS)))
    else:  # no digest before the stop: nothing shows it (a miss, as it would be live)
        shown = attempt.steps.next_step + every
        target.onset = max(attempt.first_step_start, target.t - NS)
    world.flips.append((attempt.number, target.rank, shown))
    placement = attempt.placement
    context = {
        node.name: EventContext(
            node=node.name, cluster=world.cfg.cluster, job_id=world.cfg.job, attempt=attempt.number
        )
        for node in placement.nodes
    }
    for place in placement.ranks():
        world.add(
            "process_events",
            signal_sent_row(
                context[place.node.name],
                target.t + int(rng.uniform(0.0, 0.5) * NS),
                pid=attempt.pid(place.rank),
                signal="SIGTERM",
                message="supervisor: failover (numerics)",
                rank=place.rank,
                local_rank=place.local_rank,
            ),
        )
    label = make_label(
        world,
        kind,
        target,
        end=target.t,
        step=shown,
        notes=f"one flipped parameter bit; the digest of step {shown} differs on this rank",
    )
    return Outcome(
        label,
        down_ts=target.t + int(rng.uniform(5.0, 20.0) * NS),
        exclude=target.node.name,
        restart_delay_s=hw_restart_delay(rng),
        restore_before=target.onset,
    )
