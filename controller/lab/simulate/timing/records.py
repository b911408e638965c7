"""What changes a job's step timing (Slowdown, Spike, LossEffect) and what an attempt's steps were
(AttemptSteps, with the spikes that hit them: SpikeHit)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NS = 1_000_000_000


@dataclass(frozen=True)
class Slowdown:
    """Compute of some ranks is `factor` times slower during [t0, t1): one physical GPU, a whole
    node, or every rank of a pipeline stage."""

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
    # rank_compute (GC pause, allocator), rank_data (loader hiccup), job_data (shared filesystem)
    kind: str
    amount: float  # factor for rank_compute, extra seconds otherwise
    node: str | None = None
    gpu: int | None = None


@dataclass(frozen=True)
class LossEffect:
    """The loss of one data-parallel replica is multiplied by `factor` (NaN allowed) during [t0,
    t1).
    """

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
