"""The checkpoint catalog: every checkpoint in every tier, whether it is complete and verified, and
the restore choice of docs/design.md:

    the newest checkpoint that is complete, verified, present for every rank in tiers that survive
    the exclusion (a local or peer tier on an excluded node is gone), and older than the incident
    when the incident suggests corruption.

A local-tier path belongs to its node, whichever tier lists it: a checkpoint whose directory lies
under the root of an excluded node's local (or peer) tier is never read, even when a shared
filesystem would let another node read it (`owners`). Nodes excluded once stay excluded for the
catalog's life (`retire`), so a later restore never reads what an earlier failover took out of the
job.

Ranks may come from different tiers (a node's own ranks from its local tier, the excluded node's
ranks from their peer replica); the fastest tier is preferred per rank (local, then peer, then
durable). Checksums are verified lazily, only for the files a restore would read, newest step first,
and cached.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import fsspec

from faultlens.attribution.decision import Restore
from faultlens.attribution.policy import RestoreRequest
from faultlens.controller.checkpoints.directory import COMMIT_DIR, STEP_DIR_RE, inspect_checkpoint
from faultlens.controller.checkpoints.entry import (
    CheckpointEntry,
    ChecksumStatus,
    Layout,
    RankSource,
    RestoreChoice,
)
from faultlens.controller.checkpoints.fsutil import is_local
from faultlens.controller.checkpoints.manifest import ShardFile
from faultlens.controller.checkpoints.tiers import TIER_ORDER, Tier

__all__ = [
    "COMMIT_DIR",
    "STEP_DIR_RE",
    "CheckpointCatalog",
    "CheckpointEntry",
    "ChecksumStatus",
    "Layout",
    "RankSource",
    "RestoreChoice",
]

log = logging.getLogger(__name__)


class CheckpointCatalog:
    """Checkpoints over a set of tiers. Usable as the policy's RestoreChooser (call it with a
    RestoreRequest).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        job_id: str | None = None,
        cluster: str | None = None,
        use_torch: bool | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.tiers = list(tiers)
        self.job_id = job_id
        self.cluster = cluster
        self.use_torch = use_torch
        self.clock = clock
        self._verified: dict[tuple[str, int, str], bool] = {}
        self._lock = threading.Lock()
        self.retired: set[str] = set()  # nodes out of the job for good: their local tiers are gone
        # (filesystem key, root, node) of node-owned tiers
        self._roots: list[tuple[str, str, str]] | None = None

    # --- ownership
    # ---------------------------------------------------------------------------------------------

    def retire(self, nodes: Iterable[str]) -> None:
        """Nodes excluded from the job: no later restore reads their local or peer tiers."""
        self.retired.update(nodes)

    @staticmethod
    def _place(tier: Tier, path: str) -> tuple[str, str]:
        fs, _ = tier.filesystem()
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if is_local(fs):
            return "file", os.path.realpath(path)
        return protocol, path.rstrip("/")

    def _node_roots(self) -> list[tuple[str, str, str]]:
        if self._roots is None:
            roots = []
            for tier in self.tiers:
                if tier.node is None:
                    continue
                _, root = tier.filesystem()
                key, place = self._place(tier, root)
                roots.append((key, place, tier.node))
            self._roots = roots
        return self._roots

    def owners(self, entry: CheckpointEntry) -> frozenset[str]:
        """The nodes whose storage holds `entry`: its tier's node, and any node whose local or peer
        tier root contains the entry's directory (one path reached through two tiers on a shared
        filesystem)."""
        owners = {entry.tier.node} if entry.tier.node else set()
        key, place = self._place(entry.tier, entry.path)
        for root_key, root, node in self._node_roots():
            if root_key == key and (place == root or place.startswith(root.rstrip("/") + "/")):
                owners.add(node)
        return frozenset(owners)

    def survives(self, entry: CheckpointEntry, exclude_nodes: Iterable[str] = ()) -> bool:
        """Readable after excluding `exclude_nodes` (and every retired node)."""
        gone = set(exclude_nodes) | self.retired
        return not (self.owners(entry) & gone)

    # --- scanning
    # ----------------------------------------------------------------------------------------------

    def scan(self) -> list[CheckpointEntry]:
        """Every checkpoint directory of every tier, complete or not, newest step first."""
        entries = []
        for tier in self.tiers:
            entries.extend(self.scan_tier(tier))
        tier_rank = {kind: i for i, kind in enumerate(TIER_ORDER)}
        return sorted(
            entries,
            key=lambda e: (-e.step, tier_rank.get(e.tier.kind, 9), e.tier.node or "", e.uri),
        )

    def scan_tier(self, tier: Tier) -> list[CheckpointEntry]:
        fs, root = tier.filesystem()
        # object-store listings are cached per filesystem instance: list afresh
        fs.invalidate_cache(root)
        try:
            children = fs.ls(root, detail=True)
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("checkpoint tier %s (%s): cannot list: %s", tier.name, tier.url, exc)
            return []
        entries = []
        for child in children:
            if child.get("type") != "directory":
                continue
            name = posixpath.basename(child["name"].rstrip("/"))
            match = STEP_DIR_RE.match(name)
            if match:
                entries.append(
                    self.inspect(tier, fs, child["name"].rstrip("/"), int(match.group(1)))
                )
        return entries

    def inspect(
        self, tier: Tier, fs: fsspec.AbstractFileSystem, path: str, step: int
    ) -> CheckpointEntry:
        """Completeness of one checkpoint directory from its listing, its manifest and/or DCP
        metadata.
        """
        return inspect_checkpoint(
            tier, fs, path, step, use_torch=self.use_torch, cached_status=self._cached_status
        )

    # --- verification
    # ------------------------------------------------------------------------------------------

    def _cached_status(self, uri: str, files: Iterable[ShardFile]) -> ChecksumStatus:
        results = [self._verified.get((uri, f.bytes, f.path + f.sha256)) for f in files]
        if any(r is False for r in results):
            return ChecksumStatus.MISMATCH
        if results and all(results):
            return ChecksumStatus.VERIFIED
        return ChecksumStatus.UNVERIFIED

    def verify_file(self, entry: CheckpointEntry, shard: ShardFile) -> bool:
        """sha256 of one file against the manifest (cached per checkpoint, file and expected
        digest).
        """
        key = (entry.uri, shard.bytes, shard.path + shard.sha256)
        with self._lock:
            if key in self._verified:
                return self._verified[key]
        fs, _ = entry.tier.filesystem()
        import hashlib

        digest = hashlib.sha256()
        try:
            with fs.open(f"{entry.path}/{shard.path}", "rb") as handle:
                while chunk := handle.read(8 << 20):
                    digest.update(chunk)
            ok = digest.hexdigest() == shard.sha256
        except OSError as exc:
            log.warning("checkpoint %s: cannot read %s: %s", entry.uri, shard.path, exc)
            return False  # not cached: a transient read error is not a checksum mismatch
        if not ok:
            log.warning(
                "checkpoint %s: %s does not match its sha256 in the manifest", entry.uri, shard.path
            )
        with self._lock:
            self._verified[key] = ok
        return ok

    def verify(self, entry: CheckpointEntry) -> ChecksumStatus:
        """Verify every file of `entry` that has a checksum."""
        if not entry.complete:
            return ChecksumStatus.UNKNOWN
        if not entry.files:
            return ChecksumStatus.UNVERIFIED
        ok = all([self.verify_file(entry, shard) for shard in entry.files])
        return ChecksumStatus.VERIFIED if ok else ChecksumStatus.MISMATCH

    def _usable_for(self, entry: CheckpointEntry, rank: int | None) -> bool:
        """A complete entry whose files for `rank` (all files for DCP or rank None) verify."""
        if entry.layout is Layout.DCP or rank is None:
            return all([self.verify_file(entry, shard) for shard in entry.files])
        shard = entry.file_for(rank)
        return shard is not None and self.verify_file(entry, shard)

    # --- the restore choice
    # ------------------------------------------------------------------------------------

    def choose(
        self,
        exclude_nodes: Iterable[str] = (),
        *,
        before_ts: dt.datetime | None = None,
        before_step: int | None = None,
        world_size: int | None = None,
        step: int | None = None,
        entries: Sequence[CheckpointEntry] | None = None,
    ) -> RestoreChoice | None:
        """The restore per docs/design.md, or None when no checkpoint qualifies. `step` pins the
        step (used to rebuild the per-rank sources of a decision already made)."""
        exclude = set(exclude_nodes)
        entries = list(entries) if entries is not None else self.scan()
        usable = [e for e in entries if e.complete and self.survives(e, exclude)
                  and e.checksum_status is not ChecksumStatus.MISMATCH]
        if before_step is not None:
            usable = [e for e in usable if e.step < before_step]
        if before_ts is not None:
            # when corruption is suspected the checkpoint must provably predate the first signal
            usable = [e for e in usable if e.created_at is not None and e.created_at < before_ts]
        if step is not None:
            usable = [e for e in usable if e.step == step]
        tier_rank = {kind: i for i, kind in enumerate(TIER_ORDER)}
        for candidate_step in sorted({e.step for e in usable}, reverse=True):
            group = sorted((e for e in usable if e.step == candidate_step),
                           key=lambda e: (tier_rank.get(e.tier.kind, 9), e.tier.node or "", e.uri))
            choice = self._choose_step(candidate_step, group, world_size)
            if choice is not None:
                return choice
        return None

    def _choose_step(
        self, step: int, group: list[CheckpointEntry], world_size: int | None
    ) -> RestoreChoice | None:
        for entry in group:  # a complete DCP checkpoint serves every rank by itself
            if entry.layout is Layout.DCP and self._usable_for(entry, None):
                ranks = range(world_size) if world_size else ()
                sources = tuple(
                    RankSource(r, entry.uri, entry.tier.kind, entry.tier.node, Layout.DCP)
                    for r in ranks
                )
                return RestoreChoice(
                    step,
                    Layout.DCP,
                    (entry.tier.kind,),
                    entry.uri,
                    world_size or entry.world_size,
                    sources,
                    (entry,),
                )
        shards = [e for e in group if e.layout is Layout.SHARDS]
        sizes = {e.world_size for e in shards if e.world_size}
        world = world_size or (max(sizes) if sizes else None)
        if not world:
            return None
        shards = [e for e in shards if e.world_size == world]
        sources: list[RankSource] = []
        used: list[CheckpointEntry] = []
        for rank in range(world):
            entry = next((e for e in shards if e.covers(rank) and self._usable_for(e, rank)), None)
            if entry is None:
                return None
            shard = entry.file_for(rank)
            sources.append(
                RankSource(
                    rank,
                    f"{entry.uri}/{shard.path}",
                    entry.tier.kind,
                    entry.tier.node,
                    Layout.SHARDS,
                )
            )
            if entry not in used:
                used.append(entry)
        tier_rank = {kind: i for i, kind in enumerate(TIER_ORDER)}
        kinds = tuple(sorted({e.tier.kind for e in used}, key=lambda k: tier_rank.get(k, 9)))
        return RestoreChoice(
            step,
            Layout.SHARDS,
            kinds,
            used[0].uri if len(used) == 1 else None,
            world,
            tuple(sources),
            tuple(used),
        )

    def __call__(self, request: RestoreRequest) -> Restore | None:
        """The policy's RestoreChooser."""
        choice = self.choose(
            request.exclude_nodes, before_ts=request.before_ts, before_step=request.before_step
        )
        return None if choice is None else choice.to_restore()

    # --- checkpoints table
    # -------------------------------------------------------------------------------------

    def rows(self, entries: Sequence[CheckpointEntry] | None = None) -> list[dict[str, Any]]:
        """checkpoints-table rows, one per checkpoint directory and tier."""
        now = self.clock()
        entries = entries if entries is not None else self.scan()
        return [{
            "ts": entry.created_at or now,
            "cluster": self.cluster,
            "node": entry.tier.node,
            "job_id": self.job_id,
            "tier": entry.tier.kind.value,
            "step": entry.step,
            "uri": entry.uri,
            "layout": entry.layout.value,
            "world_size": entry.world_size,
            "complete": entry.complete,
            "bytes": entry.bytes,
            "checksum_status": self.status_of(entry).value,
        } for entry in entries]

    def status_of(self, entry: CheckpointEntry) -> ChecksumStatus:
        """The entry's checksum status including verifications done since it was scanned."""
        if not entry.complete:
            return ChecksumStatus.UNKNOWN
        return self._cached_status(entry.uri, entry.files) if entry.files else entry.checksum_status

    def record(self, sink: Any, entries: Sequence[CheckpointEntry] | None = None) -> int:
        """Write the catalog into a SegmentSink's checkpoints table; returns the row count."""
        rows = self.rows(entries)
        if rows:
            sink.write("checkpoints", rows)
        return len(rows)
