"""Megatron-style timer logs of a pipeline x data-parallel job, shaped like real ones: a generator.

A step of every data-parallel replica is simulated as Megatron's 1F1B schedule over P stages and M
microbatches (warm-up forwards, steady one-forward-one-backward, cool-down backwards). A stage's
op starts when the stage is free and its input has arrived; the time it waits is booked to the recv
timer Megatron books it to (`forward-recv` in warm-up, `forward-send-backward-recv` /
`backward-send-forward-recv` in the steady phase, `backward-recv` in cool-down). After its pipeline
each stage all-reduces its gradients with the same stage of the other replicas (`grads-all-reduce`:
it waits there for the slowest replica), then runs the optimizer (`optimizer`, with Megatron's
gradient-norm all-reduce over the model inside `optimizer-clip-main-grad`: the whole job meets
there). Each worker is a tensor-parallel group of `tp` GPUs that reports one row (its tp rank 0), so
the world size is P x D x tp while P x D ranks report; global rank = tp + tp x (dp + D x pp)
(Megatron's tp-dp-pp order).

Rows are logged every `log_interval` steps (Megatron's --log-interval): with `shape="interval"`
(what a parsed Megatron log gives) one row per (rank, logged step, timer) holding the timer's mean
per step over the interval, starting at the logged step's start; with `shape="instances"` (what a
profiler export gives) one row per timed instance of the logged step (per microbatch).

Noise: every op's time varies by `noise` (a lognormal sigma) step to step, and each step of the job
by a shared factor (`job_noise`). A slow worker computes `slow_fwd` x / `slow_bwd` x its peers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

T0 = 1_796_040_000.0  # 2026-11-30 (epoch seconds)


@dataclass(frozen=True)
class Trace:
    stages: int = 4
    replicas: int = 4
    tp: int = 4
    microbatches: int = 8
    steps: int = 600  # training steps run (rows only every log_interval)
    log_interval: int = 28
    step_s: float = 46.6  # a healthy step, about
    slow: tuple[int, int] | None = None  # (replica, stage) of the slow worker
    slow_fwd: float = 2.5
    slow_bwd: float = 2.3
    slow_from: int = 0  # the step it becomes slow
    noise: float = 0.03
    job_noise: float = 0.02
    shape: str = "interval"  # or "instances"
    first_step: int = 1  # Megatron counts iterations from 1
    gpus_per_node: int = 8
    seed: int = 0
    drop: tuple[str, ...] = ()  # timers the log does not hold

    @property
    def world_size(self) -> int:
        return self.stages * self.replicas * self.tp

    def global_rank(self, replica: int, stage: int) -> int:
        return self.tp * (replica + self.replicas * stage)

    def node(self, replica: int, stage: int) -> str:
        return f"node-{self.global_rank(replica, stage) // self.gpus_per_node:03d}"


def _schedule(stages: int, micro: int) -> list[list[tuple[str, int, str]]]:
    """Per stage, its ops in 1F1B order: (direction, microbatch, the recv timer its wait goes
    to)."""
    out = []
    for p in range(stages):
        warm = min(stages - p - 1, micro)
        ops: list[tuple[str, int, str]] = [("F", i, "forward-recv") for i in range(warm)]
        f = warm
        for b in range(micro):
            if f < micro:
                ops.append(("F", f, "forward-recv" if f == 0 else "backward-send-forward-recv"))
                f += 1
            ops.append(
                (
                    "B",
                    b,
                    "forward-send-backward-recv"
                    if f < micro or b < micro - warm
                    else "backward-recv",
                )
            )
        out.append(ops)
    return out


def _one_step(
    t: Trace,
    fwd: np.ndarray,
    bwd: np.ndarray,
    start: np.ndarray,
    link_s: float,
) -> tuple[np.ndarray, list[list[dict[str, list[tuple[float, float]]]]]]:
    """One step of every replica from each worker's start time: (pipeline end per (replica,
    stage), per (replica, stage) the timer -> [(start, seconds)] of its instances)."""
    D, P, M = t.replicas, t.stages, t.microbatches
    ops = _schedule(P, M)
    end = np.zeros((D, P))
    timed: list[list[dict[str, list[tuple[float, float]]]]] = [
        [{} for _ in range(P)] for _ in range(D)
    ]
    for d in range(D):
        f_done = np.full((P, M), np.nan)
        b_done = np.full((P, M), np.nan)
        free = start[d].copy()
        position = [0] * P
        while any(position[p] < len(ops[p]) for p in range(P)):
            progressed = False
            for p in range(P):
                if position[p] >= len(ops[p]):
                    continue
                kind, mb, recv = ops[p][position[p]]
                if kind == "F":
                    ready = free[p] if p == 0 else f_done[p - 1, mb] + link_s
                else:
                    ready = f_done[p, mb] if p == P - 1 else b_done[p + 1, mb] + link_s
                if np.isnan(ready):
                    continue
                begin = max(free[p], ready)
                log = timed[d][p]
                if (p > 0 and kind == "F") or (p < P - 1 and kind == "B"):
                    log.setdefault(recv, []).append((free[p], begin - free[p]))
                if kind == "F" and p in (0, P - 1):
                    log.setdefault("batch-generator", []).append((begin, 0.002))
                    begin += 0.002
                cost = fwd[d, p] if kind == "F" else bwd[d, p]
                name = "forward-compute" if kind == "F" else "backward-compute"
                log.setdefault(name, []).append((begin, cost))
                done = begin + cost
                if (kind == "F" and p < P - 1) or (kind == "B" and p > 0):
                    send = "forward-send" if kind == "F" else "backward-send"
                    log.setdefault(send, []).append((done, link_s))
                    done += link_s
                (f_done if kind == "F" else b_done)[p, mb] = done
                free[p] = done
                position[p] += 1
                progressed = True
            if not progressed:
                raise RuntimeError("1F1B schedule deadlocked")
        end[d] = free
    return end, timed


def simulate(t: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(timer log, placement). The timer log has a user's columns: rank, iteration, timer, start
    (epoch seconds), elapsed_ms; the placement: rank, host, dp, pp, tp."""
    rng = np.random.default_rng(t.seed)
    D, P, M = t.replicas, t.stages, t.microbatches
    # a healthy step ~ (M + P - 1) x (f + b) + the syncs and the optimizer
    unit = t.step_s * 0.93 / ((M + P - 1) * 3.0)
    f0, b0, link_s, allreduce_s, optimizer_s = (
        unit,
        2.0 * unit,
        0.004,
        0.02 * t.step_s,
        0.04 * t.step_s,
    )
    clock = np.full((D, P), T0)
    rows: list[tuple[int, int, str, float, float]] = []
    interval: dict[tuple[int, int], dict[str, float]] = {}
    logged_rows: list[tuple[int, int, dict[str, float]]] = []
    for step in range(t.first_step, t.first_step + t.steps):
        shared = float(rng.lognormal(0.0, t.job_noise))
        fwd = f0 * shared * rng.lognormal(0.0, t.noise, (D, P))
        bwd = b0 * shared * rng.lognormal(0.0, t.noise, (D, P))
        if t.slow is not None and step >= t.slow_from:
            fwd[t.slow] *= t.slow_fwd
            bwd[t.slow] *= t.slow_bwd
        begun = clock.copy()
        end, timed = _one_step(t, fwd, bwd, clock, link_s)
        synced = end.max(axis=0)  # per stage: the slowest replica's pipeline end
        opt = optimizer_s * shared * rng.lognormal(0.0, t.noise, (D, P))
        clip_wait = (synced[None, :] + allreduce_s + opt * 0.5).max() - (
            synced[None, :] + allreduce_s + opt * 0.5
        )
        for d in range(D):
            for p in range(P):
                log = timed[d][p]
                log["forward-backward"] = [(begun[d, p], end[d, p] - begun[d, p])]
                log["grads-all-reduce"] = [(end[d, p], synced[p] - end[d, p] + allreduce_s)]
                at = synced[p] + allreduce_s
                log["optimizer-copy-to-main-grad"] = [(at, opt[d, p] * 0.1)]
                log["optimizer-clip-main-grad"] = [
                    (at + opt[d, p] * 0.1, opt[d, p] * 0.2 + clip_wait[d, p])
                ]
                log["optimizer-inner-step"] = [
                    (at + opt[d, p] * 0.3 + clip_wait[d, p], opt[d, p] * 0.7)
                ]
                log["optimizer"] = [(at, opt[d, p] + clip_wait[d, p])]
                clock[d, p] = at + opt[d, p] + clip_wait[d, p]
                rank = t.global_rank(d, p)
                sums = interval.setdefault((d, p), {})
                for name, spans in log.items():
                    sums[name] = sums.get(name, 0.0) + sum(s for _, s in spans)
                logged = (step - t.first_step + 1) % t.log_interval == 0
                if not logged:
                    continue
                if t.shape == "instances":
                    rows += [
                        (rank, step, name, s, 1000.0 * v)
                        for name, spans in log.items()
                        for s, v in spans
                    ]
                else:
                    logged_rows.append((rank, step, sums))
                    interval[(d, p)] = {}
        clock[:] = clock.max()  # the next iteration's first p2p meets every stage
        # a parsed log: every rank's timers on the one line the logging rank wrote at the step's end
        rows += [
            (rank, step, name, float(clock.max()), 1000.0 * v / t.log_interval)
            for rank, step, sums in logged_rows
            for name, v in sums.items()
            if name not in t.drop
        ]
        logged_rows.clear()
    log_frame = pd.DataFrame(rows, columns=["rank", "iteration", "timer", "start", "elapsed_ms"])
    placement = pd.DataFrame(
        [(t.global_rank(d, p), t.node(d, p), d, p, 0) for d in range(D) for p in range(P)],
        columns=["rank", "host", "dp", "pp", "tp"],
    )
    return log_frame, placement


