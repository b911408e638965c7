"""Timing evidence of a finding and what it is worth: per culprit rank its ratio to its baseline
(peers in other replicas, or its own history) and slowest section, whether it became slow or was
slow from the start, the what-if and unknown sections, the incident's details, and the worker
confidence."""

from __future__ import annotations

import warnings

import numpy as np

from faultlens.attribution.detectors.straggler.report import StepScores, StragglerFinding
from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Evidence
from faultlens.attribution.reading.telemetry import Placement
from faultlens.attribution.rules import StragglerThresholds


def section_ratios(
    scores: StepScores, rank: int, column: int, rows: np.ndarray
) -> dict[str, float]:
    """Each compute section of `rank` against its peers' reference, median over `rows` (finite ones
    only).
    """
    ratios = {}
    for name, frame in scores.sections.items():
        mine = frame[rank].to_numpy(dtype=float)[rows]
        ref = scores.parts.section_refs[name][rows, column]
        with np.errstate(invalid="ignore", divide="ignore"):
            value = float(np.nanmedian(mine / ref)) if np.isfinite(mine).any() else np.nan
        if np.isfinite(value):
            ratios[name] = value
    return ratios


def describe_ranks(t: StragglerThresholds, finding: StragglerFinding, scores: StepScores,
                   placement: dict[int, Placement]) -> list[Evidence]:
    """One sentence per culprit rank (the first four): its compute against its baseline, its slowest
    section, how often it was slow in the window, and its own history."""
    window = finding.window
    evidence = []
    end = as_datetime(scores.end_ts.get(finding.step))
    layout, parts = scores.layout, scores.parts
    rows = np.isin(scores.compute.index, window)
    for rank in finding.ranks[:4]:
        j = int(np.searchsorted(layout.ranks, rank))
        flagged = int(scores.flagged.loc[window, rank].sum())
        hit = rows & scores.flagged[rank].to_numpy()
        use = hit if hit.any() else rows
        ratio = float(np.nanmedian(parts.worker_ratio[use, j]))
        section_text = ""
        finite = section_ratios(scores, rank, j, use)
        if finite:
            worst = max(finite, key=lambda k: finite[k])
            section_text = f"; slowest section {worst} {finite[worst]:.2f}x"
        own = own_history(t, rank, j, window, scores)
        where = f" on {placement[rank].node}" if rank in placement and placement[rank].node else ""
        coords = (f" (replica {int(layout.replica[j])}, stage {int(layout.stage[j])})"
                  if layout.stages > 1 or "dp_rank" in layout.declared else "")
        base = ("its own earlier median" if scores.group_kind == "own history"
                else f"its peers' median ({scores.group_kind})")
        lead = f"compute {ratio:.2f}x {base}"
        if finite and scores.group_kind != "own history" and finite[worst] > 1.1 * max(ratio, 1.0):
            # the total hides the slow section (peers wait for the rank inside theirs): lead with
            # the section
            lead = (f"slowest section {worst} {finite[worst]:.2f}x peers, while its compute "
                    "sections together "
                    f"are {ratio:.2f}x {base} (its peers wait for it inside theirs)")
            section_text = ""
        evidence.append(Evidence(
            "steps", end, f"rank {rank}{where}{coords}: {lead}, "
                          f"slow in {flagged} of {len(window)} steps "
                          f"({window[0]}-{window[-1]}){section_text}"
                          f"{own}"))
    return evidence


