"""The state of the step timer while it works out an attempt's steps: the placement as the timing
needs it (TimingLayout), the compute multiplier of the slowdowns in force (SlowdownMultiplier),
where the steps are (StepCursor), the random draws and times of up to K steps (StepChunk), and the
spikes due (apply_spikes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from faultlens.controller.lab.simulate.cluster import Placement
from faultlens.controller.lab.simulate.timing.records import AttemptSteps, Slowdown, Spike, SpikeHit


@dataclass(frozen=True)
class TimingLayout:
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
    def of(cls, placement: Placement, gpu_speed: dict[tuple[str, int], float]) -> TimingLayout:
        ranks = placement.ranks()
        phys = [(p.node.name, p.gpu.index) for p in ranks]
        stage = placement.stage_of_rank()
        return cls(
            n_nodes=len(placement.nodes),
            tp=placement.tp_size,
            dp_size=placement.dp_size,
            phys=phys,
            node_names=np.array([p.node.name for p in ranks], dtype=object),
            speed=np.array([gpu_speed.get(k, 1.0) for k in phys]),
            stage=stage,
            dp_of=placement.dp_of_rank(),
            last_stage=stage == placement.pp_size - 1,
        )


@dataclass
class SlowdownMultiplier:
    """The compute multiplier per rank from the slowdowns in force, worked out again only at their
    change points.
    """

    slowdowns: list[Slowdown]
    layout: TimingLayout
    mult: np.ndarray = field(init=False)
    trivial: bool = field(init=False)  # no slowdown in force
    next_change: int | None = field(init=False)

    def __post_init__(self) -> None:
        self._change_points = sorted(
            {s.t0 for s in self.slowdowns} | {s.t1 for s in self.slowdowns}
        )

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
class StepCursor:
    """Where the attempt's steps are: the next step, when it starts, and the next pending spike."""

    step: int
    t: int
    index_in_attempt: int = 0
    spike_pos: int = 0
    stopped: bool = False


@dataclass
class StepChunk:
    """Up to K steps of all ranks: the random draws (made up front, K at a time) and the steps'
    times as they are worked out."""

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
    def draw(cls, rng: np.random.Generator, K: int, layout: TimingLayout, S: float) -> StepChunk:
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
        return cls(
            c_raw,
            split,
            data,
            opt,
            comm_base,
            ckpt_s,
            eval_s,
            jitter,
            loss_noise,
            mult_rows=np.ones((K, R)),
            steps_arr=np.zeros(K, dtype=np.int64),
            starts=np.zeros(K, dtype=np.int64),
            durs=np.zeros(K),
            ck=np.zeros(K),
            gaps=np.zeros(K),
        )

    def head(self, n: int) -> StepChunk:
        """The first n steps."""
        return StepChunk(*(getattr(self, f)[:n] for f in self.__dataclass_fields__))


def apply_spikes(
    pending: list[Spike],
    cur: StepCursor,
    chunk: StepChunk,
    k: int,
    phys: list[tuple[str, int]],
    out: AttemptSteps,
) -> bool:
    """Apply the spikes due by the start of the chunk's step k; whether any hit a rank of this
    placement.
    """
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
