"""The decision policy: one incident -> exactly one decision (failover, escalate or drain), by the rules of
rules/policy.yaml (docs/design.md "Decision policy").

Order of evaluation:
1. software repeats found in the job's history (the same fingerprint on other nodes, or again at the same step
   after a restart) -> escalate as software;
2. no certain culprit (no culprit node, or confidence below the threshold) -> escalate;
3. the first matching rule gives the action;
4. a failover must pass the hard guards: never for a never-failover cause (a software bug is never restarted in a
   loop), never more nodes than max_exclude_nodes, and the job's retry budget for the root cause must not be spent;
   the job's lemon nodes are excluded along with the culprits; the restore is chosen by the checkpoint catalog
   (a RestoreChooser) given the exclusions and, for corruption causes, the time and step of the first signal.

The store's history comes in through the PolicyHistory protocol (StoreHistory reads the incidents, decisions and
ranks tables); the restore choice through the RestoreChooser callable (controller/checkpoints implements it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, Field

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.rulefile import RuleFileError, load_rule_document
from faultlens.attribution.straggler_policy import SlowdownPolicy, SlowdownSection, slowdown_action, slowdown_gate
from faultlens.collectors.rule_model import FileModel, FormatVersion1, Fraction, NonNegativeInt
from faultlens.resources import rule_file, shipped_rule_file

DEFAULT_POLICY_PATH = shipped_rule_file("policy.yaml")  # packaged; load_policy reads rule_file (FAULTLENS_RULES)


class PolicyError(RuleFileError):
    """rules/policy.yaml is unreadable or invalid: `<file>: <key>: <expectation>`."""


_CAUSES = [c.value for c in Cause]
_Cause = Literal[tuple(c.value for c in Cause)]  # type: ignore[valid-type]
_Class = Literal[tuple(c.value for c in IncidentClass)]  # type: ignore[valid-type]


def _unique(values: list[Any]) -> list[Any]:
    if len(set(values)) != len(values):
        raise ValueError("unique items")
    return values


_CauseList = Annotated[list[_Cause], AfterValidator(_unique)]


class _SoftwareRepeat(FileModel):
    same_fingerprint_on_other_nodes: bool = True
    same_step_after_restart: bool = True
    applies_to_causes: _CauseList | None = None


class _RetryBudget(FileModel):
    default: NonNegativeInt
    by_cause: dict[_Cause, NonNegativeInt] | None = None


class _Lemon(FileModel):
    min_incidents: Annotated[int, Field(ge=1)]
    min_jobs: Annotated[int, Field(ge=1)]
    window_days: Annotated[float, Field(gt=0)]
    causes: _CauseList | None = None


class _CulpritNodes(FileModel):
    min: NonNegativeInt | None = None
    max: NonNegativeInt | None = None


class _When(FileModel):
    class_: Annotated[list[_Class], Field(min_length=1)] | None = Field(default=None, alias="class")
    cause: Annotated[list[_Cause], Field(min_length=1)] | None = None
    culprit_nodes: _CulpritNodes | None = None


class _Rule(FileModel):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")]
    when: _When
    action: Literal[Action.FAILOVER.value, Action.ESCALATE.value, Action.NOTIFY.value, Action.DRAIN.value]
    reason: str | None = None
    # a failover that needs no culprit node: restart in place from an older checkpoint
    without_culprit: bool = False


class PolicyFile(FileModel):
    """rules/policy.yaml."""

    format_version: FormatVersion1
    confidence_threshold: Fraction
    confidence_by_class: dict[_Class, Fraction] | None = None
    never_failover_causes: _CauseList
    software_repeat: _SoftwareRepeat | None = None
    retry_budget: _RetryBudget
    lemon: _Lemon | None = None
    corruption_causes: _CauseList | None = None
    max_exclude_nodes: Annotated[int, Field(ge=1)] | None = None
    straggler: SlowdownSection | None = None
    rules: Annotated[list[_Rule], Field(min_length=1)]


@dataclass(frozen=True)
class PolicyRule:
    id: str
    action: Action
    reason: str
    classes: frozenset[IncidentClass] | None = None
    causes: frozenset[Cause] | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    without_culprit: bool = False

    def matches(self, incident: Incident) -> bool:
        if self.classes is not None and incident.incident_class not in self.classes:
            return False
        if self.causes is not None and incident.cause not in self.causes:
            return False
        nodes = len(set(incident.culprit_nodes))
        if self.min_nodes is not None and nodes < self.min_nodes:
            return False
        return not (self.max_nodes is not None and nodes > self.max_nodes)

    def when_cause_matched(self, incident: Incident) -> bool:
        """The rule names causes and this incident's cause is one of them (not a catch-all match)."""
        return self.causes is not None and incident.cause in self.causes