def own_history(
    t: StragglerThresholds, rank: int, column: int, window: list[int], scores: StepScores
) -> str:
    """Was the rank slow from the start (a weaker GPU, a heavier partition) or did it become slow
    (fail-slow)? From its own steps: the strongest change point of its compute (median after /
    median before)."""
    compute = scores.compute[rank].dropna()
    values = compute.to_numpy(dtype=float)
    least = max(3, t.min_window_steps // 2)
    if len(values) < 2 * least:
        return "; no earlier history of its own"
    best, at = 0.0, None
    for k in range(least, len(values) - least + 1):
        before = float(np.median(values[max(0, k - t.self_baseline_steps):k]))
        after = float(np.median(values[k:]))
        if before > 0 and after / before > best:
            best, at = after / before, int(compute.index[k])
    if at is not None and best >= 1 + (t.min_ratio - 1) / 2:
        return f"; {best:.2f}x its own earlier median from step {at}: it became slow"
    if scores.layout.replicas >= 2:
        earlier = float(scores.ratio[rank].loc[compute.index[:least]].median())
        return f"; {earlier:.2f}x its peers already in its first steps: slow from the start"
    return f"; {best:.2f}x its own earlier median"


def became_slow(t: StragglerThresholds, finding: StragglerFinding, scores: StepScores) -> bool:
    return any("became slow" in own_history(t, r, int(np.searchsorted(scores.layout.ranks, r)),
                                            finding.window, scores) for r in finding.ranks[:4])


def common_evidence(finding: StragglerFinding, scores: StepScores, what: str) -> list[Evidence]:
    """The what-if ("fixing `what` saves ...") and the unknown sections that were not scored."""
    evidence = []
    end = as_datetime(scores.end_ts.get(finding.step))
    if finding.whatif is not None:
        evidence.append(Evidence("steps", end, finding.whatif.text(what)))
    if scores.unknown_sections:
        names = ", ".join(f"{n} ({s:.0%} of step time)" for n, s in sorted(
            scores.unknown_sections.items(), key=lambda kv: -kv[1])[:4])
        evidence.append(Evidence("steps", end, "sections of unknown kind, not scored (neither "
                                               "compute nor "
                                               f"communication in the vocabulary): {names}"))
    return evidence


def details(finding: StragglerFinding, scores: StepScores) -> dict:
    """The incident's details: ranks, kind, layout, comparison, where, what-if, remaining time."""
    out: dict = {"ranks": finding.ranks, "kind": finding.kind, "layout": scores.layout.describe(),
                 "comparison": scores.group_kind, **finding.where}
    if finding.whatif is not None:
        out["whatif"] = finding.whatif.details()
        out["saving_fraction"] = round(finding.whatif.saving_fraction, 4)
    # the slowdown policy weighs the saving over this (None: the job declares no length, unknown)
    out.update(
        scores.remaining.details() if scores.remaining is not None else {"remaining_s": None}
    )
    return out


def _hidden_section_ratio(
    finding: StragglerFinding, scores: StepScores, rows: np.ndarray, ratio: float
) -> float:
    """Where the total hides it (peers wait for the rank inside their own sections): the slowest
    section's excess over its peers', as the share of the step it adds (a millisecond section at
    1.9x its peers adds little; the section's own ratio would overstate it); `ratio` when that is
    larger."""
    step_s = float(np.nanmedian(scores.step_s[rows])) if rows.any() else np.nan
    for rank in finding.ranks[:4]:
        j = int(np.searchsorted(scores.layout.ranks, rank))
        mine = rows & scores.flagged[rank].to_numpy()
        chosen = mine if mine.any() else rows
        for name, frame in scores.sections.items():
            # a section the rank never timed in these steps: all NaN
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                excess = float(np.nanmedian(frame[rank].to_numpy(dtype=float)[chosen]
                                            - scores.parts.section_refs[name][chosen, j]))
            if np.isfinite(excess) and np.isfinite(step_s) and step_s > 0:
                ratio = max(ratio, 1.0 + excess / step_s)
    return ratio


def worker_confidence(t: StragglerThresholds, finding: StragglerFinding, scores: StepScores,
                      bonus: float) -> float:
    """What was used: persistence and strength of the timing evidence, how it was compared (peers in
    other replicas, a change against its own history), and GPU evidence (the bonus)."""
    window_flags = scores.flagged.loc[finding.window, finding.ranks]
    # persistence since the rank first turned slow in the window (a fail-slow from step k is not
    # diluted by the healthy steps before it)
    persistence = 0.0
    for rank in window_flags.columns:
        flags = window_flags[rank].to_numpy(dtype=bool)
        if flags.any():
            persistence = max(persistence, float(flags[int(np.argmax(flags)):].mean()))
    # a window shorter than a full one (a rank slow from an attempt's first steps) is less evidence
    persistence *= min(1.0, len(finding.window) / max(1, t.window_steps))
    rows = np.isin(scores.compute.index, finding.window)
    cols = np.isin(scores.layout.ranks, finding.ranks)
    hit = rows[:, None] & scores.flagged.to_numpy() & cols[None, :]
    ratio = float(np.nanmedian(scores.parts.worker_ratio[hit])) if hit.any() else 1.0
    ratio = _hidden_section_ratio(finding, scores, rows, ratio)
    strength = float(np.clip((ratio - 1.0) / (3.0 * (t.min_ratio - 1.0)), 0.0, 1.0))
    comparison = 0.0
    if scores.layout.replicas >= 3 or (
        scores.layout.replicas == 2 and became_slow(t, finding, scores)
    ):
        comparison = 0.05
    return min(0.97, 0.45 + 0.2 * persistence + 0.2 * strength + comparison + bonus)
