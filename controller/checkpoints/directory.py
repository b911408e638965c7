"""One checkpoint directory: the names of step directories (STEP_DIR_RE, COMMIT_DIR) and its
completeness from its listing, its manifest and/or DCP metadata (inspect_checkpoint)."""

from __future__ import annotations

import datetime as dt
import posixpath
import re
from collections.abc import Callable, Iterable
from typing import Any

import fsspec

from faultlens.controller.checkpoints.dcp import METADATA_NAME, inspect_dcp
from faultlens.controller.checkpoints.entry import CheckpointEntry, ChecksumStatus, Layout
from faultlens.controller.checkpoints.fsutil import uri_of
from faultlens.controller.checkpoints.manifest import (
    MANIFEST_NAME,
    ManifestError,
    ShardFile,
    parse_manifest,
)
from faultlens.controller.checkpoints.tiers import Tier

STEP_DIR_RE = re.compile(r"^(?:step|global_step|checkpoint|ckpt)[-_]?(\d+)$")
COMMIT_DIR = "_commit"


def _utc(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    if isinstance(value, str):
        try:
            return _utc(dt.datetime.fromisoformat(value))
        except ValueError:
            return None
    return None


def _mtime(info: dict[str, Any]) -> dt.datetime | None:
    for key in ("mtime", "LastModified", "last_modified", "created"):
        if key in info:
            return _utc(info[key])
    return None


def inspect_checkpoint(
    tier: Tier,
    fs: fsspec.AbstractFileSystem,
    path: str,
    step: int,
    *,
    use_torch: bool | None,
    cached_status: Callable[[str, Iterable[ShardFile]], ChecksumStatus],
) -> CheckpointEntry:
    """Completeness of one checkpoint directory from its listing, its manifest and/or DCP metadata;
    `cached_status` gives the checksum status already known for a manifest's files."""
    uri = uri_of(fs, path)
    try:
        found = fs.find(path, detail=True)
    except OSError as exc:
        return _incomplete(tier, step, path, uri, Layout.UNKNOWN, f"cannot list: {exc}")
    listing: dict[str, int] = {}
    infos: dict[str, dict[str, Any]] = {}
    prefix = path.rstrip("/") + "/"
    for full, info in found.items():
        relative = full[len(prefix):] if full.startswith(prefix) else posixpath.basename(full)
        if relative.startswith(COMMIT_DIR + "/") or posixpath.basename(relative).startswith(
            ".tmp-"
        ):
            continue
        listing[relative] = int(info.get("size") or 0)
        infos[relative] = info
    has_dcp_data = any(name.endswith(".distcp") for name in listing)
    layout = Layout.DCP if METADATA_NAME in listing or has_dcp_data else Layout.SHARDS

    if MANIFEST_NAME in listing:
        try:
            manifest = parse_manifest(
                fs.cat_file(f"{prefix}{MANIFEST_NAME}"), f"{uri}/{MANIFEST_NAME}"
            )
        except (ManifestError, OSError) as exc:
            return _incomplete(tier, step, path, uri, layout, str(exc))
        layout = Layout(manifest.layout)
        created = manifest.created_at or _mtime(infos[MANIFEST_NAME])
        total = sum(f.bytes for f in manifest.files)
        for entry in manifest.files:
            if entry.path not in listing:
                return _incomplete(tier, step, path, uri, layout, f"{entry.path} (rank "
                                                                  f"{entry.rank}) "
                                   "missing", manifest.world_size, created, total)
            if listing[entry.path] != entry.bytes:
                return _incomplete(tier, step, path, uri, layout,
                                   f"{entry.path}: {listing[entry.path]} bytes, manifest says "
                                   f"{entry.bytes}", manifest.world_size, created, total)
        ranks: frozenset[int] | None = manifest.ranks
        if layout is Layout.DCP:
            inspection = inspect_dcp(
                listing, _cat(fs, prefix + METADATA_NAME, listing), uri, use_torch
            )
            if not inspection.complete:
                return _incomplete(tier, step, path, uri, layout, inspection.problem,
                                   manifest.world_size, created, total)
            ranks = None
        if manifest.step != step:
            return _incomplete(tier, step, path, uri, layout,
                               f"manifest step {manifest.step} != directory step {step}",
                               manifest.world_size, created, total)
        status = cached_status(uri, manifest.files)
        return CheckpointEntry(tier, step, path, uri, layout, True, manifest.world_size, ranks,
                               manifest.files, total, created, status)

    if layout is Layout.DCP:
        inspection = inspect_dcp(listing, _cat(fs, prefix + METADATA_NAME, listing), uri, use_torch)
        total = sum(listing.values())
        created = _mtime(infos[METADATA_NAME]) if METADATA_NAME in infos else None
        world = len(inspection.writer_ranks) or None
        if not inspection.complete:
            return _incomplete(
                tier, step, path, uri, layout, inspection.problem, world, created, total
            )
        return CheckpointEntry(
            tier,
            step,
            path,
            uri,
            Layout.DCP,
            True,
            world,
            None,
            (),
            total,
            created,
            ChecksumStatus.UNVERIFIED,
        )
    return _incomplete(tier, step, path, uri, Layout.SHARDS, f"no {MANIFEST_NAME} (not committed)",
                       None, None, sum(listing.values()))


def _cat(fs: fsspec.AbstractFileSystem, path: str, listing: dict[str, int]) -> bytes | None:
    if posixpath.basename(path) not in listing:
        return None
    try:
        return fs.cat_file(path)
    except OSError:
        return None


def _incomplete(tier: Tier, step: int, path: str, uri: str, layout: Layout, problem: str | None,
                world_size: int | None = None, created: dt.datetime | None = None,
                total: int = 0) -> CheckpointEntry:
    return CheckpointEntry(
        tier,
        step,
        path,
        uri,
        layout,
        False,
        world_size,
        frozenset(),
        (),
        total,
        created,
        ChecksumStatus.UNKNOWN,
        problem,
    )
