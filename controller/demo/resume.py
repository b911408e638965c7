"""Resuming without a supervisor (FAULTLENS_RESUME_LATEST=1): what a typical training script does
under plain `torchrun --max-restarts N`. Each rank lists the checkpoints it can read (its own node's
local tier and the durable tier), keeps the complete ones that hold its shard, and the ranks agree
on the newest step every rank can load whose files match their checksums. No restore plan, no
exclusion: the restart runs on the same nodes.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from faultlens import environment
from faultlens.controller.checkpoints.catalog import (
    CheckpointCatalog,
    CheckpointEntry,
    ChecksumStatus,
)
from faultlens.controller.checkpoints.manifest import ShardFile
from faultlens.controller.checkpoints.tiers import Tier, TierKind
from faultlens.controller.restore import read_source

ENV_RESUME_LATEST = environment.RESUME_LATEST.name


@dataclass(frozen=True)
class RankCheckpoint:
    """One step this rank can restore from: the fastest tier holding its shard."""

    step: int
    entry: CheckpointEntry
    shard: ShardFile

    @property
    def uri(self) -> str:
        return f"{self.entry.uri}/{self.shard.path}"


def rank_tiers(local: str | None, durable: str | None, node: str | None) -> list[Tier]:
    """The tiers one rank can read by itself: its node's local tier and the durable tier."""
    tiers = []
    if local:
        tiers.append(Tier(TierKind.LOCAL, local, node=node or "node"))
    if durable:
        tiers.append(Tier(TierKind.DURABLE, durable))
    return tiers


def loadable(catalog: CheckpointCatalog, rank: int) -> dict[int, RankCheckpoint]:
    """step -> where this rank reads it, for every complete checkpoint holding this rank's shard
    (local tier before durable for the same step); checksums are not read here."""
    found: dict[int, RankCheckpoint] = {}
    for entry in catalog.scan():  # newest step first, fastest tier first
        if (
            not entry.complete
            or entry.checksum_status is ChecksumStatus.MISMATCH
            or entry.step in found
        ):
            continue
        shard = entry.file_for(rank)
        if shard is not None:
            found[entry.step] = RankCheckpoint(entry.step, entry, shard)
    return found


def agree_on_step(own: dict[int, RankCheckpoint], all_steps: Sequence[Sequence[int]],
                  all_verified: Callable[[bool], bool], verify: Callable[[RankCheckpoint], bool]
                  ) -> RankCheckpoint | None:
    """The newest step present for every rank (`all_steps`: each rank's loadable steps) whose files
    verify on every rank (`all_verified(own_ok)` is True when every rank's own_ok is); None: start
    from scratch. Every rank must call this with the same `all_steps`, since `all_verified` is a
    collective."""
    common = set(all_steps[0]) if all_steps else set()
    for steps in all_steps[1:]:
        common &= set(steps)
    for step in sorted(common, reverse=True):
        if all_verified(verify(own[step])):
            return own[step]
    return None


def resume_latest(catalog: CheckpointCatalog, rank: int) -> tuple[int | None, Any]:
    """In a running process group: (step, this rank's state) of the newest checkpoint every rank can
    load, or (None, None) when there is none."""
    import torch
    import torch.distributed as dist

    own = loadable(catalog, rank)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(own))

    def all_verified(ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    chosen = agree_on_step(
        own, gathered, all_verified, lambda c: catalog.verify_file(c.entry, c.shard)
    )
    if chosen is None:
        return None, None
    return chosen.step, torch.load(io.BytesIO(read_source(chosen.uri)), weights_only=True)
