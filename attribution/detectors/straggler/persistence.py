"""The persistence and window logic: which flagged steps make a finding persistent, the window a
finding is reported over, the rows its what-if is taken from, and whether it is worth an incident at
all."""

from __future__ import annotations

import numpy as np

from faultlens.attribution.detectors.straggler.decompose import rolling_sum
from faultlens.attribution.detectors.straggler.report import StepScores, StragglerFinding
from faultlens.attribution.rules import StragglerThresholds


def persistent(
    t: StragglerThresholds, flags: np.ndarray, valid: np.ndarray, *, pairwise: bool = False
) -> np.ndarray:
    """steps x k: persistent at step s (flagged in >= persistence of the last window_steps valid
    steps; `pairwise`: each column was compared with one partner only, which needs
    pairwise_persistence). A window not yet full (the first steps of an attempt, at least
    min_window_steps) needs stronger evidence, rising linearly from the persistence at a full window
    to every step flagged at no steps: a few contention spikes in the first steps of a loaded
    machine are not a straggler, a rank slow in every step is one from min_window_steps on."""
    w = t.window_steps
    needed = max(t.persistence, t.pairwise_persistence) if pairwise else t.persistence
    counts = rolling_sum(valid.astype(float)[:, None], w)
    hits = rolling_sum(flags & valid[:, None], w)
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = np.where(counts > 0, hits / np.maximum(counts, 1), 0.0)
    missing = np.clip(1.0 - counts / w, 0.0, 1.0)
    needed_here = needed + (1.0 - needed) * missing
    return (fraction >= needed_here - 1e-9) & (counts >= t.min_window_steps)


def window(t: StragglerThresholds, steps: list[int], step: int) -> list[int]:
    """The window_steps steps up to `step` (fewer at an attempt's start)."""
    position = steps.index(step)
    return steps[max(0, position - t.window_steps + 1) : position + 1]


def since(steps: list[int], first: int, flagged: np.ndarray) -> np.ndarray:
    """The rows from `first` on where the culprit is flagged (the slowdown as it is now)."""
    return (np.asarray(steps) >= first) & np.asarray(flagged, dtype=bool)


def step_noise(values: np.ndarray) -> np.ndarray:
    """Per column, the step-to-step noise of a series: 1.4826 x the median absolute difference of
    successive finite values / sqrt(2) (the standard deviation of white noise; a slow drift of the
    level adds little). NaN with fewer than 3 values."""
    out = np.full(values.shape[1], np.nan)
    for column in range(values.shape[1]):
        series = values[:, column]
        series = series[np.isfinite(series)]
        if len(series) >= 3:
            out[column] = 1.4826 * np.median(np.abs(np.diff(series))) / np.sqrt(2.0)
    return out


def own_work_noise(scores: StepScores, finding: StragglerFinding) -> float:
    """The job's own step-to-step noise a finding must stand out of, measured on the job: for a
    finding that blames some ranks, the median over the other ranks of their own work's
    step-to-step noise over the attempt's scored steps (a DataLoader worker's jitter or CPU
    contention moves every rank's own work by about this much); for slowness that moves between
    ranks (it blames them all), the step time's own step-to-step noise over its window."""
    if finding.kind == "moving":
        rows = np.isin(scores.compute.index, finding.window)
        noise = step_noise(np.asarray(scores.step_s, dtype=float)[rows][:, None])
    else:
        compute = scores.compute.to_numpy(dtype=float)
        others = ~np.isin(scores.compute.columns, finding.ranks)
        noise = step_noise(compute[:, others] if others.any() else compute)
    return float(np.nanmedian(noise)) if np.isfinite(noise).any() else 0.0


def material(t: StragglerThresholds, finding: StragglerFinding) -> bool:
    """Worth an incident: fixing it would save at least min_step_slowdown of step time, and the
    saving stands out of the job's own step-to-step noise (noise_k x the what-if's noise_s): a
    figure the size of that noise is what the noise makes (no what-if: kept)."""
    if finding.whatif is None:
        return True
    needed = t.moving_min_step_slowdown if finding.kind == "moving" else t.min_step_slowdown
    whatif = finding.whatif
    return whatif.slowdown >= needed and whatif.saving_s >= t.noise_k * whatif.noise_s
