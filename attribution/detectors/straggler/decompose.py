"""Per-step decomposition of per-rank compute time over the parallel coordinates: a stage effect, a
replica effect and a worker effect.

- Stage effect: each stage's level (the median of its replicas' units with 3 or more replicas, the
  faster of two, the one otherwise) against the median of the other stages' levels. Stages are
  always compared with each other.
- Worker effect: a rank against the same place (stage, tp/cp/ep rank) in the other replicas: with 3
  or more replicas a robust z-score and ratio to the peers' median; with 2 a pairwise ratio (no
  z-score over two peers); with 1 only against its own history (median and MAD of its earlier
  steps).
- Replica effect: a replica whose stages are slow against the same stages of the other replicas (at
  least replica_min_fraction of them, 2 at least). A worker inside a slow replica is flagged only
  for slowness beyond its replica's.
A single compute section can carry the slowness while the total hides it (DDP overlaps the
all-reduce with backward): a rank is flagged too when one section's excess over its peers' is
material.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.straggler.layout import Layout
from faultlens.attribution.rules import StragglerThresholds

MAD_SCALE = 1.4826


def nanmedian(values: np.ndarray, axis: int) -> np.ndarray:
    """np.nanmedian, with numpy's fast median when there is no NaN (nanmedian goes through masked
    arrays).
    """
    if values.size and not np.isnan(values).any():
        return np.median(values, axis=axis)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, axis=axis)


def group_median(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the median of each group of columns: (steps x groups) and the sorted group ids.
    Groups of equal size go through one median call."""
    ids, counts = np.unique(groups, return_counts=True)
    if len(ids) and (counts == counts[0]).all():
        order = np.argsort(groups, kind="stable").reshape(len(ids), counts[0])
        return nanmedian(values[:, order], axis=2), ids
    return np.column_stack([nanmedian(values[:, groups == g], axis=1) for g in ids]), ids


def rolling_sum(values: np.ndarray, window: int) -> np.ndarray:
    """Sum over the last `window` rows (fewer at the start), column-wise; NaN counts as 0."""
    data = np.nan_to_num(np.asarray(values, dtype=float), nan=0.0)
    total = np.cumsum(data, axis=0)
    out = total.copy()
    if len(data) > window:
        out[window:] = total[window:] - total[:-window]
    return out


