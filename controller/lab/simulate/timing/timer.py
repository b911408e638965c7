"""StepTimer: an attempt's steps, chunk by chunk: each step's time from the draws, the slowdowns and
spikes in force and the warm-up after a (re)start, written to the steps table."""

from __future__ import annotations

import math

import numpy as np

from faultlens.controller.lab.simulate.cluster import Placement
from faultlens.controller.lab.simulate.timing.chunk import (
    SlowdownMultiplier,
    StepChunk,
    StepCursor,
    TimingLayout,
    apply_spikes,
)
from faultlens.controller.lab.simulate.timing.records import (
    NS,
    AttemptSteps,
    LossEffect,
    Slowdown,
    Spike,
)
from faultlens.controller.lab.simulate.timing.tables import (
    eval_table,
    sections_map,
    step_loss,
    train_table,
)


class StepTimer:
    """Generates the steps table for one attempt, chunk by chunk."""

    def __init__(
        self,
        *,
        cluster: str,
        job_id: str,
        step_seconds: float,
        checkpoint_every: int,
        eval_every: int,
        warmup_steps: int,
        day_origin_ns: int,
        gpu_speed: dict[tuple[str, int], float],
        chunk_steps: int = 1500,
    ) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.step_s = step_seconds
        self.checkpoint_every = checkpoint_every
        self.eval_every = eval_every
        self.warmup_steps = warmup_steps
        self.day_origin_ns = day_origin_ns
        self.gpu_speed = gpu_speed
        self.chunk_steps = chunk_steps

    def run(
        self,
        rng: np.random.Generator,
        placement: Placement,
        attempt: int,
        first_step: int,
        t_start: int,
        stop: int,
        slowdowns: list[Slowdown],
        spikes: list[Spike],
        losses: list[LossEffect],
        sink_write,
        stop_at_step: int | None = None,
    ) -> AttemptSteps:
        """Steps from `first_step`, the first starting at `t_start`, until the step in flight at
        `stop` (which is not recorded: it never completed). Tables go to sink_write("steps", table).
        """
        layout = TimingLayout.of(placement, self.gpu_speed)
        speed = SlowdownMultiplier(slowdowns, layout)
        pending = sorted(spikes, key=lambda s: s.t)
        cur = StepCursor(first_step, t_start)
        out = AttemptSteps()
        while cur.t < stop and not cur.stopped:
            chunk = StepChunk.draw(rng, self.chunk_steps, layout, self.step_s)
            n = self._time_steps(rng, chunk, cur, layout, speed, pending, stop, stop_at_step, out)
            if n == 0:
                out.next_step, out.next_start = cur.step, cur.t
                break
            self._emit(sink_write, attempt, layout, losses, chunk.head(n), out)
            out.next_step, out.next_start = cur.step, cur.t
        return out

    def _time_steps(
        self,
        rng: np.random.Generator,
        chunk: StepChunk,
        cur: StepCursor,
        layout: TimingLayout,
        speed: SlowdownMultiplier,
        pending: list[Spike],
        stop: int,
        stop_at_step: int | None,
        out: AttemptSteps,
    ) -> int:
        """Work out the chunk's steps from the cursor on, until the chunk is full, the step in
        flight at `stop` or the step to stop at; returns how many completed."""
        speed.reset(cur.t)
        k = 0
        while k < len(chunk.steps_arr) and cur.t < stop:
            if stop_at_step is not None and cur.step >= stop_at_step:
                cur.stopped = True  # the caller injects something into this step
                break
            speed.update(cur.t)
            factor, phase = self._restart_factor(rng, chunk, k, cur)
            hit = apply_spikes(pending, cur, chunk, k, layout.phys, out)
            row_mult = speed.mult * factor
            chunk.mult_rows[k] = row_mult
            if self.checkpoint_every and cur.step > 0 and cur.step % self.checkpoint_every == 0:
                chunk.ck[k] = chunk.ckpt_s[k]
                phase = "checkpoint" if phase == "train" else phase
            fb = (
                chunk.c_raw[k]
                if speed.trivial and factor == 1.0 and not hit
                else chunk.c_raw[k] * row_mult
            )
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

    def _restart_factor(
        self, rng: np.random.Generator, chunk: StepChunk, k: int, cur: StepCursor
    ) -> tuple[float, str]:
        """The step's slowdown for everyone (the diurnal swing, the first step and warm-up after a
        (re)start) and its phase."""
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

    def _emit(
        self,
        sink_write,
        attempt: int,
        layout: TimingLayout,
        losses: list[LossEffect],
        chunk: StepChunk,
        out: AttemptSteps,
    ) -> None:
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
        sections = sections_map(chunk.ck, R, [chunk.data, forward, backward, chunk.opt, comm])
        loss = step_loss(chunk, layout, losses)
        sink_write(
            "steps",
            train_table(
                self.cluster,
                self.job_id,
                attempt,
                layout,
                chunk,
                r_start,
                r_end,
                dur_r,
                sections,
                loss,
            ),
        )
        ev = np.flatnonzero(chunk.gaps > 0)
        if len(ev):
            sink_write(
                "steps", eval_table(self.cluster, self.job_id, attempt, layout, chunk, ends, ev)
            )
        out.steps.extend(int(s) for s in chunk.steps_arr)
        out.starts.extend(int(s) for s in chunk.starts)
        out.ends.extend(int(e) for e in ends)
        out.checkpoints.extend(
            (int(chunk.steps_arr[i]), int(ends[i])) for i in np.flatnonzero(chunk.ck > 0)
        )
