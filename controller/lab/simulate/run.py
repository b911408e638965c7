"""The simulation driver: attempts of one training job on a cluster, faults that end them, restarts
that exclude the culprit node (as a supervisor would) and resume from the last checkpoint, and the
noise in between. Everything lands in the store through the real SegmentSink; the labels go to a
separate JSONL file."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from faultlens.collectors.store.schema import Role, rows_to_table, tables_with
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.lab.fault_labels import FaultLabel, write_labels
from faultlens.controller.lab.simulate.cluster import Node, Placement, make_nodes
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
from faultlens.controller.lab.simulate.numerics_rows import digest_table
from faultlens.controller.lab.simulate.timing import StepTimer
from faultlens.controller.lab.simulate.world import NS, Attempt, World

ROW_TABLES = tables_with(Role.SIMULATED_ROWS)  # collected as rows, written at the end


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
        return {
            "store": self.store,
            "labels": self.labels_path,
            "attempts": self.attempts,
            "faults": sum(self.faults_by_kind.values()),
            "faults_by_kind": self.faults_by_kind,
            "benign_by_kind": self.benign_by_kind,
            "rows": self.rows,
            "elapsed_s": round(self.elapsed_s, 2),
        }


def default_labels_path(store: str) -> str:
    """Labels live beside the store, never inside it: the engine must not be able to read them."""
    return str(store).rstrip("/") + ".labels.jsonl"


def _poisson_times(rng: np.random.Generator, start: int, end: int, per_day: float) -> list[int]:
    if per_day <= 0:
        return []
    count = rng.poisson(per_day * (end - start) / (86400 * NS))
    return sorted(int(x) for x in rng.uniform(start, end, count))


@dataclass(frozen=True)
class _Rngs:
    """One generator per concern, so that a change in one (say the fault mix) leaves the others'
    draws alone.
    """

    cluster: np.random.Generator
    faults: np.random.Generator
    timing: np.random.Generator
    noise: np.random.Generator
    misc: np.random.Generator

    @classmethod
    def for_seed(cls, seed: int) -> _Rngs:
        return cls(*(np.random.default_rng([seed, i]) for i in range(1, 6)))


def simulate(cfg: SimConfig, store: str, labels_path: str | Path | None = None,
             progress: Callable[[float], None] | None = None) -> SimulationResult:
    """`progress` (optional) is called with the share of simulated time done, once per attempt."""
    began = time.perf_counter()
    rngs = _Rngs.for_seed(cfg.seed)
    expected_faults = cfg.faults_per_day * cfg.hours / 24.0
    spares = cfg.spare_nodes if cfg.spare_nodes is not None else int(expected_faults * 2.5 + 8)
    nodes = make_nodes(cfg.nodes + spares, cfg.gpus_per_node, rngs.cluster)
    gpu_speed = {(n.name, g.index): float(np.clip(rngs.cluster.normal(1.0, 0.012), 0.96, 1.04))
                 for n in nodes for g in n.gpus}
    world = World(cfg)
    world.spares = list(nodes[cfg.nodes:])
    placement = Placement(tuple(nodes[: cfg.nodes]), cfg.gpus_per_node, cfg.pipeline_stages)
    timer = StepTimer(
        cluster=cfg.cluster,
        job_id=cfg.job,
        step_seconds=cfg.step_seconds,
        checkpoint_every=cfg.checkpoint_every_steps,
        eval_every=cfg.eval_every_steps,
        warmup_steps=cfg.warmup_steps,
        day_origin_ns=cfg.start_ns,
        gpu_speed=gpu_speed,
    )
    sink = _CountingSink(SegmentSink(store, flush_rows=2_000_000, flush_age_s=1e12))
    job = _Attempts(
        cfg, world, placement, timer, sink, rngs, background=_background_events(cfg, rngs.noise)
    )
    job.run(progress)
    # background events after the last attempt ended are dropped; close the node spans
    for spans in world.effects.presence.values():
        if spans and spans[-1][1] is None:
            spans[-1][1] = cfg.end_ns
    _write_gpu_telemetry(cfg, world, nodes, job, sink)
    _write_rows(world, sink, cfg.end_ns)
    sink.close()

    labels = sorted(world.labels, key=lambda label: (label.injected_ts, label.fault_id))
    labels_out = str(labels_path) if labels_path is not None else default_labels_path(store)
    write_labels(labels, labels_out)
    counts = Counter(label.kind for label in labels if label.is_fault)
    benign = Counter(label.kind for label in labels if not label.is_fault)
    rows_by_table = dict(sorted(sink.rows.items()))
    return SimulationResult(
        store=str(store),
        labels_path=labels_out,
        labels=labels,
        rows=rows_by_table,
        attempts=job.number + 1,
        elapsed_s=time.perf_counter() - began,
        faults_by_kind=dict(sorted(counts.items())),
        benign_by_kind=dict(sorted(benign.items())),
    )


def _background_events(cfg: SimConfig, rng: np.random.Generator) -> list[tuple[int, str, Any]]:
    """The events that do not end an attempt, stragglers and benign noise, on their own clocks, in
    time order.
    """
    start, end = cfg.start_ns, cfg.end_ns
    background: list[tuple[int, str, Any]] = []
    for t in _poisson_times(rng, start, end, cfg.stragglers_per_day):
        background.append((t, "straggler", draw(STRAGGLERS, rng)))
    kinds = list(BENIGN_KINDS)
    weights = np.array([BENIGN_KINDS[k] for k in kinds])
    for t in _poisson_times(rng, start, end, cfg.benign_per_day):
        background.append(
            (t, "benign", kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))])
        )
    background.sort(key=lambda e: e[0])
    return background


@dataclass
class _Attempts:
    """The job's attempts, one after the other: each runs until the next fault that ends it (or the
    end of the simulated time); the restart excludes the culprit node and resumes from the last
    usable checkpoint. Holds what carries over from one attempt to the next."""

    cfg: SimConfig
    world: World
    placement: Placement
    timer: StepTimer
    sink: _CountingSink
    rngs: _Rngs
    background: list[tuple[int, str, Any]]
    bg_pos: int = 0
    drawn: int = 0  # faults taken from cfg.fault_sequence so far
    busy: list[tuple[int, int]] = field(default_factory=list)
    attempt_starts: list[int] = field(default_factory=list)
    # (step, local_ts, durable_ts)
    checkpoints: list[tuple[int, int, int]] = field(default_factory=list)
    step: int = 0
    number: int = 0
    repeat: Target | None = None
    repeat_kind: FaultKind | None = None

    def run(self, progress: Callable[[float], None] | None) -> None:
        start, end = self.cfg.start_ns, self.cfg.end_ns
        t = start
        while t < end:
            if progress is not None:
                progress((t - start) / max(end - start, 1))
            attempt = self._start_attempt(t)
            fault = self._run_attempt(attempt)
            if fault is not None:
                t = self._restart(*fault)
            self._numerics(attempt)  # after the strike: a flip it made shows in the digests
            if fault is None:
                break

    def _numerics(self, attempt: Attempt) -> None:
        every = self.cfg.numerics_every
        if every > 0:
            table = digest_table(self.cfg.cluster, self.cfg.job, attempt, every, self.world.flips)
            if table is not None:
                self.sink.write("numerics", table)

    def _start_attempt(self, t: int) -> Attempt:
        """The attempt's ranks join at t: their rank rows and start events."""
        world, placement, rng = self.world, self.placement, self.rngs.misc
        init_s = rng.uniform(120, 300) if self.number == 0 else rng.uniform(45, 150)
        attempt = world.new_attempt(self.number, placement, t, t + int(init_s * NS), self.step, rng)
        self.attempt_starts.append(t)
        for node in placement.nodes:
            world.effects.join(node.name, t)
        for place in placement.ranks():
            ts = t + int(rng.uniform(0.5, 5.0) * NS)
            pid = attempt.pid(place.rank)
            world.add(
                "ranks",
                {
                    **world.identity(place, ts),
                    "pid": pid,
                    "world_size": placement.world_size,
                    "local_world_size": placement.tp_size,
                    "hostname": place.node.name,
                    "dp_rank": place.dp_rank,
                    "pp_rank": place.pp_rank,
                    "tp_rank": place.tp_rank,
                    "cp_rank": 0,
                    "ep_rank": 0,
                    "pp_size": placement.pp_size,
                },
            )
            world.add("process_events", world.proc.start(ts, place, self.number, pid))
        return attempt

    def _next_fault(
        self, first: int
    ) -> tuple[FaultKind | None, int | None, list[tuple[int, FaultKind]]]:
        """The next fault that ends the attempt (kind, time) from the mix or the given sequence, and
        the health events drawn before it (they do not end the attempt). A repeating bug comes back
        with no time yet."""
        if self.repeat is not None and self.repeat_kind is not None:
            return self.repeat_kind, None, []
        cfg, rng = self.cfg, self.rngs.faults
        mean_gap_ns = 86400 * NS / cfg.faults_per_day if cfg.faults_per_day > 0 else None
        sequence = [BY_KIND[name] for name in cfg.fault_sequence]
        health: list[tuple[int, FaultKind]] = []
        cursor = first
        while mean_gap_ns is not None:
            cursor += int(rng.exponential(mean_gap_ns))
            if sequence:
                candidate = sequence[self.drawn % len(sequence)]
                self.drawn += 1
            else:
                candidate = draw(FAULTS, rng)
            if cursor >= cfg.end_ns or candidate.mode in (Mode.CRASH, Mode.HANG, Mode.NUMERICS):
                return candidate, cursor, health
            health.append((cursor, candidate))
        return None, None, health

    def _run_attempt(self, attempt: Attempt) -> tuple[FaultKind, Target, int] | None:
        """Inject what falls into the attempt and time its steps; the fault that ends it (kind,
        target, time), or None when the simulated time ends first."""
        world, rngs, end = self.world, self.rngs, self.cfg.end_ns
        first = attempt.first_step_start
        kind, t_fault, health = self._next_fault(first)
        stop = min(t_fault, end) if t_fault is not None else end
        # background events that fall into this attempt (or the downtime before it). A replayed
        # software bug ends its attempt at a step, not at a known time: its timing noise is left out
        # and only the noise that does not touch step timing (application Xids) is injected once the
        # end is known.
        if self.repeat is None:
            self.bg_pos = _background(
                world, rngs.noise, self.background, self.bg_pos, first, stop, timing=True
            )
        for when, which in health:
            if when < stop:
                background_target = pick_target(world, rngs.faults, when)
                background_target.until = stop
                world.labels.append(
                    which.strike(world, rngs.faults, which, background_target).label
                )
        target = None
        if kind is not None and t_fault is not None and t_fault < end:
            target = (
                kind.prepare(world, rngs.faults, t_fault)
                if kind.prepare
                else pick_target(world, rngs.faults, t_fault)
            )
        repeat_step = self.repeat.extra["step"] if self.repeat is not None else None
        spikes = [s for s in world.spikes if first <= s.t < stop]
        attempt.steps = self.timer.run(
            rngs.timing,
            self.placement,
            self.number,
            self.step,
            first,
            stop,
            world.slowdowns,
            spikes,
            world.losses,
            self.sink.write,
            stop_at_step=repeat_step,
        )
        if self.repeat is not None:
            t_fault, target = self._repeat_at_step(attempt, self.repeat, repeat_step)
            self.bg_pos = _background(
                world,
                rngs.noise,
                self.background,
                self.bg_pos,
                first,
                min(t_fault, end) if t_fault is not None else end,
                timing=False,
            )
        self.busy.append((first, min(stop, t_fault) if t_fault is not None else stop))
        for ck_step, ck_end in attempt.steps.checkpoints:
            local_ts = ck_end + int(rngs.misc.uniform(0.5, 3.0) * NS)
            durable_ts = ck_end + int(rngs.misc.uniform(60, 300) * NS)
            self.checkpoints.append((ck_step, local_ts, durable_ts))
            _checkpoint_rows(world, self.placement, ck_step, local_ts, durable_ts, self.number)
        if target is None or t_fault is None or kind is None:
            return None
        return kind, target, t_fault

    def _repeat_at_step(
        self, attempt: Attempt, repeat: Target, repeat_step: int | None
    ) -> tuple[int | None, Target | None]:
        """A repeating bug fires again in the step it fired in before, if the attempt got there
        before the end.
        """
        t_fault = attempt.steps.next_start + int(
            self.rngs.faults.uniform(0.3, 0.9) * self.cfg.step_seconds * NS
        )
        if attempt.steps.next_step != repeat_step or t_fault >= self.cfg.end_ns:
            return None, None
        return t_fault, Target(t_fault, repeat.node, repeat.gpu, repeat.rank, extra=repeat.extra)

    def _restart(self, kind: FaultKind, target: Target, t_fault: int) -> int:
        """Strike the fault; the next attempt resumes from the last checkpoint usable after it, on a
        placement without the excluded node (and, at times, without a healthy node rotated out).
        Returns its start."""
        world, rng = self.world, self.rngs.misc
        outcome = kind.strike(world, self.rngs.faults, kind, target)
        world.labels.append(outcome.label)
        down = outcome.down_ts if outcome.down_ts is not None else t_fault
        limit = outcome.restore_before if outcome.restore_before is not None else t_fault
        usable = [c for c in self.checkpoints if (c[2] if outcome.exclude else c[1]) < limit]
        self.step = (max(usable)[0] + 1) if usable else 0
        if outcome.exclude:
            world.effects.leave(outcome.exclude, down)
            if not world.spares:
                raise RuntimeError("simulation ran out of spare nodes: raise spare_nodes")
            self.placement = self.placement.replace(outcome.exclude, world.spares.pop(0))
        if world.spares and rng.random() < 0.25:
            # planned maintenance rotates a healthy node out at the restart too, as schedulers do:
            # the next attempt's placement says nothing certain about the culprit
            healthy = [n for n in self.placement.nodes if n.name != outcome.exclude]
            rotated = healthy[int(rng.integers(0, len(healthy)))]
            world.effects.leave(rotated.name, down)
            self.placement = self.placement.replace(rotated.name, world.spares.pop(0))
        self.repeat, self.repeat_kind = (
            (outcome.repeat, kind) if outcome.repeat is not None else (None, None)
        )
        self.number += 1
        return down + int(outcome.restart_delay_s * NS)


