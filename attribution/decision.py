"""The decision contract: what the job controller should do about one incident.

One decision per incident (its id is derived from the incident id), as a frozen dataclass and as a
versioned JSON document ("schema": "faultlens.decision/1", docs/design.md "Decision contract")
validated by the pydantic model DecisionDocument; DECISION_JSON_SCHEMA publishes the same contract
as a JSON Schema. The row form is the `decisions` table of collectors/store/schema.py; the table is
append-only: a later row with the same decision_id and hook records a delivery status, the latest
row per (decision_id, hook) wins.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.collectors.rule_loader import describe, key_path
from faultlens.collectors.rule_model import FileModel, Fraction, NonNegativeInt, Text
from faultlens.errors import FaultlensError

SCHEMA_ID = "faultlens.decision/1"


class DecisionError(ValueError, FaultlensError):
    """A decision document does not fit the contract: the message names the place and what was
    expected.
    """


class Action(StrEnum):
    FAILOVER = "failover"  # exclude the culprit node(s), restart from the chosen checkpoint
    # restart in place: same nodes, nothing excluded, from the newest good checkpoint (a first
    # occurrence of a software or transient fault is no verdict on the code or on a node)
    RESTART = "restart"
    ESCALATE = "escalate"  # stop and hand it to a human
    # tell a human; the job keeps running (slowdowns: a running job is never stopped for one)
    NOTIFY = "notify"
    DRAIN = "drain"  # proactive: take the node out of service before it fails a job
    UNKNOWN = "unknown"


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    # the supervisor that issued it carried it out itself: never delivered again
    APPLIED = "applied"
    # a slowdown's failover the job outran (it ended before the checkpoint boundary): stored, never
    # delivered or carried out
    OUTRUN = "outrun"
    FAILED = "failed"
    UNKNOWN = "unknown"


TIER_KINDS = ("local", "peer", "durable")
TIER_PATTERN = r"^(local|peer|durable)(\+(local|peer|durable))*$"


@dataclass(frozen=True)
class Culprit:
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class Restore:
    """Where to restart from: the step, the tier kind(s) it comes from ("local+peer" when ranks come
    from more than one), and the checkpoint URI when a single directory holds it."""

    tier: str
    step: int
    uri: str | None = None
    # steps whose batches the restarted job leaves out (a data-dependent loss spike: replaying
    # them would bring it back)
    skip_steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Decision:
    decision_id: str
    incident_id: str
    action: Action
    incident_class: IncidentClass
    cause: Cause
    confidence: float
    rule: str  # the attribution rule that produced the incident
    policy_rule: str  # the policy rule that chose the action
    reason: str
    issued_at: dt.datetime
    job_id: str | None = None
    attempt: int | None = None
    cluster: str | None = None
    culprit: Culprit = field(default_factory=Culprit)
    exclude_nodes: tuple[str, ...] = ()
    restore: Restore | None = None
    evidence: tuple[Evidence, ...] = ()

    @staticmethod
    def id_for(incident_id: str) -> str:
        """The decision id of an incident: deterministic, so there is exactly one decision per
        incident and a receiver can recognise a duplicate delivery."""
        return "dec-" + hashlib.sha256(incident_id.encode()).hexdigest()[:16]

    @classmethod
    def for_incident(
        cls,
        incident: Incident,
        *,
        action: Action,
        policy_rule: str,
        reason: str,
        issued_at: dt.datetime,
        exclude_nodes: tuple[str, ...] = (),
        restore: Restore | None = None,
        cause: Cause | None = None,
    ) -> Decision:
        return cls(
            decision_id=cls.id_for(incident.incident_id),
            incident_id=incident.incident_id,
            action=action,
            incident_class=incident.incident_class,
            cause=cause if cause is not None else incident.cause,
            confidence=float(incident.confidence),
            rule=incident.rule,
            policy_rule=policy_rule,
            reason=reason,
            issued_at=issued_at,
            job_id=incident.job_id,
            attempt=incident.attempt,
            cluster=incident.cluster,
            culprit=Culprit(tuple(incident.culprit_nodes), tuple(incident.culprit_ranks),
                            tuple(incident.culprit_gpus)),
            exclude_nodes=exclude_nodes,
            restore=restore,
            evidence=tuple(incident.evidence),
        )

    # --- JSON document
    # -------------------------------------------------------------------------------------

    def to_document(self) -> dict[str, Any]:
        document = {
            "schema": SCHEMA_ID,
            "decision_id": self.decision_id,
            "incident_id": self.incident_id,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "cluster": self.cluster,
            "action": self.action.value,
            "class": self.incident_class.value,
            "cause": self.cause.value,
            "culprit": {
                "nodes": list(self.culprit.nodes),
                "ranks": list(self.culprit.ranks),
                "gpus": list(self.culprit.gpus),
            },
            "exclude_nodes": list(self.exclude_nodes),
            "restore": None
            if self.restore is None
            else {"tier": self.restore.tier, "step": self.restore.step, "uri": self.restore.uri,
                  **({"skip_steps": list(self.restore.skip_steps)}
                     if self.restore.skip_steps else {})},
            "confidence": self.confidence,
            "rule": self.rule,
            "policy_rule": self.policy_rule,
            "reason": self.reason,
            "evidence": [
                {"table": e.table, "ts": _iso(e.ts), "text": e.text} for e in self.evidence
            ],
            "issued_at": _iso(self.issued_at),
        }
        validate_document(document)
        return document

    def to_json(self) -> str:
        """The canonical JSON text (sorted keys, compact): the bytes a webhook signs."""
        return json.dumps(self.to_document(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_document(cls, document: Mapping[str, Any], *, source: str = "decision") -> Decision:
        validate_document(document, source=source)
        culprit = document["culprit"]
        restore = document["restore"]
        return cls(
            decision_id=document["decision_id"],
            incident_id=document["incident_id"],
            action=Action(document["action"]),
            incident_class=IncidentClass(document["class"]),
            cause=Cause(document["cause"]),
            confidence=float(document["confidence"]),
            rule=document["rule"],
            policy_rule=document["policy_rule"],
            reason=document["reason"],
            issued_at=_parse_ts(document["issued_at"]),
            job_id=document["job_id"],
            attempt=document["attempt"],
            cluster=document["cluster"],
            culprit=Culprit(
                tuple(culprit["nodes"]), tuple(culprit["ranks"]), tuple(culprit["gpus"])
            ),
            exclude_nodes=tuple(document["exclude_nodes"]),
            restore=None
            if restore is None
            else Restore(restore["tier"], int(restore["step"]), restore["uri"],
                         tuple(int(s) for s in restore.get("skip_steps") or ())),
            evidence=tuple(
                Evidence(e["table"], None if e["ts"] is None else _parse_ts(e["ts"]), e["text"])
                for e in document["evidence"]
            ),
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "decision") -> Decision:
        try:
            document = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DecisionError(f"{source}: not JSON: {exc}") from None
        return cls.from_document(document, source=source)

    # --- decisions table rows
    # ---------------------------------------------------------------------------------

    def to_row(self, *, status: DeliveryStatus = DeliveryStatus.PENDING, hook: str | None = None,
               ts: dt.datetime | None = None, reason: str | None = None) -> dict[str, Any]:
        """A decisions-table row. The first row of a decision is status pending with no hook
        (written before any delivery); each delivery attempt outcome appends a row with the hook's
        name."""
        return {
            "ts": ts or self.issued_at,
            "cluster": self.cluster,
            "node": self.culprit.nodes[0] if len(self.culprit.nodes) == 1 else None,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "rank": self.culprit.ranks[0] if len(self.culprit.ranks) == 1 else None,
            "gpu_uuid": self.culprit.gpus[0] if len(self.culprit.gpus) == 1 else None,
            "decision_id": self.decision_id,
            "incident_id": self.incident_id,
            "action": self.action.value,
            "class": self.incident_class.value,
            "cause": self.cause.value,
            "exclude_nodes": list(self.exclude_nodes),
            "restore_tier": self.restore.tier if self.restore else None,
            "restore_step": self.restore.step if self.restore else None,
            "restore_uri": self.restore.uri if self.restore else None,
            "reason": reason if reason is not None else self.reason,
            "confidence": self.confidence,
            "rule": self.rule,
            "issued_ts": self.issued_at,
            "delivery_status": status.value,
            "hook": hook,
            "document": self.to_json(),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Decision:
        """Rebuild a decision from a decisions-table row (its `document` column holds the contract).
        """
        text = row.get("document")
        if not text:
            raise DecisionError(f"decisions row {row.get('decision_id')!r}: no document")
        return cls.from_json(text, source=f"decisions row {row.get('decision_id')!r}")


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).isoformat()


def _parse_ts(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


_STRINGS = {"type": "array", "items": {"type": "string"}}
_NULLABLE_STRING = {"type": ["string", "null"]}

DECISION_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://faultlens.dev/schema/decision-1.json",
    "title": "faultlens decision, version 1",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "schema",
        "decision_id",
        "incident_id",
        "job_id",
        "attempt",
        "cluster",
        "action",
        "class",
        "cause",
        "culprit",
        "exclude_nodes",
        "restore",
        "confidence",
        "rule",
        "policy_rule",
        "reason",
        "evidence",
        "issued_at",
    ],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "decision_id": {"type": "string", "pattern": r"^[A-Za-z0-9._:-]{1,128}$"},
        "incident_id": {"type": "string", "minLength": 1},
        "job_id": _NULLABLE_STRING,
        "attempt": {"type": ["integer", "null"], "minimum": 0},
        "cluster": _NULLABLE_STRING,
        "action": {"enum": [a.value for a in Action]},
        "class": {"enum": [c.value for c in IncidentClass]},
        "cause": {"enum": [c.value for c in Cause]},
        "culprit": {
            "type": "object",
            "additionalProperties": False,
            "required": ["nodes", "ranks", "gpus"],
            "properties": {
                "nodes": _STRINGS,
                "ranks": {"type": "array", "items": {"type": "integer"}},
                "gpus": _STRINGS,
            },
        },
        "exclude_nodes": _STRINGS,
        "restore": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["tier", "step", "uri"],
                    "properties": {
                        "tier": {"type": "string", "pattern": TIER_PATTERN},
                        "step": {"type": "integer", "minimum": 0},
                        "uri": _NULLABLE_STRING,
                        "skip_steps": {"type": "array", "items": {"type": "integer"}},
                    },
                },
            ]
        },
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "rule": {"type": "string"},
        "policy_rule": {"type": "string"},
        "reason": {"type": "string"},
        "evidence": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["table", "ts", "text"],
                "properties": {
                    "table": {"type": "string"},
                    "ts": {"type": ["string", "null"], "format": "date-time"},
                    "text": {"type": "string"},
                },
            },
        },
        "issued_at": {"type": "string", "format": "date-time"},
    },
    "allOf": [
        # a failover names what to leave out, or (a rollback: the model state went bad, no node to
        # blame) the checkpoint to restart from; a drain names its nodes; an escalation changes
        # nothing by itself
        {
            "if": {"properties": {"action": {"const": "failover"}}},
            "then": {
                "anyOf": [
                    {"properties": {"exclude_nodes": {"minItems": 1}}},
                    {"properties": {"restore": {"type": "object"}}, "required": ["restore"]},
                ]
            },
        },
        {
            "if": {"properties": {"action": {"const": "drain"}}},
            "then": {"properties": {"exclude_nodes": {"minItems": 1}}},
        },
        {
            # a restart in place keeps every node: it excludes none
            "if": {"properties": {"action": {"const": "restart"}}},
            "then": {"properties": {"exclude_nodes": {"maxItems": 0}}},
        },
        {
            "if": {"properties": {"action": {"enum": ["escalate", "notify", "drain"]}}},
            "then": {"properties": {"restore": {"type": "null"}}},
        },
    ],
}

def _date_time(text: str) -> str:
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("an ISO 8601 date-time") from None
    return text


_DateTime = Annotated[str, AfterValidator(_date_time)]


class _Culprit(FileModel):
    nodes: list[str]
    ranks: list[int]
    gpus: list[str]


class _Restore(FileModel):
    tier: Annotated[str, Field(pattern=TIER_PATTERN)]
    step: NonNegativeInt
    uri: str | None
    skip_steps: list[int] = Field(default_factory=list)


class _Evidence(FileModel):
    table: str
    ts: _DateTime | None
    text: str


class DecisionDocument(FileModel):
    """The decision document, version 1: the model every document is validated against.
    DECISION_JSON_SCHEMA is the same contract published as a JSON Schema (tests/test_decision.py
    checks that the two agree)."""

    schema_: Literal[SCHEMA_ID] = Field(alias="schema")
    decision_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
    incident_id: Text
    job_id: str | None
    attempt: NonNegativeInt | None
    cluster: str | None
    action: Literal[tuple(a.value for a in Action)]  # type: ignore[valid-type]
    class_: Literal[tuple(c.value for c in IncidentClass)] = Field(alias="class")  # type: ignore[valid-type]
    cause: Literal[tuple(c.value for c in Cause)]  # type: ignore[valid-type]
    culprit: _Culprit
    exclude_nodes: list[str]
    restore: _Restore | None
    confidence: Fraction
    rule: str
    policy_rule: str
    reason: str
    evidence: list[_Evidence]
    issued_at: _DateTime

    @model_validator(mode="after")
    def _action_fits(self) -> DecisionDocument:
        # a failover names what to leave out, or (a rollback: the model state went bad, no node to
        # blame) the checkpoint to restart from; a drain names its nodes; an escalation changes
        # nothing by itself
        if self.action == Action.FAILOVER and not self.exclude_nodes and self.restore is None:
            raise ValueError("a failover to name exclude_nodes or a restore")
        if self.action == Action.DRAIN and not self.exclude_nodes:
            raise ValueError("a drain to name exclude_nodes")
        if (
            self.action in (Action.ESCALATE, Action.NOTIFY, Action.DRAIN)
            and self.restore is not None
        ):
            raise ValueError(f"restore null for action {self.action}")
        return self


def validate_document(document: Any, *, source: str = "decision") -> None:
    """Raise DecisionError naming the first offending place (e.g. `restore.step`) and what was
    expected.
    """
    try:
        DecisionDocument.model_validate(document)
    except ValidationError as exc:
        parts, expectation = describe(exc, document)
        raise DecisionError(
            f"{source}: {key_path(parts) if parts else '(document)'}: {expectation}"
        ) from None