INGEST_MAP = [
    "--map",
    "step=iteration",
    "--map",
    "section=timer",
    "--map",
    "duration=elapsed_ms",
    "--duration-unit",
    "ms",
    "--placement-map",
    "node=host",
    "--placement-map",
    "dp_rank=dp",
    "--placement-map",
    "pp_rank=pp",
    "--placement-map",
    "tp_rank=tp",
]


def write_store(t: Trace, directory, store) -> None:
    """The trace as a collector beside the job would have written it: its steps and ranks rows,
    every reporting rank declaring the job's whole world size (P x D x tp)."""
    from pathlib import Path

    import pyarrow as pa

    from faultlens.collectors.artifacts.step_table import read_step_table
    from faultlens.collectors.store.sink import SegmentSink

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    log, placement = simulate(t)
    log.to_csv(directory / "timers.csv", index=False)
    placement.to_csv(directory / "placement.csv", index=False)
    tables = read_step_table(
        directory / "timers.csv",
        mapping={"step": "iteration", "section": "timer", "duration": "elapsed_ms"},
        duration_unit="ms",
        placement=directory / "placement.csv",
        placement_mapping={"node": "host", "dp_rank": "dp", "pp_rank": "pp", "tp_rank": "tp"},
        job_id="megatron-1",
    )
    ranks = tables.ranks
    column = ranks.schema.get_field_index("world_size")
    ranks = ranks.set_column(
        column,
        ranks.schema.field(column),
        pa.array([t.world_size] * ranks.num_rows, ranks.schema.field(column).type),
    )
    with SegmentSink(str(store), flush_rows=10_000_000, flush_age_s=3600) as sink:
        sink.write("steps", tables.steps)
        sink.write("ranks", ranks)


def ingest(t: Trace, directory, *, placement_map: tuple[str, ...] | None = None):
    """Write the trace's timer log and placement as CSV files into `directory` and ingest them the
    way a user would (`faultlens ingest steps`, in process); returns the store path."""
    from pathlib import Path

    from faultlens.controller.cli.main import main

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    log, placement = simulate(t)
    log.to_csv(directory / "timers.csv", index=False)
    placement.to_csv(directory / "placement.csv", index=False)
    store = directory / "store"
    pmap = (
        INGEST_MAP
        if placement_map is None
        else [*INGEST_MAP[:6], *(a for m in placement_map for a in ("--placement-map", m))]
    )
    code = main(
        [
            "ingest",
            "steps",
            str(directory / "timers.csv"),
            "--store",
            str(store),
            "--job",
            "megatron-1",
            "--placement",
            str(directory / "placement.csv"),
            *pmap,
        ]
    )
    if code:
        raise RuntimeError(f"ingest failed: {code}")
    return store
