"""The parallel layout of one attempt as the straggler analysis needs it: for every rank its
data-parallel replica, its pipeline stage, its peer key (the coordinates it shares with its
counterparts in the other replicas: stage, tensor, context and expert rank) and its node.

Coordinates come from the ranks table (dp_rank, pp_rank, tp_rank, cp_rank, ep_rank) where the
training code declares them. Without a dp_rank, the replicas of a stage are numbered in rank order
(Megatron's order); without any coordinate every rank is its own replica of a single stage (plain
data parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.reading.telemetry import Placement

COORDS = ("dp_rank", "pp_rank", "tp_rank", "cp_rank", "ep_rank")


@dataclass(frozen=True)
class Layout:
    """Ranks in column order with their coordinates (arrays aligned with `ranks`)."""

    ranks: np.ndarray  # int64 global ranks, sorted
    replica: np.ndarray  # int64 data-parallel replica index, 0..D-1
    stage: np.ndarray  # int64 pipeline stage index, 0..P-1
    peer_key: np.ndarray  # int64 id of (stage, tp, cp, ep): the same place in every replica
    nodes: tuple[str | None, ...]
    declared: tuple[str, ...]  # which coordinates the ranks table declared

    @property
    def replicas(self) -> int:
        return int(self.replica.max()) + 1 if len(self.replica) else 0

    @property
    def stages(self) -> int:
        return int(self.stage.max()) + 1 if len(self.stage) else 0

    @property
    def stages_declared(self) -> bool:
        return "pp_rank" in self.declared

    def describe(self) -> str:
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''} x {self.stages} stage" \
               f"{'s' if self.stages != 1 else ''}"

    def columns(self, mask: np.ndarray) -> list[int]:
        return [int(r) for r in self.ranks[mask]]


def _latest(ranks: pd.DataFrame, attempt: int | None) -> pd.DataFrame:
    if ranks.empty or "rank" not in ranks.columns:
        return ranks.iloc[0:0]
    rows = ranks[ranks["rank"].notna()]
    if attempt is not None and "attempt" in rows.columns:
        same = rows[rows["attempt"] == attempt]
        rows = same if not same.empty else rows
    if "ts" in rows.columns and rows["ts"].notna().any():
        rows = rows.sort_values("ts", kind="stable")
    return rows.drop_duplicates("rank", keep="last").set_index("rank")


def build_layout(rank_ids: list[int], ranks_table: pd.DataFrame, attempt: int | None,
                 placement: dict[int, Placement]) -> Layout:
    """The layout of `rank_ids` (the ranks that have steps) from the ranks table of `attempt`."""
    ranks = np.asarray(sorted(int(r) for r in rank_ids), dtype=np.int64)
    table = _latest(ranks_table, attempt)
    coords: dict[str, np.ndarray] = {}
    declared = []
    for name in COORDS:
        if name in table.columns:
            values = pd.to_numeric(table[name], errors="coerce").reindex(ranks)
            if values.notna().all() and len(values):
                coords[name] = values.to_numpy(dtype=np.int64)
                declared.append(name)
    n = len(ranks)
    stage_raw = coords.get("pp_rank", np.zeros(n, dtype=np.int64))
    stage = _dense(stage_raw)
    extra = [coords.get(c, np.zeros(n, dtype=np.int64)) for c in ("tp_rank", "cp_rank", "ep_rank")]
    peer_tuple = np.stack([stage, *extra], axis=1) if n else np.zeros((0, 4), dtype=np.int64)
    _, peer_key = (
        np.unique(peer_tuple, axis=0, return_inverse=True)
        if n
        else (None, np.zeros(0, dtype=np.int64))
    )
    peer_key = np.asarray(peer_key, dtype=np.int64).reshape(-1)
    if "dp_rank" in coords:
        replica = _dense(coords["dp_rank"])
    elif "pp_rank" in coords:
        # replicas of a stage in rank order: the k-th rank of every peer group is replica k
        replica = np.zeros(n, dtype=np.int64)
        for key in np.unique(peer_key):
            members = np.flatnonzero(peer_key == key)
            replica[members] = np.arange(len(members))
    else:
        replica = np.arange(n, dtype=np.int64)  # plain data parallel: every rank a replica
        peer_key = np.zeros(n, dtype=np.int64)
    nodes = tuple(placement[int(r)].node if int(r) in placement else None for r in ranks)
    return Layout(ranks, replica, stage, peer_key, nodes, tuple(declared))


def _dense(values: np.ndarray) -> np.ndarray:
    """Coordinate values as 0..k-1 in sorted order."""
    _, inverse = np.unique(values, return_inverse=True)
    return np.asarray(inverse, dtype=np.int64).reshape(-1)
