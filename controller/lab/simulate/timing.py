"""Step and section timing of a synchronous data/tensor/pipeline-parallel job, as the step timer records it.

One row per rank per step; sections data, forward, backward, optimizer, comm (plus checkpoint on checkpoint steps,
and eval rows for evaluation passes). The step wall time is shared by all ranks (synchronous training): a slow rank
makes everybody's step longer, but only its *compute* sections grow; the others wait, which shows up in their comm
section. Tensor-parallel peers (one node) wait for each other inside forward/backward, so a slow GPU slows its
whole node's compute sections; a slow pipeline stage slows the compute of every rank of that stage.

Jitter: lognormal per rank and step, a persistent per-GPU speed (the silicon lottery), a 1-2% diurnal swing,
a slow first step and warm-up after every (re)start, blocking checkpoint saves and periodic evaluation passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from faultlens.collectors.store.schema import TABLES, ts_array
from faultlens.controller.lab.simulate.cluster import Placement

NS = 1_000_000_000
TRAIN_SECTIONS = ("data", "forward", "backward", "optimizer", "comm")
TOKENS_PER_RANK_STEP = 8192 * 16


@dataclass(frozen=True)
class Slowdown:
    """Compute of some ranks is `factor` times slower during [t0, t1): one physical GPU, a whole node, or every
    rank of a pipeline stage."""

    t0: int
    t1: int
    factor: float
    node: str | None = None
    gpu: int | None = None  # None with a node: every GPU of the node
    stage: int | None = None


@dataclass(frozen=True)
class Spike:
    """A one-off slow step (benign): the first step starting at or after t."""

    t: int
    kind: str  # rank_compute (GC pause, allocator), rank_data (loader hiccup), job_data (shared filesystem)
    amount: float  # factor for rank_compute, extra seconds otherwise
    node: str | None = None
    gpu: int | None = None


@dataclass(frozen=True)
class LossEffect:
    """The loss of one data-parallel replica is multiplied by `factor` (NaN allowed) during [t0, t1)."""

    t0: int
    t1: int
    dp: int
    factor: float


@dataclass
class SpikeHit:
    spike: Spike
    step: int
    start: int
    rank: int | None


@dataclass
class AttemptSteps:
    """What an attempt's steps were, for the fault injectors (dumps, failure step) and the bench."""

    steps: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)  # (step, ts)
    spike_hits: list[SpikeHit] = field(default_factory=list)
    next_step: int = 0
    next_start: int = 0  # when the step in flight at the stop time started (or would start)

    def step_at(self, t: int) -> int:
        """The step in flight at time t (the next one when t falls between steps)."""
        idx = int(np.searchsorted(np.asarray(self.ends, dtype=np.int64), t, side="right"))
        return self.steps[idx] if idx < len(self.steps) else self.next_step

    def last_end_before(self, t: int) -> int | None:
        ends = np.asarray(self.ends, dtype=np.int64)
        idx = int(np.searchsorted(ends, t, side="right")) - 1
        return int(ends[idx]) if idx >= 0 else None

    def median_step_s(self) -> float:
        if len(self.starts) < 3:
            return 0.0
        d = np.asarray(self.ends[-50:]) - np.asarray(self.starts[-50:])
        return float(np.median(d)) / NS


@dataclass(frozen=True)
class _Layout:
    """What the timing needs of a placement, per rank (in rank order)."""

    n_nodes: int
    tp: int
    dp_size: int
    phys: list[tuple[str, int]]  # (node, gpu index)
    node_names: np.ndarray
    speed: np.ndarray  # the persistent per-GPU speed
    stage: np.ndarray
    dp_of: np.ndarray
    last_stage: np.ndarray

    @property
    def world_size(self) -> int:
        return len(self.phys)

    @classmethod
    def of(cls, placement: Placement, gpu_speed: dict[tuple[str, int], float]) -> _Layout:
        ranks = placement.ranks()
        phys = [(p.node.name, p.gpu.index) for p in ranks]
        stage = placement.stage_of_rank()
        return cls(n_nodes=len(placement.nodes), tp=placement.tp_size, dp_size=placement.dp_size, phys=phys,
                   node_names=np.array([p.node.name for p in ranks], dtype=object),
                   speed=np.array([gpu_speed.get(k, 1.0) for k in phys]), stage=stage,
                   dp_of=placement.dp_of_rank(), last_stage=stage == placement.pp_size - 1)


