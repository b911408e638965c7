"""Checkpoint tiers: where checkpoints live (docs/design.md "Restore choice").

local   node NVMe, one tier per node: gone when that node is excluded;
peer    a replica held on another node: gone when the node holding it is excluded;
durable object store or shared filesystem (any fsspec URL, s3:// included): survives any exclusion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import fsspec
from pydantic import Field

from faultlens.attribution.rulefile import RuleFileError, load_rule_document
from faultlens.collectors.rule_model import FileModel, FormatVersion1, Text
from faultlens.errors import FaultlensError


class TierKind(StrEnum):
    LOCAL = "local"
    PEER = "peer"
    DURABLE = "durable"
    UNKNOWN = "unknown"


# restore preference: the fastest tier first
TIER_ORDER: tuple[TierKind, ...] = (TierKind.LOCAL, TierKind.PEER, TierKind.DURABLE)


class TierError(ValueError, FaultlensError):
    """A tier specification is invalid: the message names the spec and what was expected."""


@dataclass(frozen=True)
class Tier:
    kind: TierKind
    url: str
    node: str | None = None  # the node the storage is on (local, peer); None for durable
    storage_options: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.kind in (TierKind.LOCAL, TierKind.PEER) and not self.node:
            raise TierError(f"tier {self.kind.value}={self.url}: a {self.kind.value} tier needs "
                            "the node it is on "
                            f"(KIND@NODE=URL)")

    @property
    def name(self) -> str:
        return f"{self.kind.value}@{self.node}" if self.node else self.kind.value

    def survives(self, exclude_nodes: Iterable[str]) -> bool:
        """A local or peer tier on an excluded node is gone; a durable tier always survives."""
        return self.node is None or self.node not in set(exclude_nodes)

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.url, **dict(self.storage_options))
        return fs, root.rstrip("/") or "/"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "url": self.url, "node": self.node}


def parse_tier_spec(spec: str, storage_options: Mapping[str, Any] | None = None) -> Tier:
    """`KIND[@NODE]=URL`, e.g. `local@node-0=/nvme/ckpt`, `peer@node-1=/nvme/peer/node-0`,
    `durable=s3://b/job`.
    """
    head, sep, url = spec.partition("=")
    if not sep or not url:
        raise TierError(f"tier {spec!r}: expected KIND[@NODE]=URL (KIND one of local, peer, "
                        "durable)")
    kind_text, _, node = head.partition("@")
    try:
        kind = TierKind(kind_text.strip())
    except ValueError:
        raise TierError(
            f"tier {spec!r}: kind {kind_text!r}: expected local, peer or durable"
        ) from None
    if kind is TierKind.UNKNOWN:
        raise TierError(f"tier {spec!r}: kind: expected local, peer or durable")
    return Tier(
        kind, url.strip(), node.strip() or None, tuple(sorted((storage_options or {}).items()))
    )


class _TierItem(FileModel):
    kind: Literal["local", "peer", "durable"]
    url: Text
    node: Text | None = None
    storage_options: dict[str, Any] | None = None


class TiersFile(FileModel):
    """A tiers file: `format_version: 1` and `tiers: [{kind, url, node?, storage_options?}]`."""

    format_version: FormatVersion1
    tiers: Annotated[list[_TierItem], Field(min_length=1)]


def tiers_from_config(items: Iterable[Mapping[str, Any]], source: str = "tiers") -> list[Tier]:
    tiers = []
    for index, item in enumerate(items):
        try:
            tiers.append(Tier(TierKind(item["kind"]), item["url"], item.get("node"),
                              tuple(sorted(dict(item.get("storage_options") or {}).items()))))
        except (TierError, KeyError, ValueError) as exc:
            raise TierError(f"{source}: tiers[{index}]: {exc}") from None
    return tiers


def load_tiers(path: str | Path) -> list[Tier]:
    """A YAML file: `format_version: 1` and `tiers: [{kind, url, node?, storage_options?}]`."""
    try:
        document = load_rule_document(path, TiersFile)
    except RuleFileError as exc:
        raise TierError(str(exc)) from None
    return tiers_from_config(document["tiers"], source=str(path))


def parse_tiers(specs: Iterable[str]) -> list[Tier]:
    """CLI form: one YAML file, or specs KIND[@NODE]=URL."""
    specs = list(specs)
    if len(specs) == 1 and specs[0].endswith((".yaml", ".yml")) and "=" not in specs[0]:
        return load_tiers(specs[0])
    return [parse_tier_spec(spec) for spec in specs]
