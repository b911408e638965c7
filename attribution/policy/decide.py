"""DecisionPolicy: a PolicyConfig applied to one incident -> exactly one decision, in the order of
evaluation of the package docstring (attribution/policy/__init__.py); the restore is asked of a
RestoreChooser with a RestoreRequest."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.incident import Cause, Incident
from faultlens.attribution.policy.config import PolicyConfig, PolicyRule, load_policy
from faultlens.attribution.policy.history import LemonNode, NoHistory, PolicyHistory
from faultlens.attribution.policy.slowdown import slowdown_action, slowdown_gate


@dataclass(frozen=True)
class RestoreRequest:
    """What the checkpoint catalog needs to choose a restore: the nodes that leave (their local
    tiers are gone) and, when the cause suggests corruption, a bound the checkpoint must be older
    than."""

    job_id: str | None
    exclude_nodes: tuple[str, ...]
    before_ts: dt.datetime | None = None
    before_step: int | None = None


RestoreChooser = Callable[[RestoreRequest], Restore | None]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DecisionPolicy:
    """Apply a PolicyConfig to incidents. History and restore choice are constructor arguments."""

    def __init__(self, config: PolicyConfig | None = None, *, history: PolicyHistory | None = None,
                 restore_chooser: RestoreChooser | None = None,
                 clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self.config = config or load_policy()
        self.history = history or NoHistory()
        self.restore_chooser = restore_chooser
        self.clock = clock

    def lemon_nodes(self) -> list[LemonNode]:
        """Nodes to keep out of any job now (the supervisor may exclude them at start)."""
        if self.config.lemon is None:
            return []
        return self.history.lemon_nodes(self.config.lemon, self.clock())

    def decide(self, incident: Incident, *, job_nodes: Iterable[str] | None = None) -> Decision:
        """Exactly one decision for `incident`."""
        now = self.clock()
        config = self.config
        nodes = tuple(dict.fromkeys(incident.culprit_nodes))

        def escalate(policy_rule: str, reason: str, cause: Cause | None = None) -> Decision:
            return Decision.for_incident(
                incident,
                action=slowdown_action(incident, Action.ESCALATE),
                policy_rule=policy_rule,
                reason=reason,
                issued_at=now,
                cause=cause,
            )

        # 0. slowdowns (attribution/policy/slowdown.py): never stopped; systemic, several nodes at
        # once, uncertain or not worth a restart -> notify
        gated = slowdown_gate(self, incident)
        if gated is not None:
            return gated

        # 1. the policy's own software check over the job's history
        repeat = self._software_repeat(incident)
        if repeat is not None:
            return escalate("software-repeat", repeat, Cause.SOFTWARE)

        # the last rule is a catch-all (loader checks)
        rule = next(r for r in config.rules if r.matches(incident))

        # 2. a restart in place (a first occurrence: no verdict on the code nor on a node) needs
        # no culprit node and excludes none; the same fingerprint again escalates
        if rule.action is Action.RESTART:
            return self._restart(incident, rule, now, escalate)

        # 3. an escalation the evidence itself asks for (software, systemic imbalance) needs no
        # culprit node: say why, rather than "no culprit"
        if rule.action is Action.ESCALATE and rule.when_cause_matched(incident):
            return escalate(rule.id, rule.reason)
        if rule.action is Action.NOTIFY and rule.when_cause_matched(incident):
            return Decision.for_incident(
                incident,
                action=Action.NOTIFY,
                policy_rule=rule.id,
                reason=rule.reason,
                issued_at=now,
            )

        # 4. no certain culprit
        threshold = config.threshold_for(incident.incident_class)
        if not nodes and not rule.without_culprit:
            return escalate("no-culprit", "no culprit node identified; a human must look")
        if incident.confidence < threshold:
            return escalate(
                "low-confidence",
                f"culprit not certain: confidence {incident.confidence:.2f} < {threshold:.2f}",
            )

        # 5. the first matching rule
        if rule.action is Action.ESCALATE:
            return escalate(rule.id, rule.reason)
        # matched by class (or a catch-all): a notification, never a failover
        if rule.action is Action.NOTIFY:
            return Decision.for_incident(
                incident,
                action=Action.NOTIFY,
                policy_rule=rule.id,
                reason=rule.reason,
                issued_at=now,
            )
        if rule.action is Action.DRAIN:
            return Decision.for_incident(
                incident,
                action=Action.DRAIN,
                policy_rule=rule.id,
                reason=f"{rule.reason}: drain {', '.join(nodes)}",
                issued_at=now,
                exclude_nodes=nodes,
            )

        # 6. failover guards, then the failover itself
        guarded = self._failover_guard(incident, rule, nodes, escalate)
        if guarded is not None:
            return guarded
        return self._failover(incident, rule, nodes, job_nodes, now, escalate)

    def _failover_guard(
        self,
        incident: Incident,
        rule: PolicyRule,
        nodes: tuple[str, ...],
        escalate: Callable[[str, str], Decision],
    ) -> Decision | None:
        """An escalation where a failover must not happen: a cause never failed over, too many nodes
        (systemic), or the cause's retry budget spent."""
        config = self.config
        if incident.cause in config.never_failover_causes:
            return escalate(
                f"{rule.id}:never-failover",
                f"cause {incident.cause.value} is never failed over (a restart would repeat it)",
            )
        if len(nodes) > config.max_exclude_nodes:
            return escalate(
                f"{rule.id}:too-many-nodes",
                f"{len(nodes)} culprit nodes exceed "
                "max_exclude_nodes "
                f"{config.max_exclude_nodes}: systemic, "
                "not one node",
            )
        budget = config.retry_budget(incident.cause)
        # the root cause is the kind of failure and its cause: a straggler and a crash of unknown
        # cause are two
        used = self.history.prior_failovers(
            incident.job_id, incident.cause, incident.incident_id, incident.incident_class
        )
        if used >= budget:
            return escalate(
                f"{rule.id}:retry-budget-spent",
                f"retry budget for cause {incident.cause.value} spent: {used} "
                f"failovers of {budget}",
            )
        return None

    def _failover(
        self,
        incident: Incident,
        rule: PolicyRule,
        nodes: tuple[str, ...],
        job_nodes: Iterable[str] | None,
        now: dt.datetime,
        escalate: Callable[[str, str], Decision],
    ) -> Decision:
        """The failover: the culprit nodes and proactive lemons excluded, and the checkpoint to
        restore.
        """
        config = self.config
        repeat = incident.details.get("escalate") if isinstance(incident.details, dict) else None
        if repeat:  # the detector's own word: a rollback would loop (a spike that follows the data)
            return escalate(f"{rule.id}:repeats", str(repeat))
        exclude = list(nodes)
        reasons = [
            f"{rule.reason}: exclude {', '.join(nodes)}"
            if nodes
            else f"{rule.reason}: exclude no node"
        ]
        lemons = self._job_lemons(incident, job_nodes, nodes)
        if lemons:
            exclude.extend(lemon.node for lemon in lemons)
            reasons.append(
                "lemon node(s) excluded proactively: "
                + ", ".join(
                    f"{lemon.node} ({lemon.incidents} incidents in {lemon.jobs} jobs)"
                    for lemon in lemons
                )
            )
        restore = None
        if self.restore_chooser is not None:
            corrupt = incident.cause in config.corruption_causes
            restore = self._choose_restore(incident, tuple(exclude))
            if restore is None:
                reasons.append(
                    "no usable checkpoint survives the exclusion: restart from the beginning"
                )
            else:
                where = f"{restore.tier} step {restore.step}"
                reasons.append(
                    f"restore {where}"
                    + (" (older than the incident: corruption suspected)" if corrupt else "")
                )
        if not exclude and restore is None:  # a rollback with nothing to roll back to
            return escalate(
                f"{rule.id}:nothing-to-restore",
                "no node to leave out and no usable "
                "checkpoint from "
                "before the fault: a human must look",
            )
        # a job-wide numerics incident (its detector says so): a restart in place
        details = incident.details if isinstance(incident.details, dict) else {}
        if details.get("restart_in_place") and not exclude:
            return self._in_place(incident, rule, now, reasons, restore)
        if restore is not None and details.get("checks"):  # a certified restore says what it passed
            reasons.append(str(details["checks"]))
        return Decision.for_incident(
            incident,
            action=Action.FAILOVER,
            policy_rule=rule.id,
            reason="; ".join(reasons),
            issued_at=now,
            exclude_nodes=tuple(exclude),
            restore=restore,
        )

    def _choose_restore(self, incident: Incident, exclude: tuple[str, ...]) -> Restore | None:
        """The checkpoint to restore with `exclude` left out: older than the incident when its
        cause suggests corruption."""
        if self.restore_chooser is None:
            return None
        corrupt = incident.cause in self.config.corruption_causes
        return self.restore_chooser(RestoreRequest(
            job_id=incident.job_id,
            exclude_nodes=exclude,
            before_ts=incident.first_signal_ts if corrupt else None,
            before_step=incident.step if corrupt else None,
        ))

    def _in_place(
        self,
        incident: Incident,
        rule: PolicyRule,
        now: dt.datetime,
        reasons: list[str],
        restore: Restore | None,
    ) -> Decision:
        """The one restart in place (same nodes, nothing excluded, `restore`) of both ways to it: a
        first occurrence (_restart) and a job-wide numerics incident (_failover); the batches the
        detector names are left out, a certified restore says what it passed."""
        details = incident.details if isinstance(incident.details, dict) else {}
        reasons = list(reasons)
        if restore is not None and details.get("skip_steps"):
            skip = tuple(int(s) for s in details["skip_steps"])
            restore = dataclasses.replace(restore, skip_steps=skip)
            reasons.append(f"skip the batches of steps {', '.join(map(str, skip))}")
        if restore is not None and details.get("checks"):
            reasons.append(str(details["checks"]))
        return Decision.for_incident(
            incident,
            action=Action.RESTART,
            policy_rule=rule.id,
            reason="; ".join(reasons),
            issued_at=now,
            restore=restore,
        )

    def _restart(
        self,
        incident: Incident,
        rule: PolicyRule,
        now: dt.datetime,
        escalate: Callable[[str, str], Decision],
    ) -> Decision:
        """Restart in place (same nodes, nothing excluded, the newest good checkpoint) the first
        time this failure is seen in the job; escalate once the same failure has been seen
        restart_same_fingerprint times before."""
        budget = self.config.restart_same_fingerprint
        seen = [
            other
            for other in self.history.job_incidents(incident.job_id, incident.incident_id)
            if _same_failure(other, incident)
        ]
        what = (
            f"fingerprint {incident.fingerprint}"
            if incident.fingerprint
            else f"{incident.incident_class.value}/{incident.cause.value} ({incident.rule})"
        )
        if len(seen) >= budget:
            earlier = ", ".join(f"attempt {o.attempt}" for o in seen[:3])
            return escalate(
                f"{rule.id}:restart-budget-spent",
                f"the same failure ({what}) returned: seen before in this job "
                f"({earlier}); {budget} restart(s) in place allowed per failure: "
                "the code or the data, not chance; a human must look",
            )
        restore = self._choose_restore(incident, ())
        where = (
            f"restore {restore.tier} step {restore.step}"
            if restore is not None
            else "no checkpoint yet: from the beginning"
        )
        reason = (f"{rule.reason}: first occurrence of {what} in this job; restart in place on "
                  f"the same nodes, nothing excluded, {where}")
        return self._in_place(incident, rule, now, [reason], restore)

    def _software_repeat(self, incident: Incident) -> str | None:
        rule = self.config.software_repeat
        if incident.cause not in rule.applies_to_causes:
            return None
        if not (rule.same_fingerprint_on_other_nodes or rule.same_step_after_restart):
            return None
        nodes = set(incident.culprit_nodes)
        if rule.same_fingerprint_on_other_nodes and incident.fingerprint and len(nodes) > 1:
            return (
                f"the same failure (fingerprint {incident.fingerprint}) on {len(nodes)} nodes "
                f"({', '.join(sorted(nodes))}): software"
            )
        others = self.history.job_incidents(incident.job_id, incident.incident_id)
        for other in others:
            if other.cause not in rule.applies_to_causes:
                continue
            if (
                rule.same_fingerprint_on_other_nodes
                and incident.fingerprint
                and other.fingerprint == incident.fingerprint
                and set(other.culprit_nodes) - nodes
            ):
                return (
                    f"the same failure (fingerprint {incident.fingerprint}) seen before on "
                    f"{', '.join(sorted(set(other.culprit_nodes) - nodes))} (incident "
                    f"{other.incident_id}): "
                    "software"
                )
            if (
                rule.same_step_after_restart
                and incident.step is not None
                and other.step == incident.step
                and other.incident_class == incident.incident_class
                and incident.attempt is not None
                and other.attempt is not None
                and other.attempt < incident.attempt
            ):
                return (
                    f"the job failed again at step {incident.step} after a restart (attempt "
                    f"{other.attempt} "
                    f"-> {incident.attempt}, incident {other.incident_id}): a deterministic "
                    "repeat, software"
                )
        return None

    def _job_lemons(
        self, incident: Incident, job_nodes: Iterable[str] | None, culprits: tuple[str, ...]
    ) -> list[LemonNode]:
        if self.config.lemon is None:
            return []
        lemons = self.history.lemon_nodes(self.config.lemon, self.clock())
        if not lemons:
            return []
        members = (
            set(job_nodes) if job_nodes is not None else self.history.job_nodes(incident.job_id)
        )
        return [lemon for lemon in lemons if lemon.node in members and lemon.node not in culprits]


def _same_failure(other: Incident, incident: Incident) -> bool:
    """The same failure: the same fingerprint; without one, the same class, cause and rule."""
    if incident.fingerprint:
        return other.fingerprint == incident.fingerprint
    return (other.incident_class, other.cause, other.rule) == (
        incident.incident_class,
        incident.cause,
        incident.rule,
    )
