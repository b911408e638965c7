"""The steps table of a chunk of steps: one training row per rank and step with its sections map and
loss (train_table, sections_map, step_loss), and the evaluation passes (eval_table)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from faultlens.collectors.store.schema import TABLES, ts_array
from faultlens.controller.lab.simulate.timing.chunk import StepChunk, TimingLayout
from faultlens.controller.lab.simulate.timing.records import NS, LossEffect

TRAIN_SECTIONS = ("data", "forward", "backward", "optimizer", "comm")
TOKENS_PER_RANK_STEP = 8192 * 16


def train_table(
    cluster: str,
    job_id: str,
    attempt: int,
    layout: TimingLayout,
    chunk: StepChunk,
    r_start: np.ndarray,
    r_end: np.ndarray,
    dur_r: np.ndarray,
    sections: pa.MapArray,
    loss: np.ndarray,
) -> pa.Table:
    """One row per rank and step."""
    n, R = r_end.shape
    rows = n * R
    rank_ids = np.tile(np.arange(R, dtype=np.int32), n)
    phase_arr = np.repeat(np.array(chunk.phases, dtype=object), R)
    end_flat = r_end.ravel()
    # the loss is known on the last stage only
    loss_mask = np.broadcast_to(~layout.last_stage, (n, R))
    return pa.table({
        "ts": ts_array(end_flat),
        "cluster": pa.array(np.full(rows, cluster, dtype=object), pa.string()),
        "node": pa.array(layout.node_names[rank_ids], pa.string()),
        "job_id": pa.array(np.full(rows, job_id, dtype=object), pa.string()),
        "attempt": pa.array(np.full(rows, attempt, dtype=np.int32)),
        "rank": pa.array(rank_ids),
        "local_rank": pa.array(rank_ids % layout.tp),
        "gpu_index": pa.nulls(rows, pa.int32()),
        "gpu_uuid": pa.nulls(rows, pa.string()),
        "pci_bus_id": pa.nulls(rows, pa.string()),
        "step": pa.array(np.repeat(chunk.steps_arr, R)),
        "phase": pa.array(phase_arr, pa.string()),
        "start_ts": ts_array(r_start.ravel()),
        "end_ts": ts_array(end_flat),
        "duration_s": pa.array(np.round(dur_r.ravel(), 6)),
        "sections": sections,
        "tokens": pa.array(np.full(rows, TOKENS_PER_RANK_STEP, dtype=np.int64)),
        "samples": pa.array(np.full(rows, 16, dtype=np.int64)),
        "loss": pa.array(np.round(loss.ravel(), 5), mask=loss_mask.ravel()),
    }, schema=TABLES["steps"])

def eval_table(
    cluster: str,
    job_id: str,
    attempt: int,
    layout: TimingLayout,
    chunk: StepChunk,
    ends: np.ndarray,
    ev: np.ndarray,
) -> pa.Table:
    """The evaluation passes after steps `ev`: one row per rank, sections {"eval": seconds}."""
    R = layout.world_size
    m = len(ev) * R
    ev_start = np.repeat(ends[ev], R) + (chunk.jitter[ev, 1, :].ravel() * NS).astype(np.int64)
    ev_len = np.repeat(chunk.gaps[ev], R) * np.random.default_rng(int(ends[ev][0]) % 2**32).uniform(
        0.995, 1.0, m
    )
    ev_end = ev_start + (ev_len * NS).astype(np.int64)
    ev_sections = pa.MapArray.from_arrays(
        pa.array(np.arange(m + 1, dtype=np.int32)),
        pa.array(["eval"] * m, pa.string()),
        pa.array(np.round(ev_len, 6)),
    )
    ev_ranks = np.tile(np.arange(R, dtype=np.int32), len(ev))
    return pa.table({
        "ts": ts_array(ev_end),
        "cluster": pa.array([cluster] * m, pa.string()),
        "node": pa.array(layout.node_names[ev_ranks], pa.string()),
        "job_id": pa.array([job_id] * m, pa.string()),
        "attempt": pa.array(np.full(m, attempt, dtype=np.int32)),
        "rank": pa.array(ev_ranks),
        "local_rank": pa.array(ev_ranks % layout.tp),
        "gpu_index": pa.nulls(m, pa.int32()),
        "gpu_uuid": pa.nulls(m, pa.string()),
        "pci_bus_id": pa.nulls(m, pa.string()),
        "step": pa.array(np.repeat(chunk.steps_arr[ev], R)),
        "phase": pa.array(["eval"] * m, pa.string()),
        "start_ts": ts_array(ev_start),
        "end_ts": ts_array(ev_end),
        "duration_s": pa.array(np.round(ev_len, 6)),
        "sections": ev_sections,
        "tokens": pa.nulls(m, pa.int64()),
        "samples": pa.array(np.full(m, 64, dtype=np.int64)),
        "loss": pa.nulls(m, pa.float64()),
    }, schema=TABLES["steps"])


def sections_map(ck: np.ndarray, R: int, values: list[np.ndarray]) -> pa.MapArray:
    """The sections map of each row: the five training sections, and the checkpoint (`ck` seconds,
    per step) on checkpoint steps."""
    has_ck = ck > 0
    rows = len(ck) * R
    counts = np.where(np.repeat(has_ck, R), 6, 5)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    keys = np.empty(int(offsets[-1]), dtype=object)
    items = np.empty(int(offsets[-1]))
    base = offsets[:-1]
    for j, name in enumerate(TRAIN_SECTIONS):
        keys[base + j] = name
        items[base + j] = values[j].ravel()
    ck_rows = np.flatnonzero(np.repeat(has_ck, R))
    if len(ck_rows):
        keys[base[ck_rows] + 5] = "checkpoint"
        items[base[ck_rows] + 5] = np.repeat(ck, R)[ck_rows]
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(np.round(items, 6)))


def step_loss(chunk: StepChunk, layout: TimingLayout, losses: list[LossEffect]) -> np.ndarray:
    """The loss of each rank and step: the training curve, the replica's noise and the loss effects
    in force.
    """
    curve = 1.75 + 6.5 * np.exp(-chunk.steps_arr / 3000.0)
    loss = curve[:, None] + chunk.loss_noise[:, layout.dp_of]
    for effect in losses:
        window = (chunk.starts >= effect.t0) & (chunk.starts < effect.t1)
        if window.any():
            cols = layout.dp_of == effect.dp
            loss[np.ix_(window, cols)] *= effect.factor
    return loss