@dataclass(frozen=True)
class SoftwareRepeatRule:
    same_fingerprint_on_other_nodes: bool = True
    same_step_after_restart: bool = True
    applies_to_causes: frozenset[Cause] = frozenset({Cause.UNKNOWN, Cause.SOFTWARE, Cause.OOM})


@dataclass(frozen=True)
class LemonRule:
    min_incidents: int = 3
    min_jobs: int = 2
    window_days: float = 30.0
    causes: frozenset[Cause] | None = None


@dataclass(frozen=True)
class PolicyConfig:
    source: str
    confidence_threshold: float
    never_failover_causes: frozenset[Cause]
    retry_budget_default: int
    rules: tuple[PolicyRule, ...]
    confidence_by_class: Mapping[IncidentClass, float] | None = None
    retry_budget_by_cause: Mapping[Cause, int] | None = None
    software_repeat: SoftwareRepeatRule = SoftwareRepeatRule()
    lemon: LemonRule | None = None
    corruption_causes: frozenset[Cause] = frozenset({Cause.DATA_CORRUPTION})
    max_exclude_nodes: int = 2
    straggler: SlowdownPolicy = field(default_factory=SlowdownPolicy)

    def threshold_for(self, incident_class: IncidentClass) -> float:
        return (self.confidence_by_class or {}).get(incident_class, self.confidence_threshold)

    def retry_budget(self, cause: Cause) -> int:
        return (self.retry_budget_by_cause or {}).get(cause, self.retry_budget_default)


def load_policy(path: str | Path | None = None) -> PolicyConfig:
    """Load and validate a policy file (default rules/policy.yaml). Raises PolicyError naming file, key and
    expectation."""
    path = Path(path) if path is not None else rule_file("policy.yaml")
    document = load_rule_document(path, PolicyFile, error=PolicyError)
    return policy_from_document(document, source=str(path))


def policy_from_document(document: Mapping[str, Any], *, source: str) -> PolicyConfig:
    never = frozenset(Cause(c) for c in document["never_failover_causes"])
    rules = []
    ids: set[str] = set()
    for index, raw in enumerate(document["rules"]):
        when = raw["when"]
        rule = PolicyRule(
            id=raw["id"],
            action=Action(raw["action"]),
            reason=raw.get("reason", raw["id"]),
            classes=frozenset(IncidentClass(c) for c in when["class"]) if "class" in when else None,
            causes=frozenset(Cause(c) for c in when["cause"]) if "cause" in when else None,
            min_nodes=when.get("culprit_nodes", {}).get("min"),
            max_nodes=when.get("culprit_nodes", {}).get("max"),
            without_culprit=bool(raw.get("without_culprit", False)),
        )
        if rule.id in ids:
            raise PolicyError(f"{source}: rules[{index}].id: expected a unique id, {rule.id!r} is used twice")
        ids.add(rule.id)
        if rule.action is Action.FAILOVER and rule.causes is not None and rule.causes & never:
            bad = ", ".join(sorted(c.value for c in rule.causes & never))
            raise PolicyError(f"{source}: rules[{index}].when.cause: a failover rule may not match a "
                              f"never_failover cause ({bad})")
        rules.append(rule)
    if not any(not r.classes and not r.causes and r.min_nodes is None and r.max_nodes is None for r in rules):
        raise PolicyError(f"{source}: rules: expected a last catch-all rule (`when: {{}}`) so every incident gets "
                          "exactly one decision")
    repeat = document.get("software_repeat", {})
    lemon = document.get("lemon")
    budget = document["retry_budget"]
    return PolicyConfig(
        source=source,
        confidence_threshold=float(document["confidence_threshold"]),
        confidence_by_class={IncidentClass(k): float(v) for k, v in document.get("confidence_by_class", {}).items()},
        never_failover_causes=never,
        retry_budget_default=int(budget["default"]),
        retry_budget_by_cause={Cause(k): int(v) for k, v in budget.get("by_cause", {}).items()},
        rules=tuple(rules),
        software_repeat=SoftwareRepeatRule(
            same_fingerprint_on_other_nodes=repeat.get("same_fingerprint_on_other_nodes", True),
            same_step_after_restart=repeat.get("same_step_after_restart", True),
            applies_to_causes=frozenset(Cause(c) for c in repeat.get("applies_to_causes",
                                                                      ["unknown", "software", "oom"])),
        ),
        lemon=None if lemon is None else LemonRule(
            min_incidents=int(lemon["min_incidents"]), min_jobs=int(lemon["min_jobs"]),
            window_days=float(lemon["window_days"]),
            causes=frozenset(Cause(c) for c in lemon["causes"]) if "causes" in lemon else None),
        corruption_causes=frozenset(Cause(c) for c in document.get("corruption_causes", ["data_corruption"])),
        max_exclude_nodes=int(document.get("max_exclude_nodes", 2)),
        straggler=SlowdownPolicy.from_document(document.get("straggler")),
    )


