"""GPU samples as the NVML source writes them, and the events it derives from sample deltas.

Each physical GPU has stable traits (temperature and power offsets, a slow trickle of corrected ECC
errors on a few GPUs). Faults and noise change a GPU through *conditions* (a time window of heat,
lower clocks, clocks-event reason bits) and *counter changes* (an uncorrectable ECC error, a pending
row remap, a recovery action). Event rows for thermal/power slowdowns, new DBEs, remap flags and
recovery actions are derived from consecutive samples, exactly as the collector does it, so events
and samples can never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.sources.gpu_deltas import sample_changes
from faultlens.collectors.store.schema import TABLES, ts_array
from faultlens.controller.lab.simulate.cluster import GPU_NAME, MEM_TOTAL_BYTES, Node
from faultlens.controller.lab.simulate.xid import GpuEventFactory

# clocks-event reason bits (nvmlClocksEventReason*)
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THERMAL_BITS = SW_THERMAL | HW_THERMAL
POWER_BITS = HW_POWER_BRAKE

MAX_SM_CLOCK = 1980
IDLE_SM_CLOCK = 345
MEM_CLOCK = 2619

COUNTERS = (
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "ecc_dram_corrected",
    "ecc_dram_uncorrected",
    "ecc_sram_corrected",
    "ecc_sram_uncorrected",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "pcie_replay_count",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_errors",
)
LEVELS = ("remap_pending", "remap_failure", "recovery_action")
# counters whose change the NVML source turns into events (a corrected-error trickle does not move
# these)
DELTA_COUNTERS = (
    "ecc_dbe_volatile",
    "ecc_dbe_aggregate",
    "ecc_dram_uncorrected",
    "ecc_sram_uncorrected",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_errors",
    "pcie_replay_count",
)


@dataclass(frozen=True)
class GpuCondition:
    node: str
    gpu: int
    t0: int
    t1: int
    temp_add: float = 0.0
    sm_clock_mult: float = 1.0
    power_mult: float = 1.0
    reasons: int = 0


@dataclass(frozen=True)
class CounterChange:
    node: str
    gpu: int
    t: int
    name: str  # one of COUNTERS (delta) or LEVELS (value from t on)
    delta: int = 0
    value: Any = None


@dataclass
class GpuEffects:
    """Everything that makes a GPU's samples differ from its healthy baseline."""

    conditions: list[GpuCondition] = field(default_factory=list)
    changes: list[CounterChange] = field(default_factory=list)
    # NVML can no longer read the GPU
    gpu_stop: dict[tuple[str, int], int] = field(default_factory=dict)
    # node -> [[t0, t1]]
    presence: dict[str, list[list[int]]] = field(default_factory=lambda: defaultdict(list))

    def join(self, node: str, t: int) -> None:
        spans = self.presence[node]
        if not spans or spans[-1][1] is not None:
            spans.append([t, None])

    def leave(self, node: str, t: int) -> None:
        spans = self.presence.get(node)
        if spans and spans[-1][1] is None:
            spans[-1][1] = t