@dataclass
class _Slowdowns:
    """The compute multiplier per rank from the slowdowns in force, worked out again only at their change points."""

    slowdowns: list[Slowdown]
    layout: _Layout
    mult: np.ndarray = field(init=False)
    trivial: bool = field(init=False)  # no slowdown in force
    next_change: int | None = field(init=False)

    def __post_init__(self) -> None:
        self._change_points = sorted({s.t0 for s in self.slowdowns} | {s.t1 for s in self.slowdowns})

    def reset(self, t: int) -> None:
        self.next_change = next((c for c in self._change_points if c > t), None)
        self.mult = self._multiplier(t)
        self.trivial = bool(np.all(self.mult == 1.0))

    def update(self, t: int) -> None:
        if self.next_change is not None and t >= self.next_change:
            self.reset(t)

    def _multiplier(self, t: int) -> np.ndarray:
        mult = np.ones(self.layout.world_size)
        for s in self.slowdowns:
            if s.t0 <= t < s.t1:
                if s.stage is not None:
                    mult[self.layout.stage == s.stage] *= s.factor
                else:
                    for r, (node, gpu) in enumerate(self.layout.phys):
                        if node == s.node and (s.gpu is None or s.gpu == gpu):
                            mult[r] *= s.factor
        return mult


@dataclass
class _Cursor:
    """Where the attempt's steps are: the next step, when it starts, and the next pending spike."""

    step: int
    t: int
    index_in_attempt: int = 0
    spike_pos: int = 0
    stopped: bool = False


@dataclass
class _Chunk:
    """Up to K steps of all ranks: the random draws (made up front, K at a time) and the steps' times as they are
    worked out."""

    c_raw: np.ndarray  # compute (forward + backward) seconds, (K, R)
    split: np.ndarray  # forward's share of compute
    data: np.ndarray
    opt: np.ndarray
    comm_base: np.ndarray  # (K,)
    ckpt_s: np.ndarray
    eval_s: np.ndarray
    jitter: np.ndarray  # (K, 2, R): start and end offsets of each rank's view of the step
    loss_noise: np.ndarray  # (K, dp)
    mult_rows: np.ndarray
    steps_arr: np.ndarray
    starts: np.ndarray
    durs: np.ndarray
    ck: np.ndarray  # checkpoint seconds (0: none)
    gaps: np.ndarray  # evaluation seconds after the step (0: none)
    phases: list[str] = field(default_factory=list)

    @classmethod
    def draw(cls, rng: np.random.Generator, K: int, layout: _Layout, S: float) -> _Chunk:
        R = layout.world_size
        c_raw = rng.lognormal(0.0, 0.022, (K, R)) * (0.88 * S) * layout.speed
        split = np.clip(rng.normal(0.34, 0.004, (K, R)), 0.3, 0.38)
        data = rng.lognormal(math.log(0.006 * S), 0.25, (K, R))
        opt = rng.lognormal(math.log(0.025 * S), 0.05, (K, R))
        comm_base = rng.lognormal(math.log(0.05 * S), 0.15, K)
        ckpt_s = rng.uniform(8.0, 30.0, K)
        eval_s = rng.uniform(60.0, 150.0, K)
        jitter = rng.uniform(0, 0.003, (K, 2, R))
        loss_noise = rng.normal(0, 0.012, (K, layout.dp_size))
        return cls(c_raw, split, data, opt, comm_base, ckpt_s, eval_s, jitter, loss_noise, mult_rows=np.ones((K, R)),
                   steps_arr=np.zeros(K, dtype=np.int64), starts=np.zeros(K, dtype=np.int64), durs=np.zeros(K),
                   ck=np.zeros(K), gaps=np.zeros(K))

    def head(self, n: int) -> _Chunk:
        """The first n steps."""
        return _Chunk(*(getattr(self, f)[:n] for f in self.__dataclass_fields__))


