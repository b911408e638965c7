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
        R = placement.world_size
        tp = placement.tp_size
        n_nodes = len(placement.nodes)
        ranks = placement.ranks()
        phys = [(p.node.name, p.gpu.index) for p in ranks]
        speed = np.array([self.gpu_speed.get(k, 1.0) for k in phys])
        stage = placement.stage_of_rank()
        dp_of = placement.dp_of_rank()
        last_stage = stage == placement.pp_size - 1
        out = AttemptSteps()

        change_points = sorted({s.t0 for s in slowdowns} | {s.t1 for s in slowdowns})
        pending_spikes = sorted(spikes, key=lambda s: s.t)
        spike_pos = 0

        def multiplier(t: int) -> np.ndarray:
            mult = np.ones(R)
            for s in slowdowns:
                if s.t0 <= t < s.t1:
                    if s.stage is not None:
                        mult[stage == s.stage] *= s.factor
                    else:
                        for r, (node, gpu) in enumerate(phys):
                            if node == s.node and (s.gpu is None or s.gpu == gpu):
                                mult[r] *= s.factor
            return mult

        step = first_step
        t = t_start
        index_in_attempt = 0
        S = self.step_s
        stopped = False
        while t < stop and not stopped:
            K = self.chunk_steps
            c_raw = rng.lognormal(0.0, 0.022, (K, R)) * (0.88 * S) * speed
            split = np.clip(rng.normal(0.34, 0.004, (K, R)), 0.3, 0.38)
            data = rng.lognormal(math.log(0.006 * S), 0.25, (K, R))
            opt = rng.lognormal(math.log(0.025 * S), 0.05, (K, R))
            comm_base = rng.lognormal(math.log(0.05 * S), 0.15, K)
            ckpt_s = rng.uniform(8.0, 30.0, K)
            eval_s = rng.uniform(60.0, 150.0, K)
            jitter = rng.uniform(0, 0.003, (K, 2, R))
            loss_noise = rng.normal(0, 0.012, (K, placement.dp_size))

            mult_rows = np.ones((K, R))
            steps_arr = np.zeros(K, dtype=np.int64)
            starts = np.zeros(K, dtype=np.int64)
            durs = np.zeros(K)
            ck = np.zeros(K)
            gaps = np.zeros(K)
            phases = []
            next_change = next((c for c in change_points if c > t), None)
            mult = multiplier(t)
            trivial = bool(np.all(mult == 1.0))
            k = 0
            while k < K and t < stop:
                if stop_at_step is not None and step >= stop_at_step:
                    stopped = True  # the caller injects something into this step
                    break
                if next_change is not None and t >= next_change:
                    mult = multiplier(t)
                    trivial = bool(np.all(mult == 1.0))
                    next_change = next((c for c in change_points if c > t), None)
                diurnal = 1.0 + 0.012 * math.sin(2 * math.pi * ((t - self.day_origin_ns) / NS) / 86400.0)
                factor = diurnal
                phase = "train"
                if index_in_attempt == 0:
                    factor *= rng.uniform(3.0, 5.0)  # compilation, autotuning, allocator warm-up
                    data[k] += rng.uniform(5.0, 20.0)  # first batches from a cold data pipeline
                    phase = "warmup"
                elif index_in_attempt < self.warmup_steps:
                    factor *= 1.0 + 0.6 * (1.0 - index_in_attempt / self.warmup_steps)
                    phase = "warmup"
                hit = False
                while spike_pos < len(pending_spikes) and pending_spikes[spike_pos].t <= t:
                    spike = pending_spikes[spike_pos]
                    spike_pos += 1
                    rank = None
                    if spike.kind == "job_data":
                        data[k] += spike.amount
                    else:
                        rank = next((r for r, key in enumerate(phys) if key == (spike.node, spike.gpu)), None)
                        if rank is None:
                            continue
                        if spike.kind == "rank_compute":
                            c_raw[k, rank] *= spike.amount
                        else:
                            data[k, rank] += spike.amount
                    out.spike_hits.append(SpikeHit(spike, step, t, rank))
                    hit = True
                row_mult = mult * factor
                mult_rows[k] = row_mult
                if self.checkpoint_every and step > 0 and step % self.checkpoint_every == 0:
                    ck[k] = ckpt_s[k]
                    phase = "checkpoint" if phase == "train" else phase
                fb = c_raw[k] if trivial and factor == 1.0 and not hit else c_raw[k] * row_mult
                fb_tp = np.repeat(fb.reshape(n_nodes, tp).max(axis=1), tp)
                busy = data[k] + fb_tp + opt[k]
                T = float(busy.max()) + comm_base[k] + ck[k]
                steps_arr[k] = step
                starts[k] = t
                durs[k] = T
                phases.append(phase)
                end = t + int(T * NS)
                if end > stop:
                    stopped = True  # the step in flight at the stop never completes
                    break
                gap = 0.0
                if self.eval_every and step > 0 and step % self.eval_every == 0:
                    gap = eval_s[k]
                gaps[k] = gap
                t = end + int(gap * NS)
                step += 1
                index_in_attempt += 1
                k += 1
            if k == 0:
                out.next_step, out.next_start = step, t
                break
            n = k
            self._emit(sink_write, placement, attempt, ranks, last_stage, dp_of, losses,
                       steps_arr[:n], starts[:n], durs[:n], ck[:n], gaps[:n], phases[:n], c_raw[:n] * mult_rows[:n],
                       split[:n], data[:n], opt[:n], jitter[:n], loss_noise[:n], out)
            out.next_step, out.next_start = step, t
        return out

    def _emit(self, sink_write, placement: Placement, attempt: int, ranks, last_stage: np.ndarray,
              dp_of: np.ndarray, losses: list[LossEffect], steps_arr, starts, durs, ck, gaps, phases, fb, split,
              data, opt, jitter, loss_noise, out: AttemptSteps) -> None:
        n, R = fb.shape
        tp = placement.tp_size
        fb_tp = np.repeat(fb.reshape(n, len(placement.nodes), tp).max(axis=2), tp, axis=1)
        forward = fb_tp * split
        backward = fb_tp - forward
        ends = starts + (durs * NS).astype(np.int64)
        r_start = starts[:, None] + (jitter[:, 0, :] * NS).astype(np.int64)
        r_end = ends[:, None] + (jitter[:, 1, :] * NS).astype(np.int64)
        dur_r = (r_end - r_start) / NS
        comm = dur_r - data - forward - backward - opt - ck[:, None]
        comm = np.maximum(comm, 0.0)
        curve = 1.75 + 6.5 * np.exp(-steps_arr / 3000.0)
        loss = curve[:, None] + loss_noise[:, dp_of]
        for effect in losses:
            window = (starts >= effect.t0) & (starts < effect.t1)
            if window.any():
                cols = dp_of == effect.dp
                loss[np.ix_(window, cols)] *= effect.factor
        loss_mask = np.broadcast_to(~last_stage, (n, R))

        has_ck = ck > 0
        names = list(TRAIN_SECTIONS)
        values = [data, forward, backward, opt, comm]
        rows = n * R
        # map column: 5 sections, or 6 on checkpoint steps
        counts = np.where(np.repeat(has_ck, R), 6, 5)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        keys = np.empty(int(offsets[-1]), dtype=object)
        items = np.empty(int(offsets[-1]))
        base = offsets[:-1]
        for j, name in enumerate(names):
            keys[base + j] = name
            items[base + j] = values[j].ravel()
        ck_rows = np.flatnonzero(np.repeat(has_ck, R))
        if len(ck_rows):
            keys[base[ck_rows] + 5] = "checkpoint"
            items[base[ck_rows] + 5] = np.repeat(ck, R)[ck_rows]
        sections = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                           pa.array(np.round(items, 6)))
        rank_ids = np.tile(np.arange(R, dtype=np.int32), n)
        node_names = np.array([p.node.name for p in ranks], dtype=object)
        phase_arr = np.repeat(np.array(phases, dtype=object), R)
        end_flat = r_end.ravel()
        table = pa.table({
            "ts": ts_array(end_flat),
            "cluster": pa.array(np.full(rows, self.cluster, dtype=object), pa.string()),
            "node": pa.array(node_names[rank_ids], pa.string()),
            "job_id": pa.array(np.full(rows, self.job_id, dtype=object), pa.string()),
            "attempt": pa.array(np.full(rows, attempt, dtype=np.int32)),
            "rank": pa.array(rank_ids),
            "local_rank": pa.array(rank_ids % tp),
            "gpu_index": pa.nulls(rows, pa.int32()),
            "gpu_uuid": pa.nulls(rows, pa.string()),
            "pci_bus_id": pa.nulls(rows, pa.string()),
            "step": pa.array(np.repeat(steps_arr, R)),
            "phase": pa.array(phase_arr, pa.string()),
            "start_ts": ts_array(r_start.ravel()),
            "end_ts": ts_array(end_flat),
            "duration_s": pa.array(np.round(dur_r.ravel(), 6)),
            "sections": sections,
            "tokens": pa.array(np.full(rows, TOKENS_PER_RANK_STEP, dtype=np.int64)),
            "samples": pa.array(np.full(rows, 16, dtype=np.int64)),
            "loss": pa.array(np.round(loss.ravel(), 5), mask=loss_mask.ravel()),
        }, schema=TABLES["steps"])
        sink_write("steps", table)
        # evaluation passes: one row per rank after the step, sections {"eval": seconds}
        ev = np.flatnonzero(gaps > 0)
        if len(ev):
            m = len(ev) * R
            ev_start = np.repeat(ends[ev], R) + (jitter[ev, 1, :].ravel() * NS).astype(np.int64)
            ev_len = np.repeat(gaps[ev], R) * np.random.default_rng(int(ends[ev][0]) % 2**32).uniform(0.995, 1.0, m)
            ev_end = ev_start + (ev_len * NS).astype(np.int64)
            ev_sections = pa.MapArray.from_arrays(pa.array(np.arange(m + 1, dtype=np.int32)),
                                                  pa.array(["eval"] * m, pa.string()), pa.array(np.round(ev_len, 6)))
            ev_ranks = np.tile(np.arange(R, dtype=np.int32), len(ev))
            sink_write("steps", pa.table({
                "ts": ts_array(ev_end),
                "cluster": pa.array([self.cluster] * m, pa.string()),
                "node": pa.array(node_names[ev_ranks], pa.string()),
                "job_id": pa.array([self.job_id] * m, pa.string()),
                "attempt": pa.array(np.full(m, attempt, dtype=np.int32)),
                "rank": pa.array(ev_ranks),
                "local_rank": pa.array(ev_ranks % tp),
                "gpu_index": pa.nulls(m, pa.int32()),
                "gpu_uuid": pa.nulls(m, pa.string()),
                "pci_bus_id": pa.nulls(m, pa.string()),
                "step": pa.array(np.repeat(steps_arr[ev], R)),
                "phase": pa.array(["eval"] * m, pa.string()),
                "start_ts": ts_array(ev_start),
                "end_ts": ts_array(ev_end),
                "duration_s": pa.array(np.round(ev_len, 6)),
                "sections": ev_sections,
                "tokens": pa.nulls(m, pa.int64()),
                "samples": pa.array(np.full(m, 64, dtype=np.int64)),
                "loss": pa.nulls(m, pa.float64()),
            }, schema=TABLES["steps"]))
        out.steps.extend(int(s) for s in steps_arr)
        out.starts.extend(int(s) for s in starts)
        out.ends.extend(int(e) for e in ends)
        out.checkpoints.extend((int(steps_arr[i]), int(ends[i])) for i in np.flatnonzero(has_ck))