def robust_z(values: np.ndarray, floor_frac: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise robust z-scores: (x - median) / (1.4826 * MAD), MAD floored at floor_frac x median.
    Returns (z, median, scale) with NaN where a row has no values."""
    median = nanmedian(values, axis=1)
    mad = nanmedian(np.abs(values - median[:, None]), axis=1)
    scale = MAD_SCALE * np.maximum(mad, floor_frac * np.abs(median))
    scale = np.where(scale > 0, scale, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (values - median[:, None]) / scale[:, None]
    return z, median, scale


@dataclass(frozen=True)
class Decomposition:
    """Aligned with (steps x ranks) or (steps x stages / replicas) of one attempt."""

    # steps x ranks: the same place in the other replicas (NaN with one replica)
    peer_ref: np.ndarray
    # steps x ranks: compute / peer_ref (or / own history with one replica)
    worker_ratio: np.ndarray
    worker_flag: np.ndarray  # steps x ranks bool
    stage_level: np.ndarray  # steps x P
    stage_ratio: np.ndarray  # steps x P
    stage_flag: np.ndarray  # steps x P bool
    replica_ratio: np.ndarray  # steps x D: median over stages of the replica's ratio to its peers
    replica_flag: np.ndarray  # steps x D bool
    section_refs: dict[str, np.ndarray]  # section -> steps x ranks peer reference of that section
    comparison: str  # how workers were compared


def _own_history(
    block: np.ndarray, t: StragglerThresholds
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each column against the median of its own previous steps: (reference, ratio, slow)."""
    frame = pd.DataFrame(block)
    shifted = frame.shift(1)
    history = shifted.rolling(t.self_baseline_steps, min_periods=t.min_window_steps)
    median = history.median()
    mad = (
        (shifted - median)
        .abs()
        .rolling(t.self_baseline_steps, min_periods=t.min_window_steps)
        .median()
    )
    median_v, mad_v = median.to_numpy(), mad.to_numpy()
    scale = MAD_SCALE * np.maximum(mad_v, t.mad_floor_frac * np.abs(median_v))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = block / median_v
        z = (block - median_v) / scale
    return median_v, ratio, (z >= t.peer_z) & (ratio >= t.min_ratio)


def own_baseline(block: np.ndarray, t: StragglerThresholds) -> np.ndarray:
    """The reference of each column's own history, frozen at the first step it was flagged slow (a
    slowdown that lasts must not become its own baseline)."""
    reference, _, slow = _own_history(block, t)
    frozen = reference.copy()
    for column in range(block.shape[1]):
        hits = np.flatnonzero(slow[:, column])
        if len(hits):
            frozen[hits[0]:, column] = reference[hits[0], column]
    return frozen


def decompose(compute: np.ndarray, sections: dict[str, np.ndarray], layout: Layout,
              t: StragglerThresholds) -> Decomposition:
    D, P = layout.replicas, layout.stages
    peer_ref, worker_flag, section_refs = _peer_effect(compute, sections, layout, t)
    if D >= 2:
        with np.errstate(invalid="ignore", divide="ignore"):
            worker_ratio = compute / peer_ref
        comparison = ("the same stage in the other replicas" if P > 1 else "the other replicas") + (
            " (pairwise, 2 replicas)" if D == 2 else f" (median of {D})")
    else:
        # one replica: each rank against its own history only
        peer_ref = own_baseline(compute, t)
        _, worker_ratio, own_slow = _own_history(compute, t)
        with np.errstate(invalid="ignore", divide="ignore"):
            worker_ratio = compute / peer_ref
        worker_flag = np.nan_to_num(own_slow.astype(float), nan=0.0).astype(bool)
        for name, values in sections.items():
            section_refs[name] = own_baseline(values, t)
        comparison = "its own earlier median (1 replica)"
    units, unit_ratio = _unit_times(compute, worker_ratio, layout)
    stage_level, stage_ratio, stage_flag = _stage_effect(units, D, P, t)
    replica_ratio, replica_flag, worker_flag = _replica_effect(
        unit_ratio, worker_ratio, worker_flag, layout, t
    )
    return Decomposition(
        peer_ref,
        worker_ratio,
        worker_flag,
        stage_level,
        stage_ratio,
        stage_flag,
        replica_ratio,
        replica_flag,
        section_refs,
        comparison,
    )


def _peer_effect(
    compute: np.ndarray, sections: dict[str, np.ndarray], layout: Layout, t: StragglerThresholds
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Worker effect against the same place in the other replicas: the reference, the slow flags and
    each section's reference (all NaN / False with one replica)."""
    D = layout.replicas
    peer_ref = np.full_like(compute, np.nan)
    worker_flag = np.zeros_like(compute, dtype=bool)
    section_refs = {name: np.full_like(compute, np.nan) for name in sections}
    ids, counts = np.unique(layout.peer_key, return_counts=True)
    if D >= 2 and len(ids) and (counts == counts[0]).all() and counts[0] >= 3:
        # every place has the same number of replicas: all peer groups at once, (steps x groups x
        # replicas)
        order = np.argsort(layout.peer_key, kind="stable").reshape(len(ids), counts[0])
        block = compute[:, order]
        median = nanmedian(block, axis=2)[:, :, None]
        mad = nanmedian(np.abs(block - median), axis=2)[:, :, None]
        scale = MAD_SCALE * np.maximum(mad, t.mad_floor_frac * np.abs(median))
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (block - median) / np.where(scale > 0, scale, np.nan)
            ref = np.broadcast_to(median, block.shape)
            slow = (z >= t.peer_z) & (block / ref >= t.min_ratio)
            for name, values in sections.items():
                part = values[:, order]
                sref = np.broadcast_to(nanmedian(part, axis=2)[:, :, None], part.shape)
                section_refs[name][:, order] = sref
                slow |= (part - sref) >= (t.min_ratio - 1.0) * ref
        peer_ref[:, order] = ref
        worker_flag[:, order] = slow
    elif D >= 2:
        for key in ids:
            _peer_group(
                compute,
                sections,
                np.flatnonzero(layout.peer_key == key),
                t,
                peer_ref,
                worker_flag,
                section_refs,
            )
    return peer_ref, worker_flag, section_refs


def _peer_group(
    compute: np.ndarray,
    sections: dict[str, np.ndarray],
    cols: np.ndarray,
    t: StragglerThresholds,
    peer_ref: np.ndarray,
    worker_flag: np.ndarray,
    section_refs: dict[str, np.ndarray],
) -> None:
    """One place's replicas (uneven counts): a robust z over 3 or more, each against the other for a
    pair.
    """
    block = compute[:, cols]
    if len(cols) >= 3:
        z, median, _ = robust_z(block, t.mad_floor_frac)
        ref = np.broadcast_to(median[:, None], block.shape)
        with np.errstate(invalid="ignore"):
            slow = (z >= t.peer_z) & (block / ref >= t.min_ratio)
    elif len(cols) == 2:
        ref = block[:, ::-1]  # pairwise: each against the other
        with np.errstate(invalid="ignore", divide="ignore"):
            slow = block / ref >= t.min_ratio
    else:
        return
    peer_ref[:, cols] = ref
    for name, values in sections.items():
        part = values[:, cols]
        sref = np.broadcast_to(nanmedian(part, axis=1)[:, None], part.shape) if len(cols) >= 3 \
            else part[:, ::-1]
        section_refs[name][:, cols] = sref
        with np.errstate(invalid="ignore"):
            slow |= (part - sref) >= (t.min_ratio - 1.0) * ref
    slow = np.nan_to_num(slow.astype(float), nan=0.0).astype(bool)
    if len(cols) == 2:
        # each slower than the other in some part of the same step: the pair cannot say which one is
        # slow
        both = slow[:, 0] & slow[:, 1]
        slow[both] = False
    worker_flag[:, cols] = slow


def _unit_times(
    compute: np.ndarray, worker_ratio: np.ndarray, layout: Layout
) -> tuple[np.ndarray, np.ndarray]:
    """Unit times (replica, stage): the median of the unit's ranks, (steps x replicas x stages)."""
    steps, D, P = compute.shape[0], layout.replicas, layout.stages
    units = np.full((steps, D * P), np.nan)
    unit_ratio = np.full((steps, D * P), np.nan)
    unit_of = layout.replica * P + layout.stage
    medians, ids = group_median(compute, unit_of)
    units[:, ids] = medians
    medians, ids = group_median(worker_ratio, unit_of)
    unit_ratio[:, ids] = medians
    return units.reshape(steps, D, P), unit_ratio.reshape(steps, D, P)


def _stage_effect(units: np.ndarray, D: int, P: int, t: StragglerThresholds
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each stage's level against the other stages' (with 2 or more stages)."""
    steps = units.shape[0]
    stage_level = np.full((steps, P), np.nan)
    stage_ratio = np.full((steps, P), np.nan)
    stage_flag = np.zeros((steps, P), dtype=bool)
    if P >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            stage_level = nanmedian(units, axis=1) if D >= 3 else np.nanmin(units, axis=1)
        for p in range(P):
            others = nanmedian(np.delete(stage_level, p, axis=1), axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                stage_ratio[:, p] = stage_level[:, p] / others
        stage_flag = np.nan_to_num(stage_ratio, nan=0.0) >= t.stage_min_ratio
    return stage_level, stage_ratio, stage_flag


def _replica_effect(
    unit_ratio: np.ndarray,
    worker_ratio: np.ndarray,
    worker_flag: np.ndarray,
    layout: Layout,
    t: StragglerThresholds,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A replica slow in most of its stages; a worker inside one is flagged only for slowness beyond
    it.
    """
    steps, D, P = unit_ratio.shape[0], layout.replicas, layout.stages
    replica_ratio = np.full((steps, D), np.nan)
    replica_flag = np.zeros((steps, D), dtype=bool)
    if D >= 2 and P >= 2:
        replica_ratio = nanmedian(unit_ratio, axis=2)
        slow_units = np.nan_to_num(unit_ratio, nan=0.0) >= t.min_ratio
        fraction = slow_units.sum(axis=2) / max(P, 1)
        replica_flag = (fraction >= t.replica_min_fraction) & (slow_units.sum(axis=2) >= 2)
        # a worker inside a slow replica: only slowness beyond its replica's counts
        in_slow = replica_flag[:, layout.replica]
        with np.errstate(invalid="ignore", divide="ignore"):
            beyond = worker_ratio / replica_ratio[:, layout.replica] >= t.min_ratio
        worker_flag = np.where(in_slow, worker_flag & beyond, worker_flag)
    return replica_ratio, replica_flag, worker_flag
