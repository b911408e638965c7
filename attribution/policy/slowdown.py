"""The policy for slowdowns (straggler incidents): a running job is never stopped for one.

DecisionPolicy.decide asks `slowdown_gate` first for every straggler incident; it returns a NOTIFY
decision (a human is told, the job keeps running) or None (the ordinary rules decide; an ESCALATE
they give becomes NOTIFY). In order:
1. a systemic cause (workload_imbalance: a slow stage, data-dependent imbalance, slow ranks on many
   nodes) or no culprit node (a slow replica spread over nodes) -> notify, never exclude a node;
2. the set of open straggler incidents of the job: another straggler incident of the same attempt on
   other nodes within `same_cause_window_s` (in the store's history or in the same batch) -> notify
   them all: one systemic cause is likelier than several bad nodes at once, and a failover each
   would exclude healthy nodes;
3. confidence below the straggler threshold -> notify;
4. the what-if: a failover (at the next checkpoint boundary) pays only when the step time it saves
   over the job's remaining time outweighs a restart plus the work lost since the last checkpoint:
   saving x remaining_s > restart_s + lost_work_s, and saving >= min_saving; otherwise notify.
   remaining_s is the job's own: the steps it declares it will run (the step timer's total_steps,
   from StepTimer(total_steps=), $FAULTLENS_TOTAL_STEPS or `faultlens run --total-steps`) less those
   done, times the recent step time, which the detector puts in the incident's details. Where the
   job declares no length it is unknown: the policy's `remaining_s` (an operator's figure for jobs
   that declare none) is used when set, and otherwise the slowdown is notified, never failed over: a
   saving that cannot be weighed justifies no restart. An incident without a what-if estimate (an
   older store) is left to the rules.
The numbers are rules/policy.yaml's `straggler` section.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from faultlens.attribution.decision import Action, Decision
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.policy.config import PolicyConfig, SlowdownPolicy
from faultlens.attribution.policy.history import PolicyHistory


class DecidingPolicy(Protocol):
    """The decision policy that asks the slowdown policy (DecisionPolicy, decide.py: slowdown_gate
    first, for every incident), as this module reads it: its config (the `straggler` numbers, the
    confidence threshold), its history, its clock and, for a batch (decide_all), its own decision
    where the gate leaves an incident to the rules. A protocol: decide.py imports this module, so
    this one knows the policy only by what it reads of it."""

    config: PolicyConfig
    history: PolicyHistory
    clock: Callable[[], dt.datetime]

    def decide(self, incident: Incident) -> Decision: ...


_SAVES = re.compile(r"saves (\d+(?:\.\d+)?)% of step time")


def straggler_saving(incident: Incident) -> float | None:
    """The share of step time fixing the slowdown would save: the detector's what-if (details, or
    the evidence text of an incident read back from the store)."""
    value = (incident.details or {}).get("saving_fraction")
    if value is not None:
        return float(value)
    for evidence in incident.evidence:
        match = _SAVES.search(evidence.text)
        if match and evidence.text.startswith("what-if"):
            return float(match.group(1)) / 100.0
    return None


def job_remaining(incident: Incident, config: SlowdownPolicy) -> tuple[float | None, str]:
    """(the job's remaining seconds, where the figure comes from); None when neither the job nor the
    policy gives one."""
    details = incident.details or {}
    value = details.get("remaining_s")
    if value is not None:
        total = details.get("total_steps")
        return float(value), (
            f"the job declares {int(total)} steps" if total is not None else "the incident's"
        )
    if config.remaining_s is not None:
        return float(config.remaining_s), "the policy's remaining_s: the job declares no length"
    return None, "unknown"


def _notify(incident: Incident, rule: str, reason: str, policy: DecidingPolicy) -> Decision:
    return Decision.for_incident(incident, action=Action.NOTIFY, policy_rule=rule, reason=reason,
                                 issued_at=policy.clock())


def _same_set(incident: Incident, others: Iterable[Incident], window_s: float) -> list[Incident]:
    nodes = set(incident.culprit_nodes)
    found = []
    for other in others:
        if (
            other.incident_id == incident.incident_id
            or other.incident_class is not IncidentClass.STRAGGLER
        ):
            continue
        if other.job_id != incident.job_id or other.attempt != incident.attempt:
            continue
        if not other.culprit_nodes or not set(other.culprit_nodes) - nodes:
            continue
        if abs((other.first_signal_ts - incident.first_signal_ts).total_seconds()) > window_s:
            continue
        found.append(other)
    return found


def slowdown_gate(policy: DecidingPolicy, incident: Incident,
                  peers: Sequence[Incident] = ()) -> Decision | None:
    """NOTIFY for a straggler incident that must not be acted on, else None (the rules decide)."""
    if incident.incident_class is not IncidentClass.STRAGGLER:
        return None
    config: SlowdownPolicy = getattr(policy.config, "straggler", None) or SlowdownPolicy()
    if incident.cause is Cause.WORKLOAD_IMBALANCE or not incident.culprit_nodes:
        return _notify(incident, "straggler-systemic",
                       "a systemic slowdown (a stage, a replica's shared resource, data-dependent "
                       "imbalance or many "
                       "nodes): no node is excluded; the job keeps running", policy)
    history = (
        list(policy.history.job_incidents(incident.job_id, incident.incident_id))
        if incident.job_id
        else []
    )
    together = _same_set(incident, [*history, *peers], config.same_cause_window_s)
    if together:
        nodes = sorted({n for i in [incident, *together] for n in i.culprit_nodes})
        return _notify(incident, "straggler-several-nodes",
                       f"{len(together) + 1} straggler incidents of this attempt on {len(nodes)} "
                       "nodes "
                       f"({', '.join(nodes)}): one systemic cause is likelier than {len(nodes)} "
                       "bad nodes; none "
                       "is excluded, the job keeps running", policy)
    threshold = policy.config.threshold_for(incident.incident_class)
    if incident.confidence < threshold:
        return _notify(incident, "straggler-low-confidence",
                       f"culprit not certain: confidence {incident.confidence:.2f} < "
                       f"{threshold:.2f}; the job keeps "
                       "running", policy)
    saving = straggler_saving(incident)
    if saving is None:
        return None
    remaining, source = job_remaining(incident, config)
    if saving < config.min_saving:
        return _notify(incident, "straggler-not-worth-a-restart",
                       f"fixing it saves {saving:.1%} of step time, less than the "
                       f"{config.min_saving:.0%} minimum a "
                       "failover needs; the job keeps running", policy)
    if remaining is None:
        return _notify(incident, "straggler-remaining-unknown",
                       f"fixing it saves {saving:.1%} of step time, but the job declares no length "
                       "(no total_steps: "
                       "StepTimer(total_steps=), FAULTLENS_TOTAL_STEPS or `faultlens run "
                       "--total-steps`) and the "
                       "policy sets no remaining_s, so the saving cannot be weighed against a "
                       "restart; the job keeps "
                       "running", policy)
    benefit = saving * remaining
    cost = config.restart_s + config.lost_work_s
    if benefit <= cost:
        return _notify(incident, "straggler-not-worth-a-restart",
                       f"fixing it saves {saving:.1%} of step time, {benefit / 60:.0f} min over "
                       "the "
                       f"{remaining / 3600:.1f} h remaining ({source}), not more than a restart "
                       f"({config.restart_s:.0f} s) plus the work lost since the last checkpoint "
                       f"({config.lost_work_s:.0f} s); the job keeps running", policy)
    return None


def slowdown_action(incident: Incident, action: Action) -> Action:
    """A straggler is never stopped: what the rules would escalate is notified."""
    if incident.incident_class is IncidentClass.STRAGGLER and action is Action.ESCALATE:
        return Action.NOTIFY
    return action


def decide_all(policy: DecidingPolicy, incidents: Sequence[Incident]) -> list[Decision]:
    """Decide a batch of incidents together: straggler incidents of one attempt see each other (two
    single-node incidents from one systemic cause never give two failovers)."""
    decisions = []
    for incident in incidents:
        peers = [i for i in incidents if i is not incident]
        gated = slowdown_gate(policy, incident, peers)
        decisions.append(gated if gated is not None else policy.decide(incident))
    return decisions