def _write_gpu_telemetry(cfg: SimConfig, world: World, nodes: list[Node], job: _Attempts,
                         sink: _CountingSink) -> None:
    """GPU samples and GPU events of every node over its spans in the job (busy while an attempt
    ran).
    """
    sampler = GpuSampler(
        cluster=cfg.cluster,
        job_id=cfg.job,
        sample_ns=int(cfg.sample_seconds * NS),
        seed=cfg.seed,
        busy=job.busy,
        attempt_starts=job.attempt_starts,
        end_ns=cfg.end_ns,
    )
    by_name = {n.name: (i, n) for i, n in enumerate(nodes)}
    for name in sorted(world.effects.presence):
        index, node = by_name[name]
        table, events = sampler.node_samples(
            node, world.effects.presence[name], world.effects, index
        )
        if table is not None:
            sink.write("gpu_samples", table)
        for row in events:
            world.add("gpu_events", row)


def _write_rows(world: World, sink: _CountingSink, end: int) -> None:
    """The row tables, what happened before the end, in batches."""
    for table_name in ROW_TABLES:
        rows = [r for r in world.rows.get(table_name, []) if r["ts"] < end]
        for i in range(0, len(rows), 200_000):
            sink.write(table_name, rows_to_table(table_name, rows[i:i + 200_000]))