class StepTimer:
    """Generates the steps table for one attempt, chunk by chunk."""

    def __init__(self, *, cluster: str, job_id: str, step_seconds: float, checkpoint_every: int, eval_every: int,
                 warmup_steps: int, day_origin_ns: int, gpu_speed: dict[tuple[str, int], float],
                 chunk_steps: int = 1500) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.step_s = step_seconds
        self.checkpoint_every = checkpoint_every
        self.eval_every = eval_every
        self.warmup_steps = warmup_steps
        self.day_origin_ns = day_origin_ns
        self.gpu_speed = gpu_speed
        self.chunk_steps = chunk_steps

    def run(self, rng: np.random.Generator, placement: Placement, attempt: int, first_step: int, t_start: int,
            stop: int, slowdowns: list[Slowdown], spikes: list[Spike], losses: list[LossEffect],
            sink_write, stop_at_step: int | None = None) -> AttemptSteps:
        """Steps from `first_step`, the first starting at `t_start`, until the step in flight at `stop` (which is
        not recorded: it never completed). Tables go to sink_write("steps", table)."""
        layout = _Layout.of(placement, self.gpu_speed)
        speed = _Slowdowns(slowdowns, layout)
        pending = sorted(spikes, key=lambda s: s.t)
        cur = _Cursor(first_step, t_start)
        out = AttemptSteps()
        while cur.t < stop and not cur.stopped:
            chunk = _Chunk.draw(rng, self.chunk_steps, layout, self.step_s)
            n = self._time_steps(rng, chunk, cur, layout, speed, pending, stop, stop_at_step, out)
            if n == 0:
                out.next_step, out.next_start = cur.step, cur.t
                break
            self._emit(sink_write, attempt, layout, losses, chunk.head(n), out)
            out.next_step, out.next_start = cur.step, cur.t
        return out

    def _time_steps(self, rng: np.random.Generator, chunk: _Chunk, cur: _Cursor, layout: _Layout,
                    speed: _Slowdowns, pending: list[Spike], stop: int, stop_at_step: int | None,
                    out: AttemptSteps) -> int:
        """Work out the chunk's steps from the cursor on, until the chunk is full, the step in flight at `stop` or
        the step to stop at; returns how many completed."""
        speed.reset(cur.t)
        k = 0
        while k < len(chunk.steps_arr) and cur.t < stop:
            if stop_at_step is not None and cur.step >= stop_at_step:
                cur.stopped = True  # the caller injects something into this step
                break
            speed.update(cur.t)
            factor, phase = self._restart_factor(rng, chunk, k, cur)
            hit = _apply_spikes(pending, cur, chunk, k, layout.phys, out)
            row_mult = speed.mult * factor
            chunk.mult_rows[k] = row_mult
            if self.checkpoint_every and cur.step > 0 and cur.step % self.checkpoint_every == 0:
                chunk.ck[k] = chunk.ckpt_s[k]
                phase = "checkpoint" if phase == "train" else phase
            fb = chunk.c_raw[k] if speed.trivial and factor == 1.0 and not hit else chunk.c_raw[k] * row_mult
            fb_tp = np.repeat(fb.reshape(layout.n_nodes, layout.tp).max(axis=1), layout.tp)
            busy = chunk.data[k] + fb_tp + chunk.opt[k]
            T = float(busy.max()) + chunk.comm_base[k] + chunk.ck[k]
            chunk.steps_arr[k] = cur.step
            chunk.starts[k] = cur.t
            chunk.durs[k] = T
            chunk.phases.append(phase)
            end = cur.t + int(T * NS)
            if end > stop:
                cur.stopped = True  # the step in flight at the stop never completes
                break
            gap = 0.0
            if self.eval_every and cur.step > 0 and cur.step % self.eval_every == 0:
                gap = chunk.eval_s[k]
            chunk.gaps[k] = gap
            cur.t = end + int(gap * NS)
            cur.step += 1
            cur.index_in_attempt += 1
            k += 1
        return k

    def _restart_factor(self, rng: np.random.Generator, chunk: _Chunk, k: int, cur: _Cursor) -> tuple[float, str]:
        """The step's slowdown for everyone (the diurnal swing, the first step and warm-up after a (re)start) and
        its phase."""
        factor = 1.0 + 0.012 * math.sin(2 * math.pi * ((cur.t - self.day_origin_ns) / NS) / 86400.0)
        index = cur.index_in_attempt
        if index == 0:
            factor *= rng.uniform(3.0, 5.0)  # compilation, autotuning, allocator warm-up
            chunk.data[k] += rng.uniform(5.0, 20.0)  # first batches from a cold data pipeline
            return factor, "warmup"
        if index < self.warmup_steps:
            factor *= 1.0 + 0.6 * (1.0 - index / self.warmup_steps)
            return factor, "warmup"
        return factor, "train"

    def _emit(self, sink_write, attempt: int, layout: _Layout, losses: list[LossEffect], chunk: _Chunk,
              out: AttemptSteps) -> None:
        """Write the chunk's step rows (and its evaluation passes) and record its steps in `out`."""
        fb = chunk.c_raw * chunk.mult_rows
        n, R = fb.shape
        tp = layout.tp
        fb_tp = np.repeat(fb.reshape(n, layout.n_nodes, tp).max(axis=2), tp, axis=1)
        forward = fb_tp * chunk.split
        backward = fb_tp - forward
        ends = chunk.starts + (chunk.durs * NS).astype(np.int64)
        r_start = chunk.starts[:, None] + (chunk.jitter[:, 0, :] * NS).astype(np.int64)
        r_end = ends[:, None] + (chunk.jitter[:, 1, :] * NS).astype(np.int64)
        dur_r = (r_end - r_start) / NS
        comm = dur_r - chunk.data - forward - backward - chunk.opt - chunk.ck[:, None]
        comm = np.maximum(comm, 0.0)
        sections = _sections(chunk.ck, R, [chunk.data, forward, backward, chunk.opt, comm])
        loss = _loss(chunk, layout, losses)
        sink_write("steps", self._train_table(attempt, layout, chunk, r_start, r_end, dur_r, sections, loss))
        ev = np.flatnonzero(chunk.gaps > 0)
        if len(ev):
            sink_write("steps", self._eval_table(attempt, layout, chunk, ends, ev))
        out.steps.extend(int(s) for s in chunk.steps_arr)
        out.starts.extend(int(s) for s in chunk.starts)
        out.ends.extend(int(e) for e in ends)
        out.checkpoints.extend((int(chunk.steps_arr[i]), int(ends[i])) for i in np.flatnonzero(chunk.ck > 0))

    def _train_table(self, attempt: int, layout: _Layout, chunk: _Chunk, r_start: np.ndarray, r_end: np.ndarray,
                     dur_r: np.ndarray, sections: pa.MapArray, loss: np.ndarray) -> pa.Table:
        """One row per rank and step."""
        n, R = r_end.shape
        rows = n * R
        rank_ids = np.tile(np.arange(R, dtype=np.int32), n)
        phase_arr = np.repeat(np.array(chunk.phases, dtype=object), R)
        end_flat = r_end.ravel()
        loss_mask = np.broadcast_to(~layout.last_stage, (n, R))  # the loss is known on the last stage only
        return pa.table({
            "ts": ts_array(end_flat),
            "cluster": pa.array(np.full(rows, self.cluster, dtype=object), pa.string()),
            "node": pa.array(layout.node_names[rank_ids], pa.string()),
            "job_id": pa.array(np.full(rows, self.job_id, dtype=object), pa.string()),
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

    def _eval_table(self, attempt: int, layout: _Layout, chunk: _Chunk, ends: np.ndarray,
                    ev: np.ndarray) -> pa.Table:
        """The evaluation passes after steps `ev`: one row per rank, sections {"eval": seconds}."""
        R = layout.world_size
        m = len(ev) * R
        ev_start = np.repeat(ends[ev], R) + (chunk.jitter[ev, 1, :].ravel() * NS).astype(np.int64)
        ev_len = np.repeat(chunk.gaps[ev], R) * np.random.default_rng(int(ends[ev][0]) % 2**32).uniform(0.995, 1.0, m)
        ev_end = ev_start + (ev_len * NS).astype(np.int64)
        ev_sections = pa.MapArray.from_arrays(pa.array(np.arange(m + 1, dtype=np.int32)),
                                              pa.array(["eval"] * m, pa.string()), pa.array(np.round(ev_len, 6)))
        ev_ranks = np.tile(np.arange(R, dtype=np.int32), len(ev))
        return pa.table({
            "ts": ts_array(ev_end),
            "cluster": pa.array([self.cluster] * m, pa.string()),
            "node": pa.array(layout.node_names[ev_ranks], pa.string()),
            "job_id": pa.array([self.job_id] * m, pa.string()),
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


def _apply_spikes(pending: list[Spike], cur: _Cursor, chunk: _Chunk, k: int, phys: list[tuple[str, int]],
                  out: AttemptSteps) -> bool:
    """Apply the spikes due by the start of the chunk's step k; whether any hit a rank of this placement."""
    hit = False
    while cur.spike_pos < len(pending) and pending[cur.spike_pos].t <= cur.t:
        spike = pending[cur.spike_pos]
        cur.spike_pos += 1
        rank = None
        if spike.kind == "job_data":
            chunk.data[k] += spike.amount
        else:
            rank = next((r for r, key in enumerate(phys) if key == (spike.node, spike.gpu)), None)
            if rank is None:
                continue
            if spike.kind == "rank_compute":
                chunk.c_raw[k, rank] *= spike.amount
            else:
                chunk.data[k, rank] += spike.amount
        out.spike_hits.append(SpikeHit(spike, cur.step, cur.t, rank))
        hit = True
    return hit


def _sections(ck: np.ndarray, R: int, values: list[np.ndarray]) -> pa.MapArray:
    """The sections map of each row: the five training sections, and the checkpoint (`ck` seconds, per step) on
    checkpoint steps."""
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


def _loss(chunk: _Chunk, layout: _Layout, losses: list[LossEffect]) -> np.ndarray:
    """The loss of each rank and step: the training curve, the replica's noise and the loss effects in force."""
    curve = 1.75 + 6.5 * np.exp(-chunk.steps_arr / 3000.0)
    loss = curve[:, None] + chunk.loss_noise[:, layout.dp_of]
    for effect in losses:
        window = (chunk.starts >= effect.t0) & (chunk.starts < effect.t1)
        if window.any():
            cols = layout.dp_of == effect.dp
            loss[np.ix_(window, cols)] *= effect.factor
    return loss
