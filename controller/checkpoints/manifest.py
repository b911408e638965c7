"""The per-rank shard layout's commit manifest (`manifest.json`, "faultlens.shards/1").

A checkpoint directory holds one file per rank (any names) and, written last and atomically,
`manifest.json` listing every file with its rank, size and sha256. Without the manifest the
directory is not a checkpoint (incomplete). The same manifest can sit beside a
torch.distributed.checkpoint directory (layout "dcp") to add checksums to it. A manifest may cover a
subset of the ranks (a node-local tier holds its node's ranks only).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, ValidationError

from faultlens.collectors.rule_loader import describe, key_path
from faultlens.collectors.rule_model import FileModel, NonNegativeInt
from faultlens.errors import FaultlensError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "faultlens.shards/1"


class ManifestError(ValueError, FaultlensError):
    """A manifest is unreadable or does not fit the format: the message names the file and the key.
    """


@dataclass(frozen=True)
class ShardFile:
    rank: int | None
    path: str  # relative to the checkpoint directory
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: tuple[ShardFile, ...]
    created_at: dt.datetime | None = None
    layout: str = "shards"
    node: str | None = None
    job_id: str | None = None

    @property
    def ranks(self) -> frozenset[int]:
        return frozenset(f.rank for f in self.files if f.rank is not None)

    def to_json(self) -> bytes:
        document = {
            "format": MANIFEST_FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "layout": self.layout,
            "created_at": (self.created_at or dt.datetime.now(dt.UTC))
            .astimezone(dt.UTC)
            .isoformat(),
            "node": self.node,
            "job_id": self.job_id,
            "files": [
                {"rank": f.rank, "path": f.path, "bytes": f.bytes, "sha256": f.sha256}
                for f in self.files
            ],
        }
        return json.dumps(document, indent=1, sort_keys=True).encode()


class _Open(FileModel):
    # a later writer may add keys
    model_config = ConfigDict(extra="ignore", regex_engine="python-re")


class _File(_Open):
    rank: NonNegativeInt | None = None
    # relative, no parent references: a hostile manifest cannot point outside its directory
    path: Annotated[str, Field(pattern=r"^(?!/)(?!.*(^|/)\.\.(/|$))[^\\\x00]+$")]
    bytes: NonNegativeInt
    sha256: Annotated[str, Field(pattern="^[0-9a-f]{64}$")]


class ManifestDocument(_Open):
    """manifest.json, "faultlens.shards/1"."""

    format: Literal["faultlens.shards/1"]
    step: NonNegativeInt
    world_size: Annotated[int, Field(ge=1)]
    layout: Literal["shards", "dcp"] = "shards"
    created_at: str | None = None
    node: str | None = None
    job_id: str | None = None
    files: Annotated[list[_File], Field(min_length=1)]


def parse_manifest(data: bytes, source: str) -> Manifest:
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{source}: not JSON: {exc}") from None
    try:
        ManifestDocument.model_validate(document)
    except ValidationError as exc:
        parts, expectation = describe(exc, document)
        raise ManifestError(f"{source}: {key_path(parts)}: {expectation}") from None
    ranks = [f.get("rank") for f in document["files"] if f.get("rank") is not None]
    if any(rank >= document["world_size"] for rank in ranks):
        raise ManifestError(f"{source}: files: a rank is >= world_size {document['world_size']}")
    created = document.get("created_at")
    try:
        created_at = dt.datetime.fromisoformat(created) if created else None
    except ValueError:
        raise ManifestError(
            f"{source}: created_at: expected an ISO 8601 time, got {created!r}"
        ) from None
    if created_at is not None and created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=dt.UTC)
    return Manifest(
        step=document["step"],
        world_size=document["world_size"],
        files=tuple(
            ShardFile(f.get("rank"), f["path"], f["bytes"], f["sha256"]) for f in document["files"]
        ),
        created_at=created_at,
        layout=document.get("layout", "shards"),
        node=document.get("node"),
        job_id=document.get("job_id"),
    )


def sha256_of(chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def shard_entries(files: Mapping[int | None, tuple[str, bytes]]) -> tuple[ShardFile, ...]:
    """ShardFile entries for in-memory contents: rank -> (relative path, data)."""
    return tuple(ShardFile(rank, path, len(data), hashlib.sha256(data).hexdigest())
                 for rank, (path, data) in files.items())
