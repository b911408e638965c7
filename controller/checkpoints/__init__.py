"""Multi-tier checkpoints: tiers, the catalog and restore choice, and a tiered checkpointer for
training loops.
"""

from faultlens.controller.checkpoints.catalog import (
    CheckpointCatalog,
    CheckpointEntry,
    ChecksumStatus,
    Layout,
    RankSource,
    RestoreChoice,
)
from faultlens.controller.checkpoints.tiers import (
    Tier,
    TierError,
    TierKind,
    load_tiers,
    parse_tier_spec,
    parse_tiers,
)

__all__ = [
    "CheckpointCatalog",
    "CheckpointEntry",
    "ChecksumStatus",
    "Layout",
    "RankSource",
    "RestoreChoice",
    "Tier",
    "TierError",
    "TierKind",
    "load_tiers",
    "parse_tier_spec",
    "parse_tiers",
]