def _interval_mask(ticks: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(len(ticks), dtype=bool)
    idx = np.searchsorted(starts, ticks, side="right") - 1
    ok = idx >= 0
    mask = np.zeros(len(ticks), dtype=bool)
    mask[ok] = ticks[ok] < ends[idx[ok]]
    return mask


@dataclass(frozen=True)
class _Series:
    """The sampled gauges of a node's GPUs, (GPU, tick) arrays: healthy baseline first, then the
    conditions.
    """

    temp: np.ndarray
    hbm: np.ndarray
    power: np.ndarray
    sm_clock: np.ndarray
    util: np.ndarray
    mem_util: np.ndarray
    mem_used: np.ndarray
    reasons: np.ndarray  # clocks-event reason bits

    @classmethod
    def draw(cls, rng: np.random.Generator, busy: np.ndarray, n_gpu: int) -> _Series:
        n = len(busy)
        temp_off = rng.normal(0, 2.5, n_gpu)[:, None]
        power_off = rng.normal(0, 15, n_gpu)[:, None]
        temp = np.where(busy, 64.0, 35.0) + temp_off + rng.normal(0, 1.2, (n_gpu, n))
        hbm = temp + np.where(busy, 6.0, 2.0) + rng.normal(0, 0.8, (n_gpu, n))
        power = (
            np.where(busy, 640.0, 72.0)
            + np.where(busy, power_off, power_off / 6)
            + rng.normal(0, 18, (n_gpu, n))
        )
        sm_clock = np.where(busy, MAX_SM_CLOCK, IDLE_SM_CLOCK) * np.ones((n_gpu, 1))
        util = np.where(busy, np.clip(rng.normal(98.5, 1.0, (n_gpu, n)), 80, 100), 0.0)
        mem_util = np.where(busy, np.clip(rng.normal(42, 4, (n_gpu, n)), 0, 100), 0.0)
        mem_used = np.where(busy, 74.5e9 + rng.normal(0, 4e8, (n_gpu, n)), 5.2e8)
        reasons = np.where(busy, 0, GPU_IDLE) * np.ones((n_gpu, 1), dtype=np.int64)
        reasons = reasons.astype(np.int64)
        # benign: brief software power capping at high load (very common on H100s)
        capped = busy & (rng.random((n_gpu, n)) < 0.03)
        reasons |= np.where(capped, SW_POWER_CAP, 0)
        sm_clock = np.where(capped, sm_clock * 0.97, sm_clock)
        return cls(temp, hbm, power, sm_clock, util, mem_util, mem_used, reasons)

    def apply(
        self, conditions: list[GpuCondition], node: str, ticks: np.ndarray, busy: np.ndarray
    ) -> None:
        """The node's conditions (heat, lower clocks, reason bits) while its GPUs are busy in their
        windows.
        """
        for cond in conditions:
            if cond.node != node:
                continue
            window = (ticks >= cond.t0) & (ticks < cond.t1) & busy
            g = cond.gpu
            self.temp[g] = np.where(window, self.temp[g] + cond.temp_add, self.temp[g])
            self.hbm[g] = np.where(window, self.hbm[g] + cond.temp_add * 0.7, self.hbm[g])
            self.sm_clock[g] = np.where(
                window, self.sm_clock[g] * cond.sm_clock_mult, self.sm_clock[g]
            )
            self.power[g] = np.where(window, self.power[g] * cond.power_mult, self.power[g])
            self.reasons[g] = np.where(window, self.reasons[g] | cond.reasons, self.reasons[g])


def _counters(rng: np.random.Generator, changes: list[CounterChange], node: str, ticks: np.ndarray,
              n_gpu: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The error counters (COUNTERS) and levels (LEVELS) of a node's GPUs at each tick: each GPU's
    baseline history and the node's counter changes."""
    n = len(ticks)
    counters = {name: np.zeros((n_gpu, n), dtype=np.int64) for name in COUNTERS}
    # baseline history of each GPU: a few corrected errors and correctable remaps on some
    base_sbe = rng.poisson(0.6, n_gpu) * rng.integers(1, 30, n_gpu)
    trickle = rng.random(n_gpu) < 0.15
    for g in range(n_gpu):
        if trickle[g]:
            hits = np.cumsum(rng.random(n) < 0.004)
            counters["ecc_sbe_volatile"][g] = hits
            counters["ecc_dram_corrected"][g] = hits
        counters["ecc_sbe_aggregate"][g] = counters["ecc_sbe_volatile"][g] + base_sbe[g]
        counters["remapped_rows_correctable"][g] = int(rng.random() < 0.1) * int(rng.integers(1, 3))
    levels: dict[str, np.ndarray] = {
        "remap_pending": np.zeros((n_gpu, n), dtype=bool),
        "remap_failure": np.zeros((n_gpu, n), dtype=bool),
        "recovery_action": np.zeros((n_gpu, n), dtype=np.int32),
    }
    for change in changes:
        if change.node != node:
            continue
        after = ticks >= change.t
        if change.name in counters:
            counters[change.name][change.gpu] += np.where(after, change.delta, 0)
        else:
            levels[change.name][change.gpu] = np.where(
                after, change.value, levels[change.name][change.gpu]
            )
    return counters, levels


class GpuSampler:
    """Generates gpu_samples tables per node and the sample-delta gpu_events rows."""

    def __init__(
        self,
        *,
        cluster: str,
        job_id: str,
        sample_ns: int,
        seed: int,
        busy: list[tuple[int, int]],
        attempt_starts: list[int],
        end_ns: int,
    ) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.sample_ns = sample_ns
        self.seed = seed
        busy = sorted(busy)
        self.busy_starts = np.array([b[0] for b in busy], dtype=np.int64)
        self.busy_ends = np.array([b[1] for b in busy], dtype=np.int64)
        self.attempt_starts = np.array(attempt_starts, dtype=np.int64)
        self.end_ns = end_ns
        self.events = GpuEventFactory(cluster, job_id)

    def node_samples(self, node: Node, spans: list[list[int]], effects: GpuEffects,
                     node_index: int) -> tuple[pa.Table | None, list[dict[str, Any]]]:
        """The node's samples over its spans in the job (None when no tick falls into them) and the
        events derived from them."""
        rng = np.random.default_rng([self.seed, 7, node_index])
        ticks = self._ticks(rng, spans)
        if ticks is None:
            return None, []
        n_gpu = len(node.gpus)
        busy = _interval_mask(ticks, self.busy_starts, self.busy_ends)
        attempt = np.searchsorted(self.attempt_starts, ticks, side="right") - 1
        attempt = np.maximum(attempt, 0).astype(np.int32)
        series = _Series.draw(rng, busy, n_gpu)
        series.apply(effects.conditions, node.name, ticks, busy)
        counters, levels = _counters(rng, effects.changes, node.name, ticks, n_gpu)
        alive = np.ones((n_gpu, len(ticks)), dtype=bool)
        for g in range(n_gpu):
            stop = effects.gpu_stop.get((node.name, g))
            if stop is not None:
                alive[g] = ticks < stop
        # power integrates into the energy counter (mJ)
        dt_s = self.sample_ns / 1e9
        energy = rng.integers(10**9, 5 * 10**9, n_gpu)[:, None] + np.cumsum(
            series.power * dt_s * 1000, axis=1
        )
        energy = energy.astype(np.int64)
        table = self._table(node, ticks, attempt, alive, series, energy, {**counters, **levels})
        events = self._derived_events(
            node, ticks, attempt, alive, series.reasons, counters, levels, series.temp
        )
        return table, events

    def _ticks(self, rng: np.random.Generator, spans: list[list[int]]) -> np.ndarray | None:
        """The sample times inside the spans, on the node's own phase of the sampling interval."""
        tick_parts = []
        offset = int(rng.integers(0, self.sample_ns))
        for t0, t1 in spans:
            t1 = self.end_ns if t1 is None else min(t1, self.end_ns)
            first = t0 + (offset - t0) % self.sample_ns
            if first < t1:
                tick_parts.append(np.arange(first, t1, self.sample_ns, dtype=np.int64))
        return np.concatenate(tick_parts) if tick_parts else None

    def _table(
        self,
        node: Node,
        ticks: np.ndarray,
        attempt: np.ndarray,
        alive: np.ndarray,
        series: _Series,
        energy: np.ndarray,
        counters: dict[str, np.ndarray],
    ) -> pa.Table:
        """The gpu_samples rows of the GPUs alive at each tick (`counters`: the counters and
        levels).
        """
        n_gpu, n = alive.shape
        sel = alive.ravel()
        gpu_idx = np.repeat(np.arange(n_gpu, dtype=np.int32), n)[sel]
        flat_ticks = np.tile(ticks, n_gpu)[sel]
        uuids = np.array([g.uuid for g in node.gpus], dtype=object)
        pcis = np.array([g.pci_bus_id for g in node.gpus], dtype=object)
        rows = int(sel.sum())

        def col(values: np.ndarray) -> np.ndarray:
            return values.ravel()[sel]

        data: dict[str, Any] = {
            "ts": ts_array(flat_ticks),
            "cluster": pa.array([self.cluster] * rows, pa.string()),
            "node": pa.array([node.name] * rows, pa.string()),
            "job_id": pa.array([self.job_id] * rows, pa.string()),
            "attempt": pa.array(np.tile(attempt, n_gpu)[sel], pa.int32()),
            "gpu_index": pa.array(gpu_idx, pa.int32()),
            "gpu_uuid": pa.array(uuids[gpu_idx], pa.string()),
            "pci_bus_id": pa.array(pcis[gpu_idx], pa.string()),
            "source": pa.array(["nvml"] * rows, pa.string()),
            "gpu_name": pa.array([GPU_NAME] * rows, pa.string()),
            "temp_c": pa.array(np.round(col(series.temp)).astype(np.float32)),
            "hbm_temp_c": pa.array(np.round(col(series.hbm)).astype(np.float32)),
            "power_w": pa.array(np.round(col(series.power), 2).astype(np.float32)),
            "energy_mj": pa.array(col(energy)),
            "sm_clock_mhz": pa.array(np.round(col(series.sm_clock) / 15) .astype(np.int32) * 15),
            "mem_clock_mhz": pa.array(np.full(rows, MEM_CLOCK, dtype=np.int32)),
            "gpu_util_pct": pa.array(np.round(col(series.util)).astype(np.float32)),
            "mem_util_pct": pa.array(np.round(col(series.mem_util)).astype(np.float32)),
            "mem_used_bytes": pa.array(col(series.mem_used).astype(np.int64)),
            "mem_total_bytes": pa.array(np.full(rows, MEM_TOTAL_BYTES, dtype=np.int64)),
            "clocks_event_reasons": pa.array(col(series.reasons)),
            "retired_pages_sbe": pa.array(np.zeros(rows, dtype=np.int64)),
            "retired_pages_dbe": pa.array(np.zeros(rows, dtype=np.int64)),
            "retired_pages_pending": pa.array(np.zeros(rows, dtype=bool)),
        }
        for name, values in counters.items():
            data[name] = pa.array(col(values))
        schema = TABLES["gpu_samples"]
        return pa.table(
            {f.name: data.get(f.name, pa.nulls(rows, f.type)) for f in schema}, schema=schema
        )

    def _derived_events(
        self,
        node: Node,
        ticks: np.ndarray,
        attempt: np.ndarray,
        alive: np.ndarray,
        reasons: np.ndarray,
        counters: dict[str, np.ndarray],
        levels: dict[str, np.ndarray],
        temp: np.ndarray,
    ) -> list[dict[str, Any]]:
        """What the NVML source makes of consecutive samples of one GPU: its own sample_changes() on
        every pair of samples where a watched value moved (and on the first sample)."""
        rows: list[dict[str, Any]] = []
        watched = {**{name: counters[name] for name in DELTA_COUNTERS}, **levels,
                   "slowdown_bits": reasons & (THERMAL_BITS | POWER_BITS)}
        for g, gpu in enumerate(node.gpus):
            idx = np.flatnonzero(alive[g])
            if len(idx) == 0:
                continue
            moved = np.zeros(len(idx), dtype=bool)
            moved[0] = True
            for values in watched.values():
                series = values[g][idx]
                moved[1:] |= series[1:] != series[:-1]
            for j in np.flatnonzero(moved):
                at = idx[j]
                cur = self._reading(at, g, reasons, counters, levels, temp)
                prev = (
                    self._reading(idx[j - 1], g, reasons, counters, levels, temp) if j > 0 else None
                )
                elapsed = (ticks[at] - ticks[idx[j - 1]]) / 1e9 if j > 0 else None
                for change in sample_changes(prev, cur, elapsed):
                    rows.append(
                        self.events.sample_event(
                            int(ticks[at]),
                            node,
                            gpu,
                            int(attempt[at]),
                            change.kind,
                            change.code,
                            change.message,
                        )
                    )
        return rows

    @staticmethod
    def _reading(at: int, g: int, reasons: np.ndarray, counters: dict[str, np.ndarray],
                 levels: dict[str, np.ndarray], temp: np.ndarray) -> dict[str, Any]:
        reading: dict[str, Any] = {name: int(values[g][at]) for name, values in counters.items()}
        reading.update({name: values[g][at].item() for name, values in levels.items()})
        reading["clocks_event_reasons"] = int(reasons[g][at])
        reading["temp_c"] = float(round(temp[g][at]))
        reading["retired_pages_pending"] = False
        return reading
