"""The catalog's records: one checkpoint directory in one tier (CheckpointEntry: its layout,
completeness and checksum status) and a restore choice with the source of every rank (RestoreChoice,
RankSource)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from faultlens.attribution.decision import Restore
from faultlens.controller.checkpoints.manifest import ShardFile
from faultlens.controller.checkpoints.tiers import Tier, TierKind


class Layout(StrEnum):
    SHARDS = "shards"
    DCP = "dcp"
    UNKNOWN = "unknown"


class ChecksumStatus(StrEnum):
    VERIFIED = "verified"  # every file's sha256 matches the manifest
    MISMATCH = "mismatch"  # a file differs from the manifest: never restored
    UNVERIFIED = "unverified"  # not checked yet, or the layout has no checksums (plain DCP)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint directory in one tier."""

    tier: Tier
    step: int
    path: str  # inside the tier's filesystem
    uri: str
    layout: Layout
    complete: bool
    world_size: int | None
    ranks: frozenset[int] | None  # the ranks it holds; None: any rank (a DCP checkpoint reshards)
    # with checksums (from the manifest); empty for a plain DCP directory
    files: tuple[ShardFile, ...]
    bytes: int
    created_at: dt.datetime | None
    checksum_status: ChecksumStatus
    problem: str | None = None

    def covers(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def file_for(self, rank: int) -> ShardFile | None:
        return next((f for f in self.files if f.rank == rank), None)


@dataclass(frozen=True)
class RankSource:
    rank: int
    uri: str  # the shard file, or the DCP directory
    tier: TierKind
    node: str | None
    layout: Layout


@dataclass(frozen=True)
class RestoreChoice:
    step: int
    layout: Layout
    tiers: tuple[TierKind, ...]  # the tier kinds used, fastest first
    uri: str | None  # the checkpoint directory when one directory serves every rank
    world_size: int | None
    sources: tuple[RankSource, ...]
    entries: tuple[CheckpointEntry, ...]

    @property
    def tier(self) -> str:
        return "+".join(kind.value for kind in self.tiers)

    def to_restore(self) -> Restore:
        return Restore(tier=self.tier, step=self.step, uri=self.uri)

