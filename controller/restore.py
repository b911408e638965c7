"""The restore hook: a failover decision + the checkpoint catalog -> a restore plan (step, tier,
per-rank sources) handed to the job controller, as a callable or a JSON file the supervisor passes
to the training script (env FAULTLENS_RESTORE_PLAN names the file; load_restore_plan() reads it back
in the script)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from faultlens import environment
from faultlens.attribution.decision import Action, Decision
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.fsutil import atomic_write
from faultlens.controller.checkpoints.tiers import Tier, parse_tier_spec, tiers_from_config
from faultlens.errors import FaultlensError

PLAN_FORMAT = "faultlens.restore/1"
ENV_RESTORE_PLAN = environment.RESTORE_PLAN.name


class RestoreError(RuntimeError, FaultlensError):
    """No plan can be made, or a plan file is unreadable: the message says which and why."""


@dataclass(frozen=True)
class PlanSource:
    rank: int
    uri: str
    tier: str
    node: str | None = None


@dataclass(frozen=True)
class RestorePlan:
    decision_id: str
    incident_id: str
    job_id: str | None
    step: int | None  # None: no checkpoint survives, start from the beginning
    tier: str | None
    layout: str | None
    uri: str | None
    world_size: int | None
    exclude_nodes: tuple[str, ...]
    sources: tuple[PlanSource, ...] = ()
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @property
    def fresh_start(self) -> bool:
        return self.step is None

    def source_for(self, rank: int) -> str | None:
        """Where `rank` reads its state: its shard file, or the DCP directory."""
        for source in self.sources:
            if source.rank == rank:
                return source.uri
        return self.uri

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": PLAN_FORMAT,
                "decision_id": self.decision_id,
                "incident_id": self.incident_id,
                "job_id": self.job_id,
                "step": self.step,
                "tier": self.tier,
                "layout": self.layout,
                "uri": self.uri,
                "world_size": self.world_size,
                "exclude_nodes": list(self.exclude_nodes),
                "sources": [
                    {"rank": s.rank, "uri": s.uri, "tier": s.tier, "node": s.node}
                    for s in self.sources
                ],
                "created_at": self.created_at.isoformat(),
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, source: str = "restore plan") -> RestorePlan:
        try:
            doc = json.loads(text)
            if doc.get("format") != PLAN_FORMAT:
                raise RestoreError(f"{source}: format: expected {PLAN_FORMAT!r}, got "
                                   f"{doc.get('format')!r}")
            return cls(
                decision_id=doc["decision_id"],
                incident_id=doc["incident_id"],
                job_id=doc.get("job_id"),
                step=doc.get("step"),
                tier=doc.get("tier"),
                layout=doc.get("layout"),
                uri=doc.get("uri"),
                world_size=doc.get("world_size"),
                exclude_nodes=tuple(doc.get("exclude_nodes") or ()),
                sources=tuple(
                    PlanSource(int(s["rank"]), s["uri"], s["tier"], s.get("node"))
                    for s in doc.get("sources") or ()
                ),
                created_at=dt.datetime.fromisoformat(doc["created_at"]),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, RestoreError):
                raise
            raise RestoreError(
                f"{source}: not a restore plan: {type(exc).__name__}: {exc}"
            ) from None


def plan_restore(decision: Decision, catalog: CheckpointCatalog, *, world_size: int | None = None
                 ) -> RestorePlan | None:
    """The plan for a failover or restart decision (None for escalate/drain). The per-rank sources
    are rebuilt from the catalog at the decided step; if that checkpoint no longer qualifies
    (deleted, corrupted since), the newest one at or before it that does is used (older is always
    safe, also under suspected corruption)."""
    if decision.action not in (Action.FAILOVER, Action.RESTART):
        return None
    base = {
        "decision_id": decision.decision_id,
        "incident_id": decision.incident_id,
        "job_id": decision.job_id,
        "exclude_nodes": decision.exclude_nodes,
    }
    if decision.restore is None:
        return RestorePlan(
            step=None, tier=None, layout=None, uri=None, world_size=world_size, **base
        )
    choice = catalog.choose(
        decision.exclude_nodes, step=decision.restore.step, world_size=world_size
    )
    if choice is None:
        choice = catalog.choose(
            decision.exclude_nodes, before_step=decision.restore.step, world_size=world_size
        )
    if choice is None:
        return RestorePlan(
            step=None, tier=None, layout=None, uri=None, world_size=world_size, **base
        )
    return RestorePlan(
        step=choice.step,
        tier=choice.tier,
        layout=choice.layout.value,
        uri=choice.uri,
        world_size=choice.world_size,
        sources=tuple(PlanSource(s.rank, s.uri, s.tier.value, s.node) for s in choice.sources),
        **base,
    )


def write_plan(plan: RestorePlan, path: str | Path) -> None:
    """Atomically write the plan file (the supervisor passes its path in FAULTLENS_RESTORE_PLAN)."""
    fs, target = fsspec.core.url_to_fs(str(path))
    atomic_write(fs, target, plan.to_json().encode())


def load_restore_plan(environ: Mapping[str, str] | None = None) -> RestorePlan | None:
    """In the training script: the plan named by FAULTLENS_RESTORE_PLAN, or None for a first start.
    """
    path = environment.RESTORE_PLAN.get(environ)
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RestoreError(f"{path}: cannot read restore plan: {exc.strerror or exc}") from None
    return RestorePlan.from_json(text, source=path)


def read_source(uri: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of one rank's shard (any fsspec URL)."""
    with fsspec.open(uri, "rb", **dict(storage_options or {})) as handle:
        return handle.read()


