"""The what-if cost of a finding (attribution/detectors/straggler/whatif.py) over the rows where its
culprit is slow, and the baselines its sections are compared with: peers in other replicas, or the
other stages for a slow stage."""

from __future__ import annotations

import numpy as np

from faultlens.attribution.detectors.straggler.decompose import nanmedian
from faultlens.attribution.detectors.straggler.report import StepScores
from faultlens.attribution.detectors.straggler.whatif import StepModel, WhatIf, what_if
from faultlens.attribution.rules import StragglerThresholds


def stage_section_refs(scores: StepScores, stages: list[int]) -> dict[str, np.ndarray]:
    """Per section, the other stages' level for the ranks of the slow stages (an op kind of a slow
    stage is compared with the same op kind of the other stages, not with its own stage in other
    replicas)."""
    layout = scores.layout
    refs = {}
    for name, frame in scores.sections.items():
        values = frame.to_numpy(dtype=float)
        levels = np.column_stack([nanmedian(values[:, layout.stage == p], axis=1)
                                  for p in range(layout.stages)])
        ref = np.full_like(values, np.nan)
        for p in stages:
            others = nanmedian(np.delete(levels, p, axis=1), axis=1)
            ref[:, layout.stage == p] = others[:, None]
        refs[name] = ref
    return refs


def finding_what_if(
    t: StragglerThresholds,
    scores: StepScores,
    fixed: np.ndarray,
    rows: np.ndarray,
    mask: np.ndarray,
    section_refs: dict[str, np.ndarray] | None = None,
) -> WhatIf | None:
    """The step time if the culprit cells (`mask`) ran at `fixed`, over `rows`; None when no row is
    selected.
    """
    if not rows.any():
        return None
    compute = scores.compute.to_numpy(dtype=float)[rows]
    sections = {k: v.to_numpy(dtype=float)[rows] for k, v in scores.sections.items()}
    refs = {k: v[rows] for k, v in (section_refs or scores.parts.section_refs).items()}
    cells = np.broadcast_to(mask, scores.compute.shape)[rows]
    arrival = None
    if t.whatif.sync_arrivals and scores.sync is not None and scores.ends is not None:
        # when each rank reached the data-parallel sync: its step end less its time in the sync
        arrival = (scores.ends.to_numpy(dtype=float) - scores.sync.to_numpy(dtype=float))[rows]
    return what_if(StepModel(scores.layout), compute, fixed[rows], scores.step_s[rows],
                   t.whatif.microbatches, sections, refs, cells, arrival=arrival)