def _background(
    world: World,
    rng: np.random.Generator,
    background: list[tuple[int, str, Any]],
    pos: int,
    first: int,
    stop: int,
    *,
    timing: bool,
) -> int:
    """Inject the background events before `stop`; returns the position of the first one not taken.
    """
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
    base = {
        "cluster": cfg.cluster,
        "job_id": cfg.job,
        "attempt": attempt,
        "step": step,
        "layout": "dcp",
        "world_size": placement.world_size,
        "complete": True,
        "checksum_status": "verified",
    }
    for node in placement.nodes:
        world.add("checkpoints", {**base, "ts": local_ts, "node": node.name, "tier": "local",
                                  "uri": f"file:///local_nvme/ckpt/{cfg.job}/step-{step:07d}",
                                  "bytes": 152 * 1024**3})
    world.add(
        "checkpoints",
        {
            **base,
            "ts": durable_ts,
            "node": None,
            "tier": "durable",
            "uri": f"s3://checkpoints/{cfg.job}/step-{step:07d}",
            "bytes": 152 * 1024**3 * len(placement.nodes),
        },
    )


class _CountingSink:
    def __init__(self, sink: SegmentSink) -> None:
        self.sink = sink
        self.rows: Counter[str] = Counter()

    def write(self, table: str, data: Any) -> None:
        self.sink.write(table, data)
        self.rows[table] += data.num_rows

    def close(self) -> None:
        self.sink.close()
