"""What-if impact of a slowdown, after ByteDance's straggler study (OSDI '25, arXiv 2505.05713):
from the dependencies of one step, estimate the step time if the flagged worker, stage, replica or
op kind ran at its peers' speed; S = T_actual / T_ideal, and "fixing this saves 1 - 1/S of step
time".

The step model. A pipeline unit is one (replica, stage): its ranks (tensor/context/expert peers)
wait for each other inside compute, so the unit takes its slowest rank's compute. A replica runs its
stages as a pipeline of M microbatches (GPipe or 1F1B, same bubble): T_d = sum_p u_p / M + (M - 1) /
M * max_p u_p. The data-parallel sync waits for the slowest replica: T = max_d T_d. Pure data
parallelism (one stage) is T = max over units.

M is taken from the thresholds when set, else inferred from the step: in the bottleneck stage b of a
replica the idle time T - u_b is the other stages' time for one microbatch, sum_{p != b} u_p / M (in
the critical replica, the one the others wait for).

The data-parallel sync as a max over replicas, from what was observed. Where the step times its
data-parallel collectives (all-reduce, reduce-scatter, all-gather: the step timer's sync sections),
a rank's arrival at the sync is its step end less the time it waited there (the last to arrive waits
least: its wait is the transfer alone). The step ends when the last rank has arrived, T ~ max_r A_r.
A fix that makes replica d's pipeline s_d faster (the model above, per replica) moves the arrivals
of d's ranks to A_r - s_d, the others' stay: the saving is
    max_r A_r - max_r (A_r - s_d(r)),
so it stops where another replica (or another stage's group) becomes the last to arrive, with every
replica's jitter as it was measured rather than assumed away: a worker fixed to its peers' speed
saves its excess only down to the next-slowest replica. Arrivals are compared across ranks by their
wall clocks (the steps rows' end_ts), so hosts' clocks must agree to well under the saving (NTP or
PTP). Without sync sections or end times (or with one replica) the saving is the pipeline model's
alone, max_d T_d - max_d T'_d.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from faultlens.attribution.detectors.straggler.layout import Layout

MAX_MICROBATCHES = 64


@dataclass(frozen=True)
class WhatIf:
    """The estimated effect of bringing some ranks' compute to a reference over a window of
    steps."""

    step_s: float  # observed median step time over the window
    ideal_s: float  # estimated step time with the fix
    microbatches: float
    inferred: bool  # microbatches inferred from the timings (else configured)
    op_kind: str | None = None  # the section whose fix saves most
    op_saving: float | None = None  # fraction of step time the op kind alone saves
    # the saving is the culprit's section excess (peers' sections hide their waiting)
    hidden: bool = False
    # the job's own step-to-step noise over the finding's window (seconds): a healthy rank's own
    # work, step to step (persistence.own_work_noise)
    noise_s: float = 0.0

    @property
    def saving_s(self) -> float:
        return max(0.0, self.step_s - self.ideal_s)

    @property
    def saving_fraction(self) -> float:
        return self.saving_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def slowdown(self) -> float:
        """S = T_actual / T_ideal."""
        return self.step_s / self.ideal_s if self.ideal_s > 0 else float("inf")

    def text(self, what: str) -> str:
        source = "inferred from the step timings" if self.inferred else "configured"
        if self.hidden:
            return (
                f"what-if: with {what} at its peers' speed the step would take "
                f"{self.ideal_s:.3f} s instead of "
                f"{self.step_s:.3f} s: fixing this saves {self.saving_fraction:.1%} of step "
                "time "
                f"(S = {self.slowdown:.2f}; its slow sections' excess over its peers': their "
                "sections hold "
                f"their waiting)"
            )
        op = (
            f"; {self.op_kind} alone saves {self.op_saving:.1%}"
            if self.op_kind and self.op_saving
            else ""
        )
        return (
            f"what-if: with {what} at its peers' speed the step would take {self.ideal_s:.3f} "
            "s instead of "
            f"{self.step_s:.3f} s: fixing this saves {self.saving_fraction:.1%} of step time "
            f"(S = {self.slowdown:.2f}; pipeline model, {self.microbatches:.0f} microbatches "
            f"{source}){op}"
        )

    def details(self) -> dict[str, float | str | bool | None]:
        return {
            "step_s": round(self.step_s, 6),
            "ideal_s": round(self.ideal_s, 6),
            "saving_fraction": round(self.saving_fraction, 4),
            "slowdown": round(self.slowdown, 4),
            "microbatches": round(self.microbatches, 2),
            "microbatches_inferred": self.inferred,
            "op_kind": self.op_kind,
            "op_saving": None if self.op_saving is None else round(self.op_saving, 4),
            "noise_s": round(self.noise_s, 6),
        }


class StepModel:
    """The dependency model of one attempt's steps over its layout."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.D, self.P = layout.replicas, layout.stages
        self.unit = layout.replica * self.P + layout.stage  # column -> unit id

    def units(self, compute: np.ndarray) -> np.ndarray:
        """(steps x ranks) compute -> (steps x D x P) unit times (slowest rank of the unit)."""
        steps = compute.shape[0]
        out = np.full((steps, self.D * self.P), np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for unit in np.unique(self.unit):
                out[:, unit] = np.nanmax(compute[:, self.unit == unit], axis=1)
        return out.reshape(steps, self.D, self.P)

    def step_time(self, compute: np.ndarray, microbatches: np.ndarray | float) -> np.ndarray:
        u = self.units(compute)
        m = np.broadcast_to(np.asarray(microbatches, dtype=float), (u.shape[0],))[:, None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            per_replica = np.nansum(u, axis=2) / m + (m - 1) / m * np.nanmax(u, axis=2)
            return np.nanmax(per_replica, axis=1)

    def replica_times(self, compute: np.ndarray, microbatches: np.ndarray | float) -> np.ndarray:
        """(steps x D) pipeline time of every replica (the model above)."""
        u = self.units(compute)
        m = np.broadcast_to(np.asarray(microbatches, dtype=float), (u.shape[0],))[:, None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nansum(u, axis=2) / m + (m - 1) / m * np.nanmax(u, axis=2)

    def saving(
        self,
        compute: np.ndarray,
        fixed: np.ndarray,
        microbatches: float,
        arrival: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per step, the seconds the fix saves: the pipeline model per replica, the data-parallel
        sync from the observed arrivals where `arrival` (steps x ranks: when each rank reached the
        sync, epoch seconds) is given (module docstring)."""
        actual = self.replica_times(compute, microbatches)
        ideal = self.replica_times(fixed, microbatches)
        with warnings.catch_warnings(), np.errstate(invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            per_replica = np.clip(np.nan_to_num(actual - ideal, nan=0.0), 0.0, None)  # s_d
            model = np.clip(np.nanmax(actual, axis=1) - np.nanmax(ideal, axis=1), 0.0, None)
        if arrival is None or self.D < 2 or not np.isfinite(arrival).any():
            return model
        seen = np.isfinite(arrival)
        shifted = np.where(seen, arrival - per_replica[:, self.layout.replica], -np.inf)
        last = np.where(seen, arrival, -np.inf).max(axis=1)
        observed = last - shifted.max(axis=1)
        # who waits for whom needs arrivals in at least two replicas, among them every replica the
        # fix moves (a replica whose ranks time no sync section cannot be placed): else the model's
        # saving
        replica_seen = np.zeros((seen.shape[0], self.D), dtype=bool)
        for column in range(seen.shape[1]):
            replica_seen[:, self.layout.replica[column]] |= seen[:, column]
        usable = (replica_seen.sum(axis=1) >= 2) & np.all(replica_seen | (per_replica <= 0), axis=1)
        return np.where(usable & np.isfinite(observed), np.clip(observed, 0.0, None), model)

    def infer_microbatches(self, compute: np.ndarray, observed: np.ndarray) -> float:
        """The microbatch count that explains the bottleneck stage's idle time (median over steps
        and replicas).
        """
        if self.P < 2:
            return 1.0
        u = self.units(compute)
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            bottleneck = np.nanmax(u, axis=2)
            total = np.nansum(u, axis=2)
            # the critical replica (the others wait for it in the data-parallel sync): the largest
            # sum + max
            critical = np.argmax(np.nan_to_num(total + bottleneck, nan=-np.inf), axis=1)
            rows = np.arange(u.shape[0])
            others = total[rows, critical] - bottleneck[rows, critical]
            idle = observed - bottleneck[rows, critical]
            estimate = np.where(idle > 0, others / idle, MAX_MICROBATCHES)
            value = float(np.nanmedian(estimate))
        if not np.isfinite(value):
            return float(MAX_MICROBATCHES)
        return float(np.clip(value, 1.0, MAX_MICROBATCHES))


def what_if(
    model: StepModel,
    compute: np.ndarray,
    fixed: np.ndarray,
    observed: np.ndarray,
    microbatches: float | None,
    sections: dict[str, np.ndarray] | None = None,
    section_refs: dict[str, np.ndarray] | None = None,
    mask: np.ndarray | None = None,
    arrival: np.ndarray | None = None,
) -> WhatIf | None:
    """Window rows only. compute/fixed: (steps x ranks) actual compute and compute with the fix;
    observed: the step times; arrival: when each rank reached the data-parallel sync (epoch seconds;
    None: not timed). With sections (name -> steps x ranks seconds), their peer references and the
    mask of fixed cells, the op kind whose fix alone saves most is named."""
    finite = np.isfinite(observed)
    if not finite.any():
        return None
    hidden = False
    compute, fixed, observed = compute[finite], fixed[finite], observed[finite]
    arrival = arrival[finite] if arrival is not None else None
    inferred = microbatches is None
    m = model.infer_microbatches(compute, observed) if inferred else float(microbatches)
    delta = model.saving(compute, fixed, m, arrival)
    step_s = float(np.median(observed))
    saving = float(np.nanmedian(delta)) if np.isfinite(delta).any() else 0.0
    op_kind, op_saving = None, None
    if sections and section_refs and mask is not None:
        best = 0.0
        cells = mask[finite]
        for name, values in sections.items():
            ref = section_refs.get(name)
            if ref is None:
                continue
            excess = np.where(
                cells, np.clip(np.nan_to_num(values[finite] - ref[finite]), 0.0, None), 0.0
            )
            if not excess.any():
                continue
            part = float(np.nanmedian(model.saving(compute, compute - excess, m, arrival)))
            if part > best:
                best, op_kind = part, name
        op_saving = best / step_s if op_kind and step_s > 0 else None
        # the totals can hide it: when the peers' own sections hold their waiting (DDP overlaps the
        # gradient all-reduce with backward), compute totals are alike and the model sees nothing to
        # save; the culprit's excess in its slow sections over its peers' is then the saving
        excess = sum(
            np.where(
                cells,
                np.clip(np.nan_to_num(values[finite] - section_refs[name][finite]), 0.0, None),
                0.0,
            )
            for name, values in sections.items()
            if name in section_refs
        )
        if isinstance(excess, np.ndarray) and excess.any():
            direct = float(np.nanmedian(excess.max(axis=1)))
            # asked of the compute model: where the observed arrivals bound the saving (another
            # replica is the next-slowest), that bound is a measurement, not a hidden excess
            modelled = (
                saving if arrival is None else float(np.nanmedian(model.saving(compute, fixed, m)))
            )
            if modelled < 0.5 * direct:
                saving, hidden = min(direct, 0.95 * step_s), True
    return WhatIf(step_s, max(step_s - saving, 1e-9), m, inferred, op_kind, op_saving, hidden)
