"""What a decision means for the running job: the judgment the supervisor asks of the policy while
it watches an attempt (docs/design.md "What an action means"). The supervisor
(controller/supervisor/watch.py) only carries the answers out; the rules that say when a job fails
over live here, next to the decision policy (decide.py) and the policy for slowdowns (slowdown.py).

- A slowdown is a straggler incident, or an incident of any class caused by workload imbalance: the
  job is slow, not broken.
- A notify, and any decision on a slowdown that is not a failover, is delivered and the job keeps
  running: a running job is never stopped for a slowdown.
- A failover of a slowdown waits for the next checkpoint boundary (a complete checkpoint newer than
  the one there was at decision time) instead of stopping the attempt at once.
- While such a failover waits, another slowdown is left to it, not decided; any other incident is
  decided, and one whose decision ends the attempt supersedes the waiting failover.
"""

from __future__ import annotations

from faultlens.attribution.decision import Action, Decision
from faultlens.attribution.incident import Cause, Incident, IncidentClass


def is_slowdown(incident: Incident) -> bool:
    """A straggler, or a workload imbalance of any class: the job is slow, not broken."""
    return (incident.incident_class is IncidentClass.STRAGGLER
            or incident.cause is Cause.WORKLOAD_IMBALANCE)


def keeps_running(incident: Incident, decision: Decision) -> bool:
    """A notify, or any decision on a slowdown but a failover: delivered, and the job keeps
    running."""
    return decision.action is Action.NOTIFY or (is_slowdown(incident)
                                                and decision.action is not Action.FAILOVER)


def fails_over_at_boundary(incident: Incident, decision: Decision) -> bool:
    """A slowdown's failover: carried out at the next checkpoint boundary, and training goes on
    until then (a slowdown never stops the job at once)."""
    return is_slowdown(incident) and decision.action is Action.FAILOVER


def waits_for_pending_failover(incident: Incident) -> bool:
    """While a slowdown's failover waits for its checkpoint boundary: this incident (another
    slowdown) is left to that failover rather than decided."""
    return is_slowdown(incident)
