"""The policy file: rules/policy.yaml's model (PolicyFile), its loaded form (PolicyConfig with its
PolicyRule, SoftwareRepeatRule, LemonRule and SlowdownPolicy: the numbers slowdown.py weighs) and
the loader that turns one into the other (load_policy, policy_from_document)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from faultlens.attribution.decision import Action
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.rulefile import RuleFileError, load_rule_document
from faultlens.collectors.rule_model import (
    FileModel,
    FormatVersion1,
    Fraction,
    NonNegative,
    NonNegativeInt,
)
from faultlens.resources import rule_file, shipped_rule_file

# packaged; load_policy reads rule_file (FAULTLENS_RULES)
DEFAULT_POLICY_PATH = shipped_rule_file("policy.yaml")


class PolicyError(RuleFileError):
    """rules/policy.yaml is unreadable or invalid: `<file>: <key>: <expectation>`."""


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
    # the attribution rule that made the incident (e.g. a crash signature's id)
    rule: Annotated[list[str], Field(min_length=1)] | None = None
    culprit_nodes: _CulpritNodes | None = None
    culprit_ranks: _CulpritNodes | None = None


class _Restart(FileModel):
    same_fingerprint: NonNegativeInt


class _Rule(FileModel):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")]
    when: _When
    action: Literal[
        Action.FAILOVER.value,
        Action.RESTART.value,
        Action.ESCALATE.value,
        Action.NOTIFY.value,
        Action.DRAIN.value,
    ]
    reason: str | None = None
    # a failover that needs no culprit node: restart in place from an older checkpoint
    without_culprit: bool = False


class SlowdownSection(FileModel):
    """rules/policy.yaml's `straggler` section (the numbers of SlowdownPolicy)."""

    remaining_s: NonNegative | None = None
    restart_s: NonNegative = 600.0
    lost_work_s: NonNegative = 900.0
    min_saving: Fraction = 0.05
    same_cause_window_s: NonNegative = 3600.0


class PolicyFile(FileModel):
    """rules/policy.yaml."""

    format_version: FormatVersion1
    confidence_threshold: Fraction
    confidence_by_class: dict[_Class, Fraction] | None = None
    never_failover_causes: _CauseList
    software_repeat: _SoftwareRepeat | None = None
    retry_budget: _RetryBudget
    restart_budget: _Restart | None = None
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
    attribution_rules: frozenset[str] | None = None
    min_ranks: int | None = None
    max_ranks: int | None = None

    def matches(self, incident: Incident) -> bool:
        if self.classes is not None and incident.incident_class not in self.classes:
            return False
        if self.causes is not None and incident.cause not in self.causes:
            return False
        if self.attribution_rules is not None and incident.rule not in self.attribution_rules:
            return False
        if not _within(len(set(incident.culprit_nodes)), self.min_nodes, self.max_nodes):
            return False
        return _within(len(set(incident.culprit_ranks)), self.min_ranks, self.max_ranks)

    @property
    def catch_all(self) -> bool:
        return (
            self.classes is None
            and self.causes is None
            and self.attribution_rules is None
            and self.min_nodes is None
            and self.max_nodes is None
            and self.min_ranks is None
            and self.max_ranks is None
        )

    def when_cause_matched(self, incident: Incident) -> bool:
        """The rule names causes and this incident's cause is one of them (not a catch-all
        match)."""
        return self.causes is not None and incident.cause in self.causes


def _within(count: int, low: int | None, high: int | None) -> bool:
    return (low is None or count >= low) and (high is None or count <= high)


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
class SlowdownPolicy:
    """The `straggler` section loaded: the numbers of the policy for slowdowns (slowdown.py)."""

    # the remaining run time assumed for a job that declares no length (None: unknown, such a
    # slowdown is notified)
    remaining_s: float | None = None
    restart_s: float = 600.0  # a restart: stop, reschedule, load the checkpoint, warm up
    lost_work_s: float = 900.0  # work redone after the restart (time since the last checkpoint)
    min_saving: float = 0.05  # below this share of step time a failover is never worth it
    same_cause_window_s: float = 3600.0  # straggler incidents of one attempt this close are one set

    @classmethod
    def from_document(cls, document: Mapping[str, Any] | None) -> SlowdownPolicy:
        raw = dict(document or {})
        return cls(**{k: None if v is None else float(v) for k, v in raw.items()})


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
    # restarts in place allowed per job and failure fingerprint: the same fingerprint seen more
    # often than this in the job escalates (the code, not chance)
    restart_same_fingerprint: int = 1

    def threshold_for(self, incident_class: IncidentClass) -> float:
        return (self.confidence_by_class or {}).get(incident_class, self.confidence_threshold)

    def retry_budget(self, cause: Cause) -> int:
        return (self.retry_budget_by_cause or {}).get(cause, self.retry_budget_default)


def load_policy(path: str | Path | None = None) -> PolicyConfig:
    """Load and validate a policy file (default rules/policy.yaml). Raises PolicyError naming file,
    key and expectation."""
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
            attribution_rules=frozenset(when["rule"]) if "rule" in when else None,
            min_ranks=when.get("culprit_ranks", {}).get("min"),
            max_ranks=when.get("culprit_ranks", {}).get("max"),
        )
        if rule.id in ids:
            raise PolicyError(
                f"{source}: rules[{index}].id: expected a unique id, {rule.id!r} is used twice"
            )
        ids.add(rule.id)
        if rule.action is Action.FAILOVER and rule.causes is not None and rule.causes & never:
            bad = ", ".join(sorted(c.value for c in rule.causes & never))
            raise PolicyError(
                f"{source}: rules[{index}].when.cause: a failover rule may not match "
                "a "
                f"never_failover cause ({bad})"
            )
        rules.append(rule)
    if not any(r.catch_all for r in rules):
        raise PolicyError(
            f"{source}: rules: expected a last catch-all rule (`when: {{}}`) so "
            "every incident gets "
            "exactly one decision"
        )
    repeat = document.get("software_repeat", {})
    lemon = document.get("lemon")
    budget = document["retry_budget"]
    return PolicyConfig(
        source=source,
        confidence_threshold=float(document["confidence_threshold"]),
        confidence_by_class={
            IncidentClass(k): float(v) for k, v in document.get("confidence_by_class", {}).items()
        },
        never_failover_causes=never,
        retry_budget_default=int(budget["default"]),
        retry_budget_by_cause={Cause(k): int(v) for k, v in budget.get("by_cause", {}).items()},
        rules=tuple(rules),
        software_repeat=SoftwareRepeatRule(
            same_fingerprint_on_other_nodes=repeat.get("same_fingerprint_on_other_nodes", True),
            same_step_after_restart=repeat.get("same_step_after_restart", True),
            applies_to_causes=frozenset(
                Cause(c) for c in repeat.get("applies_to_causes", ["unknown", "software", "oom"])
            ),
        ),
        lemon=None
        if lemon is None
        else LemonRule(
            min_incidents=int(lemon["min_incidents"]),
            min_jobs=int(lemon["min_jobs"]),
            window_days=float(lemon["window_days"]),
            causes=frozenset(Cause(c) for c in lemon["causes"]) if "causes" in lemon else None,
        ),
        corruption_causes=frozenset(
            Cause(c) for c in document.get("corruption_causes", ["data_corruption"])
        ),
        max_exclude_nodes=int(document.get("max_exclude_nodes", 2)),
        straggler=SlowdownPolicy.from_document(document.get("straggler")),
        restart_same_fingerprint=int(document.get("restart_budget", {}).get("same_fingerprint", 1)),
    )
