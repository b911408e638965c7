"""StragglerDetector: per attempt, score the steps, find persistent slowdowns and turn them into
incidents.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.straggler.cause import CauseResult, gpu_cause, node_outliers
from faultlens.attribution.detectors.straggler.evidence import became_slow, describe_ranks
from faultlens.attribution.detectors.straggler.findings import find
from faultlens.attribution.detectors.straggler.incidents import make_incident
from faultlens.attribution.detectors.straggler.report import (
    StepScores,
    StragglerFinding,
    remaining_time,
)
from faultlens.attribution.detectors.straggler.sections import (
    classify_sections,
    score_chunks,
    score_steps,
)
from faultlens.attribution.detectors.straggler.vocab import Vocabulary, load_vocabulary
from faultlens.attribution.incident import Evidence, Incident
from faultlens.attribution.reading.telemetry import Placement, Telemetry, placements
from faultlens.attribution.rules import StragglerThresholds

__all__ = ["StragglerDetector"]


class StragglerDetector:
    """Scores per-rank section timings and turns persistent slowness into straggler incidents."""

    def __init__(
        self, thresholds: StragglerThresholds, vocabulary: Vocabulary | None = None
    ) -> None:
        self.t = thresholds
        self.vocabulary = vocabulary or load_vocabulary(thresholds.vocabulary_files)

    # ------------------------------------------------------------ scoring (straggler/sections.py)

    def classify_sections(self, steps: pd.DataFrame) -> tuple[list[str], dict[str, str], list[str]]:
        """(own-work section columns, comm section -> collective kind, unknown section names)."""
        return classify_sections(self.t, self.vocabulary, steps)

    def compute_sections(self, steps: pd.DataFrame) -> list[str]:
        return self.classify_sections(steps)[0]

    def scores(
        self,
        attempt_steps: pd.DataFrame,
        placement: dict[int, Placement],
        ranks_table: pd.DataFrame | None = None,
        attempt: int | None = None,
    ) -> StepScores | None:
        """Score one attempt's steps; None when there is nothing to score (no own-work sections, no
        steps).
        """
        return score_steps(self.t, self.vocabulary, attempt_steps, placement, ranks_table, attempt)

    # ------------------------------------------------------------ findings (straggler/findings.py)

    def findings(
        self, scores: StepScores, placement: dict[int, Placement]
    ) -> list[StragglerFinding]:
        return find(self.t, scores, placement)

    # ------------------------------------------------------------ evidence and cause (evidence.py,
    # cause.py)

    def describe_ranks(self, finding: StragglerFinding, scores: StepScores,
                       placement: dict[int, Placement]) -> list[Evidence]:
        return describe_ranks(self.t, finding, scores, placement)

    def became_slow(self, finding: StragglerFinding, scores: StepScores) -> bool:
        return became_slow(self.t, finding, scores)

    def gpu_cause(
        self,
        finding: StragglerFinding,
        scores: StepScores,
        placement: dict[int, Placement],
        telemetry: Telemetry,
    ) -> CauseResult:
        """Cause from the culprits' GPU samples (and gpu_events) in the window, compared with their
        peers'. Returns (cause, confidence bonus, evidence, culprit GPUs, the window's samples or
        None)."""
        return gpu_cause(self.t, finding, scores, placement, telemetry)

    def node_outliers(self, scores: StepScores, placement: dict[int, Placement],
                      samples: pd.DataFrame | None) -> tuple[list[str], list[str]]:
        """Nodes whose multi-metric vector stands out under a robust covariance estimate
        (MinCovDet). Returns (outlier nodes, the features used)."""
        return node_outliers(self.t, scores, placement, samples)

    # ------------------------------------------------------------ incidents
    # (straggler/incidents.py)

    def attribute(
        self, telemetry: Telemetry, now: dt.datetime, last_steps: int | None = None
    ) -> list[Incident]:
        """Straggler incidents of every attempt in `telemetry`; `last_steps` scores only each
        attempt's most recent steps (live mode: what can still become a new incident)."""
        incidents: list[Incident] = []
        steps = telemetry.steps
        if steps.empty or not self.compute_sections(steps):
            return incidents
        for (job, attempt), rows in steps.groupby(["job_id", "attempt"], dropna=False):
            if last_steps is not None and rows["step"].notna().any():
                rows = rows[rows["step"] > rows["step"].max() - last_steps]
            job = None if job is None or job is pd.NA or job != job else str(job)
            attempt = (
                None if attempt is None or attempt is pd.NA or attempt != attempt else int(attempt)
            )
            incidents.extend(
                self.attribute_attempt(
                    telemetry, job, attempt, list(steps.columns), (rows,), now, placement_rows=rows
                )
            )
        return incidents

    def attribute_attempt(
        self,
        telemetry: Telemetry,
        job: str | None,
        attempt: int | None,
        columns: list[str],
        chunks: Iterable[pd.DataFrame],
        now: dt.datetime,
        *,
        placement_rows: pd.DataFrame,
    ) -> list[Incident]:
        """Straggler incidents of one attempt whose step rows come in `chunks` (frames with
        `columns`, disjoint ascending step ranges: see sections.score_chunks). `placement_rows`:
        rows of the attempt that say where each rank ran (its newest row per rank suffices) and its
        highest step."""
        placement = placements(telemetry.ranks, attempt, placement_rows)
        ranks_table = telemetry.ranks
        if job is not None and not ranks_table.empty and "job_id" in ranks_table.columns:
            ranks_table = ranks_table[ranks_table["job_id"] == job]
        scores = score_chunks(
            self.t, self.vocabulary, columns, chunks, placement, ranks_table, attempt
        )
        if scores is None:
            return []
        recent = scores.step_s[-self.t.window_steps:]
        recent = recent[np.isfinite(recent)]
        scores = replace(scores, remaining=remaining_time(
            ranks_table, attempt, int(placement_rows["step"].max()),
            float(np.median(recent)) if len(recent) else np.nan))
        return [make_incident(self.t, finding, scores, placement, telemetry, job, attempt, now)
                for finding in self.findings(scores, placement)]
