"""The simulation driver: attempts of one training job on a cluster, faults that end them, restarts that exclude
the culprit node (as a supervisor would) and resume from the last checkpoint, and the noise in between.
Everything lands in the store through the real SegmentSink; the labels go to a separate JSONL file."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from faultlens.collectors.store.schema import rows_to_table
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.lab.fault_labels import FaultLabel, write_labels
from faultlens.controller.lab.simulate.cluster import Placement, make_nodes
from faultlens.controller.lab.simulate.config import SimConfig
from faultlens.controller.lab.simulate.faults import (
    BY_KIND,
    FAULTS,
    STRAGGLERS,
    FaultKind,
    Mode,
    Target,
    draw,
    pick_target,
)
from faultlens.controller.lab.simulate.gpu import GpuSampler
from faultlens.controller.lab.simulate.noise import BENIGN_KINDS, inject_benign
from faultlens.controller.lab.simulate.timing import StepTimer
from faultlens.controller.lab.simulate.world import NS, World

ROW_TABLES = ("ranks", "process_events", "gpu_events", "collectives", "checkpoints")


@dataclass(frozen=True)
class SimulationResult:
    store: str
    labels_path: str | None
    labels: list[FaultLabel]
    rows: dict[str, int]
    attempts: int
    elapsed_s: float
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    benign_by_kind: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"store": self.store, "labels": self.labels_path, "attempts": self.attempts,
                "faults": sum(self.faults_by_kind.values()), "faults_by_kind": self.faults_by_kind,
                "benign_by_kind": self.benign_by_kind, "rows": self.rows, "elapsed_s": round(self.elapsed_s, 2)}


def default_labels_path(store: str) -> str:
    """Labels live beside the store, never inside it: the engine must not be able to read them."""
    return str(store).rstrip("/") + ".labels.jsonl"


def _poisson_times(rng: np.random.Generator, start: int, end: int, per_day: float) -> list[int]:
    if per_day <= 0:
        return []
    count = rng.poisson(per_day * (end - start) / (86400 * NS))
    return sorted(int(x) for x in rng.uniform(start, end, count))


def simulate(cfg: SimConfig, store: str, labels_path: str | Path | None = None,
             progress: Callable[[float], None] | None = None) -> SimulationResult:
    """`progress` (optional) is called with the share of simulated time done, once per attempt."""
    began = time.perf_counter()
    rng_cluster = np.random.default_rng([cfg.seed, 1])
    rng_faults = np.random.default_rng([cfg.seed, 2])
    rng_timing = np.random.default_rng([cfg.seed, 3])
    rng_noise = np.random.default_rng([cfg.seed, 4])
    rng_misc = np.random.default_rng([cfg.seed, 5])

    expected_faults = cfg.faults_per_day * cfg.hours / 24.0
    spares = cfg.spare_nodes if cfg.spare_nodes is not None else int(expected_faults * 2.5 + 8)
    nodes = make_nodes(cfg.nodes + spares, cfg.gpus_per_node, rng_cluster)
    gpu_speed = {(n.name, g.index): float(np.clip(rng_cluster.normal(1.0, 0.012), 0.96, 1.04))
                 for n in nodes for g in n.gpus}
    world = World(cfg)
    world.spares = list(nodes[cfg.nodes:])
    placement = Placement(tuple(nodes[: cfg.nodes]), cfg.gpus_per_node, cfg.pipeline_stages)
    timer = StepTimer(cluster=cfg.cluster, job_id=cfg.job, step_seconds=cfg.step_seconds,
                      checkpoint_every=cfg.checkpoint_every_steps, eval_every=cfg.eval_every_steps,
                      warmup_steps=cfg.warmup_steps, day_origin_ns=cfg.start_ns, gpu_speed=gpu_speed)
    sink = _CountingSink(SegmentSink(store, flush_rows=2_000_000, flush_age_s=1e12))
    start, end = cfg.start_ns, cfg.end_ns

    # events that do not end the attempt: stragglers and benign noise, on their own clocks
    background: list[tuple[int, str, Any]] = []
    for t in _poisson_times(rng_noise, start, end, cfg.stragglers_per_day):
        background.append((t, "straggler", draw(STRAGGLERS, rng_noise)))
    kinds = list(BENIGN_KINDS)
    weights = np.array([BENIGN_KINDS[k] for k in kinds])
    for t in _poisson_times(rng_noise, start, end, cfg.benign_per_day):
        background.append((t, "benign", kinds[int(rng_noise.choice(len(kinds), p=weights / weights.sum()))]))
    background.sort(key=lambda e: e[0])
    bg_pos = 0

    mean_gap_ns = 86400 * NS / cfg.faults_per_day if cfg.faults_per_day > 0 else None
    sequence = [BY_KIND[name] for name in cfg.fault_sequence]
    drawn = 0
    busy: list[tuple[int, int]] = []
    attempt_starts: list[int] = []
    checkpoints: list[tuple[int, int, int]] = []  # (step, local_ts, durable_ts)
    t = start
    step = 0
    number = 0
    repeat: Target | None = None
    repeat_kind: FaultKind | None = None
    while t < end:
        if progress is not None:
            progress((t - start) / max(end - start, 1))
        init_s = rng_misc.uniform(120, 300) if number == 0 else rng_misc.uniform(45, 150)
        attempt = world.new_attempt(number, placement, t, t + int(init_s * NS), step, rng_misc)
        attempt_starts.append(t)
        for node in placement.nodes:
            world.effects.join(node.name, t)
        for place in placement.ranks():
            ts = t + int(rng_misc.uniform(0.5, 5.0) * NS)
            pid = attempt.pid(place.rank)
            world.add("ranks", {**world.identity(place, ts), "pid": pid, "world_size": placement.world_size,
                                "local_world_size": placement.tp_size, "hostname": place.node.name,
                                "dp_rank": place.dp_rank, "pp_rank": place.pp_rank, "tp_rank": place.tp_rank,
                                "cp_rank": 0, "ep_rank": 0, "pp_size": placement.pp_size})
            world.add("process_events", world.proc.start(ts, place, number, pid))
        first = attempt.first_step_start

        # the next fault from the mix (or the given sequence); health events and stragglers do not end the attempt
        health: list[tuple[int, FaultKind]] = []
        if repeat is not None and repeat_kind is not None:
            kind, t_fault = repeat_kind, None
        else:
            kind, t_fault = None, None
            cursor = first
            while mean_gap_ns is not None:
                cursor += int(rng_faults.exponential(mean_gap_ns))
                if sequence:
                    candidate = sequence[drawn % len(sequence)]
                    drawn += 1
                else:
                    candidate = draw(FAULTS, rng_faults)
                if cursor >= end or candidate.mode in (Mode.CRASH, Mode.HANG):
                    kind, t_fault = candidate, cursor
                    break
                health.append((cursor, candidate))
        stop = min(t_fault, end) if t_fault is not None else end

        # background events that fall into this attempt (or the downtime before it). A replayed software bug
        # ends its attempt at a step, not at a known time: its timing noise is left out and only the noise
        # that does not touch step timing (application Xids) is injected once the end is known.
        if repeat is None:
            bg_pos = _background(world, rng_noise, background, bg_pos, first, stop, timing=True)
        for when, which in health:
            if when < stop:
                background_target = pick_target(world, rng_faults, when)
                background_target.until = stop
                world.labels.append(which.strike(world, rng_faults, which, background_target).label)

        target = None
        if kind is not None and t_fault is not None and t_fault < end:
            target = kind.prepare(world, rng_faults, t_fault) if kind.prepare else pick_target(world, rng_faults,
                                                                                                t_fault)
        repeat_step = repeat.extra["step"] if repeat is not None else None
        spikes = [s for s in world.spikes if first <= s.t < stop]
        attempt.steps = timer.run(rng_timing, placement, number, step, first, stop, world.slowdowns, spikes,
                                  world.losses, sink.write, stop_at_step=repeat_step)
        if repeat is not None:
            t_fault = attempt.steps.next_start + int(rng_faults.uniform(0.3, 0.9) * cfg.step_seconds * NS)
            if attempt.steps.next_step != repeat_step or t_fault >= end:
                t_fault = None
            else:
                target = Target(t_fault, repeat.node, repeat.gpu, repeat.rank, extra=repeat.extra)
        if repeat is not None:
            bg_pos = _background(world, rng_noise, background, bg_pos, first,
                                 min(t_fault, end) if t_fault is not None else end, timing=False)
        busy.append((first, min(stop, t_fault) if t_fault is not None else stop))
        for ck_step, ck_end in attempt.steps.checkpoints:
            local_ts = ck_end + int(rng_misc.uniform(0.5, 3.0) * NS)
            durable_ts = ck_end + int(rng_misc.uniform(60, 300) * NS)
            checkpoints.append((ck_step, local_ts, durable_ts))
            _checkpoint_rows(world, placement, ck_step, local_ts, durable_ts, number)
        if target is None or t_fault is None or kind is None:
            break

        outcome = kind.strike(world, rng_faults, kind, target)
        world.labels.append(outcome.label)
        down = outcome.down_ts if outcome.down_ts is not None else t_fault
        limit = outcome.restore_before if outcome.restore_before is not None else t_fault
        usable = [c for c in checkpoints if (c[2] if outcome.exclude else c[1]) < limit]
        step = (max(usable)[0] + 1) if usable else 0
        if outcome.exclude:
            world.effects.leave(outcome.exclude, down)
            if not world.spares:
                raise RuntimeError("simulation ran out of spare nodes: raise spare_nodes")
            placement = placement.replace(outcome.exclude, world.spares.pop(0))
        if world.spares and rng_misc.random() < 0.25:
            # planned maintenance rotates a healthy node out at the restart too, as schedulers do: the next
            # attempt's placement says nothing certain about the culprit
            healthy = [n for n in placement.nodes if n.name != outcome.exclude]
            rotated = healthy[int(rng_misc.integers(0, len(healthy)))]
            world.effects.leave(rotated.name, down)
            placement = placement.replace(rotated.name, world.spares.pop(0))
        repeat, repeat_kind = (outcome.repeat, kind) if outcome.repeat is not None else (None, None)
        t = down + int(outcome.restart_delay_s * NS)
        number += 1

    # background events after the last attempt ended are dropped; close the node spans
    for spans in world.effects.presence.values():
        if spans and spans[-1][1] is None:
            spans[-1][1] = end
    sampler = GpuSampler(cluster=cfg.cluster, job_id=cfg.job, sample_ns=int(cfg.sample_seconds * NS),
                         seed=cfg.seed, busy=busy, attempt_starts=attempt_starts, end_ns=end)
    by_name = {n.name: (i, n) for i, n in enumerate(nodes)}
    for name in sorted(world.effects.presence):
        index, node = by_name[name]
        table, events = sampler.node_samples(node, world.effects.presence[name], world.effects, index)
        if table is not None:
            sink.write("gpu_samples", table)
        for row in events:
            world.add("gpu_events", row)
    for table_name in ROW_TABLES:
        rows = [r for r in world.rows.get(table_name, []) if r["ts"] < end]
        for i in range(0, len(rows), 200_000):
            sink.write(table_name, rows_to_table(table_name, rows[i:i + 200_000]))
    sink.close()

    labels = sorted(world.labels, key=lambda label: (label.injected_ts, label.fault_id))
    labels_out = str(labels_path) if labels_path is not None else default_labels_path(store)
    write_labels(labels, labels_out)
    counts = Counter(label.kind for label in labels if label.is_fault)
    benign = Counter(label.kind for label in labels if not label.is_fault)
    rows_by_table = dict(sorted(sink.rows.items()))
    return SimulationResult(store=str(store), labels_path=labels_out, labels=labels, rows=rows_by_table,
                            attempts=number + 1, elapsed_s=time.perf_counter() - began,
                            faults_by_kind=dict(sorted(counts.items())), benign_by_kind=dict(sorted(benign.items())))


def _background(world: World, rng: np.random.Generator, background: list[tuple[int, str, Any]], pos: int,
                first: int, stop: int, *, timing: bool) -> int:
    """Inject the background events before `stop`; returns the position of the first one not taken."""
    while pos < len(background) and background[pos][0] < stop:
        when, what, which = background[pos]
        pos += 1
        if what == "benign":
            if not timing and which != "benign_app_xid":
                continue
            label = inject_benign(world, rng, which, when, running=when >= first)
            if label is not None:
                world.labels.append(label)
            continue
        if not timing:
            continue
        if when < first:
            when = first + int(rng.uniform(60, 600) * NS)
            if when >= stop:
                continue
        target = pick_target(world, rng, when)
        target.until = stop
        world.labels.append(which.strike(world, rng, which, target).label)
    return pos


def _checkpoint_rows(world: World, placement: Placement, step: int, local_ts: int, durable_ts: int,
                     attempt: int) -> None:
    cfg = world.cfg
    base = {"cluster": cfg.cluster, "job_id": cfg.job, "attempt": attempt, "step": step, "layout": "dcp",
            "world_size": placement.world_size, "complete": True, "checksum_status": "verified"}
    for node in placement.nodes:
        world.add("checkpoints", {**base, "ts": local_ts, "node": node.name, "tier": "local",
                                  "uri": f"file:///local_nvme/ckpt/{cfg.job}/step-{step:07d}",
                                  "bytes": 152 * 1024**3})
    world.add("checkpoints", {**base, "ts": durable_ts, "node": None, "tier": "durable",
                              "uri": f"s3://checkpoints/{cfg.job}/step-{step:07d}", "bytes": 152 * 1024**3 * len(
                                  placement.nodes)})


class _CountingSink:
    def __init__(self, sink: SegmentSink) -> None:
        self.sink = sink
        self.rows: Counter[str] = Counter()

    def write(self, table: str, data: Any) -> None:
        self.sink.write(table, data)
        self.rows[table] += data.num_rows

    def close(self) -> None:
        self.sink.close()