def load_rank_state(
    plan: RestorePlan, rank: int, *, storage_options: Mapping[str, Any] | None = None
) -> Any:
    """In the training script: this rank's saved state from a shard-layout plan, loaded with
    torch.load(weights_only=True) (never an arbitrary unpickle). A DCP plan is loaded by the caller
    with torch.distributed.checkpoint.load(state_dict, checkpoint_id=plan.uri), which needs the
    model's own state dict."""
    if plan.fresh_start:
        raise RestoreError(f"restore plan of {plan.decision_id}: no checkpoint survives; start "
                           "from the beginning")
    if plan.layout != "shards":
        raise RestoreError(f"restore plan of {plan.decision_id}: layout {plan.layout!r}: load it "
                           "with "
                           f"torch.distributed.checkpoint.load(..., checkpoint_id={plan.uri!r})")
    source = plan.source_for(rank)
    if source is None:
        raise RestoreError(f"restore plan of {plan.decision_id}: no source for rank {rank}")
    import io

    import torch

    return torch.load(io.BytesIO(read_source(source, storage_options)), weights_only=True)


class RestoreHook:
    """A decision hook: for a failover, make the restore plan and hand it over (to `handoff` and/or
    `plan_file`). Escalations and drains restore nothing. Constructible from hook configuration:
    `RestoreHook(tiers=["local@node-0=/x", {"kind": "durable", "url": "s3://b/j"}],
    plan_file="plan.json")`."""

    def __init__(
        self,
        catalog: CheckpointCatalog | None = None,
        *,
        tiers: Iterable[str | Mapping[str, Any] | Tier] | None = None,
        plan_file: str | None = None,
        handoff: Callable[[RestorePlan], None] | None = None,
        world_size: int | None = None,
        name: str = "restore",
    ) -> None:
        if catalog is None:
            if tiers is None:
                raise RestoreError("restore hook: give a checkpoint catalog or its tiers")
            parsed: list[Tier] = []
            for item in tiers:
                if isinstance(item, Tier):
                    parsed.append(item)
                elif isinstance(item, str):
                    parsed.append(parse_tier_spec(item))
                else:
                    parsed.extend(tiers_from_config([item], source="restore hook"))
            catalog = CheckpointCatalog(parsed)
        if plan_file is None and handoff is None:
            raise RestoreError("restore hook: give a plan_file or a handoff callable (where the "
                               "plan goes)")
        self.catalog = catalog
        self.plan_file = plan_file
        self.handoff = handoff
        self.world_size = world_size
        self.name = name
        self.last_plan: RestorePlan | None = None

    def deliver(self, decision: Decision, document: str) -> None:
        plan = plan_restore(decision, self.catalog, world_size=self.world_size)
        if plan is None:
            return
        if self.plan_file:
            write_plan(plan, self.plan_file)
        if self.handoff is not None:
            self.handoff(plan)
        self.last_plan = plan