# --- the boundaries: history and restore choice ------------------------------------------------------------------


@dataclass(frozen=True)
class LemonNode:
    node: str
    incidents: int
    jobs: int


class PolicyHistory(Protocol):
    """What the policy needs to know about the past."""

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        """Failover decisions already issued for this job with this root cause (other incidents)."""
        ...

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        """Other incidents of the same job (every attempt)."""
        ...

    def lemon_nodes(self, rule: LemonRule, now: dt.datetime) -> list[LemonNode]:
        """Nodes implicated repeatedly across jobs within the rule's window."""
        ...

    def job_nodes(self, job_id: str | None) -> set[str]:
        """Nodes the job runs on (from the ranks table)."""
        ...


class NoHistory:
    """A policy history with nothing in it (a first incident, no store)."""

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        return 0

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        return []

    def lemon_nodes(self, rule: LemonRule, now: dt.datetime) -> list[LemonNode]:
        return []

    def job_nodes(self, job_id: str | None) -> set[str]:
        return set()


class StoreHistory:
    """PolicyHistory over a faultlens store (faultlens.attribution.store.Store): incidents, decisions and ranks tables.
    Every call refreshes the listing of the tables it reads, so a live policy sees rows written since."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _query(self, tables: Iterable[str], sql: str, params: list[Any]) -> list[dict[str, Any]]:
        self.store.refresh(tuple(tables))
        return self.store.query(sql, params).to_pylist()

    def prior_failovers(self, job_id: str | None, cause: Cause, exclude_incident_id: str,
                        incident_class: IncidentClass | None = None) -> int:
        if job_id is None:
            return 0
        rows = self._query(["decisions"], """
            SELECT count(DISTINCT decision_id) AS n FROM decisions
            WHERE job_id = ? AND action = 'failover' AND cause = ? AND incident_id <> ?
              AND (? IS NULL OR "class" = ?)""",
                           [job_id, cause.value, exclude_incident_id,
                            *(2 * [incident_class.value if incident_class is not None else None])])
        return int(rows[0]["n"]) if rows else 0

    def job_incidents(self, job_id: str | None, exclude_incident_id: str) -> list[Incident]:
        if job_id is None:
            return []
        rows = self._query(["incidents"], """
            SELECT * FROM incidents WHERE job_id = ? AND incident_id <> ?
            QUALIFY row_number() OVER (PARTITION BY incident_id ORDER BY ts DESC) = 1
            ORDER BY ts""", [job_id, exclude_incident_id])
        return [Incident.from_row(row) for row in rows]

    def lemon_nodes(self, rule: LemonRule, now: dt.datetime) -> list[LemonNode]:
        since = now - dt.timedelta(days=rule.window_days)
        causes = sorted(c.value for c in rule.causes) if rule.causes is not None else _CAUSES
        placeholders = ", ".join("?" for _ in causes)
        rows = self._query(["incidents"], f"""
            WITH implicated AS (
                SELECT DISTINCT incident_id, job_id, unnest(culprit_nodes) AS node FROM incidents
                WHERE ts >= ? AND cause IN ({placeholders}) AND class <> 'health')
            SELECT node, count(DISTINCT incident_id) AS incidents, count(DISTINCT job_id) AS jobs
            FROM implicated WHERE node IS NOT NULL GROUP BY node
            HAVING count(DISTINCT incident_id) >= ? AND count(DISTINCT job_id) >= ?
            ORDER BY node""", [since, *causes, rule.min_incidents, rule.min_jobs])
        return [LemonNode(r["node"], int(r["incidents"]), int(r["jobs"])) for r in rows]

    def job_nodes(self, job_id: str | None) -> set[str]:
        if job_id is None:
            return set()
        rows = self._query(["ranks"], "SELECT DISTINCT node FROM ranks WHERE job_id = ? AND node IS NOT NULL",
                           [job_id])
        return {r["node"] for r in rows}


@dataclass(frozen=True)
class RestoreRequest:
    """What the checkpoint catalog needs to choose a restore: the nodes that leave (their local tiers are gone)
    and, when the cause suggests corruption, a bound the checkpoint must be older than."""

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
            return Decision.for_incident(incident, action=slowdown_action(incident, Action.ESCALATE),
                                         policy_rule=policy_rule, reason=reason, issued_at=now, cause=cause)

        # 0. slowdowns (attribution/straggler_policy.py): never stopped; systemic, several nodes at once, uncertain
        #    or not worth a restart -> notify
        gated = slowdown_gate(self, incident)
        if gated is not None:
            return gated

        # 1. the policy's own software check over the job's history
        repeat = self._software_repeat(incident)
        if repeat is not None:
            return escalate("software-repeat", repeat, Cause.SOFTWARE)

        # 2. an escalation the evidence itself asks for (software, systemic imbalance) needs no culprit node:
        #    say why, rather than "no culprit"
        rule = next(r for r in config.rules if r.matches(incident))  # the last rule is a catch-all (loader checks)
        if rule.action is Action.ESCALATE and rule.when_cause_matched(incident):
            return escalate(rule.id, rule.reason)
        if rule.action is Action.NOTIFY and rule.when_cause_matched(incident):
            return Decision.for_incident(incident, action=Action.NOTIFY, policy_rule=rule.id, reason=rule.reason,
                                         issued_at=now)

        # 3. no certain culprit
        threshold = config.threshold_for(incident.incident_class)
        if not nodes and not rule.without_culprit:
            return escalate("no-culprit", "no culprit node identified; a human must look")
        if incident.confidence < threshold:
            return escalate("low-confidence", f"culprit not certain: confidence {incident.confidence:.2f} < "
                                              f"{threshold:.2f}")

        # 4. the first matching rule
        if rule.action is Action.ESCALATE:
            return escalate(rule.id, rule.reason)
        if rule.action is Action.NOTIFY:  # matched by class (or a catch-all): a notification, never a failover
            return Decision.for_incident(incident, action=Action.NOTIFY, policy_rule=rule.id, reason=rule.reason,
                                         issued_at=now)
        if rule.action is Action.DRAIN:
            return Decision.for_incident(incident, action=Action.DRAIN, policy_rule=rule.id,
                                         reason=f"{rule.reason}: drain {', '.join(nodes)}", issued_at=now,
                                         exclude_nodes=nodes)

        # 5. failover guards, then the failover itself
        guarded = self._failover_guard(incident, rule, nodes, escalate)
        if guarded is not None:
            return guarded
        return self._failover(incident, rule, nodes, job_nodes, now, escalate)

    def _failover_guard(self, incident: Incident, rule: PolicyRule, nodes: tuple[str, ...],
                        escalate: Callable[[str, str], Decision]) -> Decision | None:
        """An escalation where a failover must not happen: a cause never failed over, too many nodes (systemic),
        or the cause's retry budget spent."""
        config = self.config
        if incident.cause in config.never_failover_causes:
            return escalate(f"{rule.id}:never-failover", f"cause {incident.cause.value} is never failed over "
                                                         "(a restart would repeat it)")
        if len(nodes) > config.max_exclude_nodes:
            return escalate(f"{rule.id}:too-many-nodes", f"{len(nodes)} culprit nodes exceed max_exclude_nodes "
                                                         f"{config.max_exclude_nodes}: systemic, not one node")
        budget = config.retry_budget(incident.cause)
        # the root cause is the kind of failure and its cause: a straggler and a crash of unknown cause are two
        used = self.history.prior_failovers(incident.job_id, incident.cause, incident.incident_id,
                                            incident.incident_class)
        if used >= budget:
            return escalate(f"{rule.id}:retry-budget-spent",
                            f"retry budget for cause {incident.cause.value} spent: {used} failovers of {budget}")
        return None

    def _failover(self, incident: Incident, rule: PolicyRule, nodes: tuple[str, ...], job_nodes: Iterable[str] | None,
                  now: dt.datetime, escalate: Callable[[str, str], Decision]) -> Decision:
        """The failover: the culprit nodes and proactive lemons excluded, and the checkpoint to restore."""
        config = self.config
        exclude = list(nodes)
        reasons = [f"{rule.reason}: exclude {', '.join(nodes)}" if nodes else f"{rule.reason}: exclude no node"]
        lemons = self._job_lemons(incident, job_nodes, nodes)
        if lemons:
            exclude.extend(lemon.node for lemon in lemons)
            reasons.append("lemon node(s) excluded proactively: " + ", ".join(
                f"{lemon.node} ({lemon.incidents} incidents in {lemon.jobs} jobs)" for lemon in lemons))
        restore = None
        if self.restore_chooser is not None:
            corrupt = incident.cause in config.corruption_causes
            request = RestoreRequest(job_id=incident.job_id, exclude_nodes=tuple(exclude),
                                     before_ts=incident.first_signal_ts if corrupt else None,
                                     before_step=incident.step if corrupt else None)
            restore = self.restore_chooser(request)
            if restore is None:
                reasons.append("no usable checkpoint survives the exclusion: restart from the beginning")
            else:
                where = f"{restore.tier} step {restore.step}"
                reasons.append(f"restore {where}" + (" (older than the incident: corruption suspected)"
                                                     if corrupt else ""))
        if not exclude and restore is None:  # a rollback with nothing to roll back to
            return escalate(f"{rule.id}:nothing-to-restore", "no node to leave out and no usable checkpoint from "
                                                             "before the fault: a human must look")
        return Decision.for_incident(incident, action=Action.FAILOVER, policy_rule=rule.id,
                                     reason="; ".join(reasons), issued_at=now, exclude_nodes=tuple(exclude),
                                     restore=restore)

    def _software_repeat(self, incident: Incident) -> str | None:
        rule = self.config.software_repeat
        if incident.cause not in rule.applies_to_causes:
            return None
        if not (rule.same_fingerprint_on_other_nodes or rule.same_step_after_restart):
            return None
        nodes = set(incident.culprit_nodes)
        if rule.same_fingerprint_on_other_nodes and incident.fingerprint and len(nodes) > 1:
            return (f"the same failure (fingerprint {incident.fingerprint}) on {len(nodes)} nodes "
                    f"({', '.join(sorted(nodes))}): software")
        others = self.history.job_incidents(incident.job_id, incident.incident_id)
        for other in others:
            if other.cause not in rule.applies_to_causes:
                continue
            if (rule.same_fingerprint_on_other_nodes and incident.fingerprint
                    and other.fingerprint == incident.fingerprint and set(other.culprit_nodes) - nodes):
                return (f"the same failure (fingerprint {incident.fingerprint}) seen before on "
                        f"{', '.join(sorted(set(other.culprit_nodes) - nodes))} (incident {other.incident_id}): "
                        "software")
            if (rule.same_step_after_restart and incident.step is not None and other.step == incident.step
                    and other.incident_class == incident.incident_class
                    and incident.attempt is not None and other.attempt is not None
                    and other.attempt < incident.attempt):
                return (f"the job failed again at step {incident.step} after a restart (attempt {other.attempt} "
                        f"-> {incident.attempt}, incident {other.incident_id}): a deterministic repeat, software")
        return None

    def _job_lemons(self, incident: Incident, job_nodes: Iterable[str] | None,
                    culprits: tuple[str, ...]) -> list[LemonNode]:
        if self.config.lemon is None:
            return []
        lemons = self.history.lemon_nodes(self.config.lemon, self.clock())
        if not lemons:
            return []
        members = set(job_nodes) if job_nodes is not None else self.history.job_nodes(incident.job_id)
        return [lemon for lemon in lemons if lemon.node in members and lemon.node not in culprits]
