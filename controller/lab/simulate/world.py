"""The mutable state of one simulation that fault injectors read and write: the current attempt
(placement, pids, steps so far), the rows of the small tables, GPU effects, timing effects, and the
labels."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from faultlens.controller.lab.fault_labels import FaultLabel
from faultlens.controller.lab.simulate.cluster import Node, Placement, RankPlace
from faultlens.controller.lab.simulate.collectives import Group, build_groups
from faultlens.controller.lab.simulate.config import SimConfig
from faultlens.controller.lab.simulate.gpu import GpuEffects
from faultlens.controller.lab.simulate.process import RowFactory
from faultlens.controller.lab.simulate.timing import AttemptSteps, LossEffect, Slowdown, Spike
from faultlens.controller.lab.simulate.xid import GpuEventFactory

NS = 1_000_000_000


def to_datetime(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns // NS, tz=dt.UTC) + dt.timedelta(
        microseconds=(ns % NS) // 1000
    )


@dataclass
class Attempt:
    number: int
    placement: Placement
    start: int  # processes start
    first_step_start: int
    first_step: int
    pids: list[int]
    groups: dict[str, Group]
    member_of: dict[int, dict[str, str]]
    steps: AttemptSteps = field(default_factory=AttemptSteps)

    def pid(self, rank: int) -> int:
        return self.pids[rank]


@dataclass
class World:
    cfg: SimConfig
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    effects: GpuEffects = field(default_factory=GpuEffects)
    slowdowns: list[Slowdown] = field(default_factory=list)
    spikes: list[Spike] = field(default_factory=list)
    losses: list[LossEffect] = field(default_factory=list)
    # (attempt, rank, first step) whose parameter digests differ from their replicas' from then on
    flips: list[tuple[int, int, int]] = field(default_factory=list)
    labels: list[FaultLabel] = field(default_factory=list)
    attempt: Attempt | None = None
    spares: list[Node] = field(default_factory=list)
    used_pids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.proc = RowFactory(self.cfg.cluster, self.cfg.job)
        self.xid = GpuEventFactory(self.cfg.cluster, self.cfg.job)
        self._fault_counter = 0
        self._benign_counter = 0

    # identities
    # --------------------------------------------------------------------------------------------
    @property
    def current(self) -> Attempt:
        if self.attempt is None:
            raise RuntimeError("no attempt is running")
        return self.attempt

    def identity(self, place: RankPlace, ts: int) -> dict[str, Any]:
        return {
            "ts": ts,
            "cluster": self.cfg.cluster,
            "node": place.node.name,
            "job_id": self.cfg.job,
            "attempt": self.current.number,
            "rank": place.rank,
            "local_rank": place.local_rank,
            "gpu_index": place.gpu.index,
            "gpu_uuid": place.gpu.uuid,
            "pci_bus_id": place.gpu.pci_bus_id,
        }

    def new_pid(self, rng: np.random.Generator) -> int:
        while True:
            pid = int(rng.integers(20_000, 4_000_000))
            if pid not in self.used_pids:
                self.used_pids.add(pid)
                return pid

    def next_fault_id(self, benign: bool = False) -> str:
        if benign:
            self._benign_counter += 1
            return f"B{self._benign_counter:04d}"
        self._fault_counter += 1
        return f"F{self._fault_counter:04d}"

    def new_attempt(
        self,
        number: int,
        placement: Placement,
        start: int,
        first_step_start: int,
        first_step: int,
        rng: np.random.Generator,
    ) -> Attempt:
        pids = [self.new_pid(rng) for _ in range(placement.world_size)]
        groups, member_of = build_groups(placement)
        self.attempt = Attempt(
            number, placement, start, first_step_start, first_step, pids, groups, member_of
        )
        return self.attempt

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.rows[table].append(row)
