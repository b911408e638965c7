"""The persistence and window logic: which flagged steps make a finding persistent, the window a
finding is reported over, the rows its what-if is taken from, and whether it is worth an incident at
all."""

from __future__ import annotations

import numpy as np

from faultlens.attribution.detectors.straggler.decompose import rolling_sum
from faultlens.attribution.detectors.straggler.report import StragglerFinding
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
    return steps[max(0, position - t.window_steps + 1): position + 1]


def since(steps: list[int], first: int, flagged: np.ndarray) -> np.ndarray:
    """The rows from `first` on where the culprit is flagged (the slowdown as it is now)."""
    return (np.asarray(steps) >= first) & np.asarray(flagged, dtype=bool)


def material(t: StragglerThresholds, finding: StragglerFinding) -> bool:
    """Worth an incident: fixing it would save at least min_step_slowdown of step time (no what-if:
    kept).
    """
    if finding.whatif is None:
        return True
    needed = t.moving_min_step_slowdown if finding.kind == "moving" else t.min_step_slowdown
    return finding.whatif.slowdown >= needed
