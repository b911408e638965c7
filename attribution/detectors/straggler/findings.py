"""Findings from one attempt's StepScores: a slow pipeline stage (in every replica), a slow replica
(in every stage), slow workers (by node; on many nodes: systemic), and slow outliers that move
between ranks. Each is persistent over a window and carries its what-if; one that would save too
little is dropped."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from faultlens.attribution.detectors.straggler.costs import finding_what_if, stage_section_refs
from faultlens.attribution.detectors.straggler.decompose import rolling_sum
from faultlens.attribution.detectors.straggler.persistence import (
    material,
    own_work_noise,
    persistent,
    since,
    window,
)
from faultlens.attribution.detectors.straggler.report import (
    SYSTEMIC_MIN_NODES,
    StepScores,
    StragglerFinding,
    ranks_text,
)
from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Evidence
from faultlens.attribution.reading.telemetry import Placement
from faultlens.attribution.rules import StragglerThresholds


def find(
    t: StragglerThresholds, scores: StepScores, placement: dict[int, Placement]
) -> list[StragglerFinding]:
    """Every material finding of one attempt: stage, replica, worker (rank or systemic), moving."""
    layout, parts = scores.layout, scores.parts
    steps = list(scores.compute.index)
    valid = np.isfinite(scores.compute.to_numpy(dtype=float)).any(axis=1)
    found: list[StragglerFinding] = []
    claimed: set[int] = set()

    worker_persistent = persistent(t, parts.worker_flag, valid, pairwise=layout.replicas == 2)
    persistent_ranks = {int(layout.ranks[j]) for j in np.flatnonzero(worker_persistent.any(axis=0))}

    if layout.stages >= 2:
        stage = _stage_finding(t, scores, valid, persistent_ranks)
        if stage is not None:
            found.append(stage)
            if layout.replicas == 1:
                claimed.update(stage.ranks)

    if layout.replicas >= 2 and layout.stages >= 2:
        for replica in _replica_findings(t, scores, valid, persistent_ranks):
            claimed.update(replica.ranks)
            found.append(replica)

    # worker effect
    first_persistent = {}
    for j in np.flatnonzero(worker_persistent.any(axis=0)):
        rank = int(layout.ranks[j])
        if rank not in claimed:
            first_persistent[rank] = steps[int(np.flatnonzero(worker_persistent[:, j])[0])]
    if first_persistent:
        found.extend(_worker_findings(t, first_persistent, placement, scores))

    moving = _moving_finding(t, scores, worker_persistent, valid)
    if moving is not None:
        found.append(moving)
    found = [
        replace(f, whatif=replace(f.whatif, noise_s=own_work_noise(scores, f)))
        if f.whatif is not None
        else f
        for f in found
    ]
    return [f for f in found if material(t, f)]


def _stage_finding(t: StragglerThresholds, scores: StepScores, valid: np.ndarray,
                   persistent_ranks: set[int]) -> StragglerFinding | None:
    """Stage effect: slow in every replica; with one replica only when it did not become slow (own
    history).
    """
    layout, parts = scores.layout, scores.parts
    steps = list(scores.compute.index)
    compute = scores.compute.to_numpy(dtype=float)
    stage_persistent = persistent(t, parts.stage_flag, valid)
    slow_stages = []
    for p in np.flatnonzero(stage_persistent.any(axis=0)):
        members = layout.columns(layout.stage == p)
        if layout.replicas == 1 and set(members) <= persistent_ranks:
            continue  # one replica: the stage's worker became slow, a worker finding
        if layout.replicas >= 2 and set(members) & persistent_ranks and not _slow_without(
            t, scores, int(p), persistent_ranks, valid
        ):
            continue  # the stage's slow worker is the cause: its worker finding, not a second one
        slow_stages.append(int(p))
    if not slow_stages:
        return None
    first = min(int(np.flatnonzero(stage_persistent[:, p])[0]) for p in slow_stages)
    step = steps[first]
    ranks = sorted(r for p in slow_stages for r in layout.columns(layout.stage == p))
    steps_window = window(t, steps, step)
    rows = np.isin(scores.compute.index, steps_window)
    ratios = ", ".join(f"stage {p} {float(np.nanmedian(parts.stage_ratio[rows, p])):.2f}x"
                       for p in slow_stages)
    evidence = [Evidence("steps", as_datetime(scores.end_ts.get(step)),
                         f"pipeline stage {', '.join(map(str, slow_stages))} (ranks "
                         f"{ranks_text(ranks)}) "
                         f"computes slower than the other stages' median in every replica "
                         f"({layout.describe()}; {ratios}) over steps "
                         f"{steps_window[0]}-{steps_window[-1]}: a "
                         "pipeline imbalance (more layers, a heavier loss head) or a "
                         "configuration, "
                         f"no node to blame")]
    fixed = compute.copy()
    for p in slow_stages:
        cols = layout.stage == p
        factor = np.clip(np.nan_to_num(parts.stage_ratio[:, p], nan=1.0), 1.0, None)
        fixed[:, cols] = compute[:, cols] / factor[:, None]
    slow_rows = since(steps, steps_window[0], parts.stage_flag[:, slow_stages].any(axis=1))
    whatif = finding_what_if(t, scores, fixed, slow_rows, np.isin(layout.ranks, ranks)[None, :],
                             stage_section_refs(scores, slow_stages))
    return StragglerFinding("stage", step, ranks, "stage:" + ",".join(map(str, slow_stages)),
                            steps_window, evidence, whatif, {"stages": slow_stages})


def _slow_without(t: StragglerThresholds, scores: StepScores, stage: int,
                  persistent_ranks: set[int], valid: np.ndarray) -> bool:
    """Is `stage` still persistently slow against the other stages once the replicas with a
    persistent slow worker are left out (each remaining replica's unit the median of its ranks, a
    stage's level the median over those replicas, or the faster of two, as the stage effect
    takes it)? A slow worker makes its own stage look slow (with two replicas the stage's level is
    then one sample against the faster of two elsewhere): the same cause, not a second one. With
    fewer than two replicas left the stage's level would rest on one sample, without the
    protection against one rank's noise the stage effect has: no evidence beyond the worker,
    False."""
    layout = scores.layout
    compute = scores.compute.to_numpy(dtype=float)
    dirty = {int(d) for d, r in zip(layout.replica, layout.ranks, strict=True)
             if int(r) in persistent_ranks}
    clean = [d for d in range(layout.replicas) if d not in dirty]
    if len(clean) < 2:
        return False
    levels = np.full((compute.shape[0], layout.stages), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for q in range(layout.stages):
            units = np.column_stack([
                np.nanmedian(compute[:, (layout.stage == q) & (layout.replica == d)], axis=1)
                for d in clean
            ])
            levels[:, q] = (np.nanmedian(units, axis=1) if len(clean) >= 3
                            else np.nanmin(units, axis=1))
        others = np.nanmedian(np.delete(levels, stage, axis=1), axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = levels[:, stage] / others
    flag = np.nan_to_num(ratio, nan=0.0) >= t.stage_min_ratio
    return bool(persistent(t, flag[:, None], valid).any())


def _replica_slow_without(t: StragglerThresholds, scores: StepScores, replica: int,
                          persistent_ranks: set[int], valid: np.ndarray) -> bool:
    """Is `replica` still persistently slow once the stages where it has a persistent slow worker
    are left out (at least replica_min_fraction of its other stages, 2 at least, slow against the
    same stages of the other replicas)? One slow worker makes its replica's flag need only one more
    stage slow by noise: the same cause, not a second one."""
    layout, parts = scores.layout, scores.parts
    mine = layout.replica == replica
    dirty = {int(q) for q, r in zip(layout.stage[mine], layout.ranks[mine], strict=True)
             if int(r) in persistent_ranks}
    clean = [q for q in range(layout.stages) if q not in dirty]
    if len(clean) < 2:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ratios = np.column_stack([
            np.nanmedian(parts.worker_ratio[:, mine & (layout.stage == q)], axis=1)
            for q in clean
        ])
    slow = (np.nan_to_num(ratios, nan=0.0) >= t.min_ratio).sum(axis=1)
    flag = (slow / len(clean) >= t.replica_min_fraction) & (slow >= 2)
    return bool(persistent(t, flag[:, None], valid).any())


def _replica_findings(
    t: StragglerThresholds, scores: StepScores, valid: np.ndarray,
    persistent_ranks: set[int] = frozenset(),
) -> list[StragglerFinding]:
    """Replica effect: every stage of one replica slow against the other replicas; a replica with
    a persistent slow worker only when it is slow without that worker's stage."""
    layout, parts = scores.layout, scores.parts
    steps = list(scores.compute.index)
    compute = scores.compute.to_numpy(dtype=float)
    replica_persistent = persistent(t, parts.replica_flag, valid)
    found = []
    for d in np.flatnonzero(replica_persistent.any(axis=0)):
        d = int(d)
        holds = {int(r) for r in layout.ranks[layout.replica == d]} & persistent_ranks
        if holds and not _replica_slow_without(t, scores, d, persistent_ranks, valid):
            continue  # its slow worker is the cause: its worker finding, not a second one
        first = int(np.flatnonzero(replica_persistent[:, d])[0])
        step = steps[first]
        steps_window = window(t, steps, step)
        ranks = layout.columns(layout.replica == d)
        nodes = sorted({n for n, r in zip(layout.nodes, layout.ranks, strict=True)
                        if n and int(r) in ranks})
        rows = np.isin(scores.compute.index, steps_window)
        ratio = float(np.nanmedian(parts.replica_ratio[rows, d]))
        shared = (
            f"its node {nodes[0]}"
            if len(nodes) == 1
            else f"what its nodes {', '.join(nodes)} share (a switch, the network, storage)"
            if nodes
            else "a resource its ranks share"
        )
        evidence = [Evidence("steps", as_datetime(scores.end_ts.get(step)),
                             f"replica {d} (ranks {ranks_text(ranks)}) computes {ratio:.2f}x the "
                             "same stages "
                             f"of the other replicas in every stage ({layout.describe()}) over "
                             "steps "
                             f"{steps_window[0]}-{steps_window[-1]}: the slowness is the "
                             "replica's, pointing at "
                             f"{shared}")]
        cols = layout.replica == d
        fixed = compute.copy()
        fixed[:, cols] = np.minimum(compute[:, cols], parts.peer_ref[:, cols])
        slow_rows = since(steps, steps_window[0], parts.replica_flag[:, d])
        whatif = finding_what_if(t, scores, fixed, slow_rows, cols[None, :])
        found.append(
            StragglerFinding(
                "replica",
                step,
                ranks,
                f"replica:{d}",
                steps_window,
                evidence,
                whatif,
                {"replica": d, "nodes": nodes},
            )
        )
    return found


def _worker_findings(t: StragglerThresholds, first: dict[int, int], placement: dict[int, Placement],
                     scores: StepScores) -> list[StragglerFinding]:
    """Persistent slow workers (rank -> first persistent step): one finding per node, or one
    systemic finding when they are on SYSTEMIC_MIN_NODES nodes or more."""
    steps = list(scores.compute.index)
    layout, parts = scores.layout, scores.parts
    compute = scores.compute.to_numpy(dtype=float)
    by_node: dict[str, list[int]] = {}
    for rank in first:
        node = (
            placement[rank].node if rank in placement and placement[rank].node else f"rank-{rank}"
        )
        by_node.setdefault(node, []).append(rank)

    def fixed_for(ranks: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cols = np.isin(layout.ranks, ranks)
        fixed = compute.copy()
        fixed[:, cols] = np.minimum(
            compute[:, cols], np.nan_to_num(parts.peer_ref[:, cols], nan=np.inf)
        )
        flagged = scores.flagged.loc[:, ranks].to_numpy().any(axis=1)
        return fixed, flagged, cols

    if len(by_node) >= SYSTEMIC_MIN_NODES:
        step = min(first.values())
        steps_window = window(t, steps, step)
        ranks = sorted(first)
        fixed, flagged, cols = fixed_for(ranks)
        whatif = finding_what_if(
            t, scores, fixed, since(steps, steps_window[0], flagged), cols[None, :]
        )
        return [
            StragglerFinding(
                "systemic",
                step,
                ranks,
                "systemic",
                steps_window,
                [
                    Evidence(
                        "steps",
                        as_datetime(scores.end_ts.get(step)),
                        f"{len(ranks)} ranks on {len(by_node)} nodes persistently slower than "
                        f"{scores.group_kind} from "
                        f"step {step}, in no one stage or replica: a systemic imbalance, not one "
                        "node",
                    )
                ],
                whatif,
                {"nodes": sorted(by_node)},
            )
        ]
    found = []
    for node, ranks in sorted(by_node.items()):
        step = min(first[r] for r in ranks)
        steps_window = window(t, steps, step)
        fixed, flagged, cols = fixed_for(sorted(ranks))
        whatif = finding_what_if(
            t, scores, fixed, since(steps, steps_window[0], flagged), cols[None, :]
        )
        found.append(
            StragglerFinding("rank", step, sorted(ranks), f"node:{node}", steps_window, [], whatif)
        )
    return found


def _moving_finding(t: StragglerThresholds, scores: StepScores, worker_persistent: np.ndarray,
                    valid: np.ndarray) -> StragglerFinding | None:
    """Slow outliers in many steps, spread over many ranks, none of them persistent: the imbalance
    moves with the data."""
    w = t.window_steps
    steps = list(scores.compute.index)
    flagged_frame = scores.flagged
    flags = flagged_frame.to_numpy()
    window_count = rolling_sum(valid.astype(float), w)
    with np.errstate(invalid="ignore", divide="ignore"):
        step_fraction = rolling_sum(flags.any(axis=1).astype(float), w) / window_count
        per_rank = rolling_sum(flags, w)
        distinct = (per_rank > 0).sum(axis=1)
        # moving: no rank is slow in more than half the share that would make it persistent
        concentrated = per_rank.max(axis=1) / window_count >= t.persistence / 2
    pattern = (
        (step_fraction >= t.moving_min_step_fraction)
        & (distinct >= t.moving_min_distinct_ranks)
        & ~worker_persistent.any(axis=1)
        & ~concentrated
        & (window_count >= t.min_window_steps)
    )
    # the pattern itself must last (a load spike or a few noisy steps make it for a moment): held at
    # `persistence` of a full window of positions
    held = rolling_sum(pattern.astype(float), w)
    moving = (held >= t.persistence * w) & (np.arange(len(held)) >= w - 1)
    if not moving.any():
        return None
    step = int(flagged_frame.index[int(moving.argmax())])
    steps_window = window(t, steps, step)
    flagged = flagged_frame.loc[steps_window]
    ranks = sorted(int(r) for r in flagged.columns[flagged.any(axis=0)])
    counts = flagged.sum(axis=0)
    rows = np.isin(flagged_frame.index, steps_window)
    compute = scores.compute.to_numpy(dtype=float)
    cells = flagged_frame.to_numpy()
    fixed = np.where(
        cells, np.minimum(compute, np.nan_to_num(scores.parts.peer_ref, nan=np.inf)), compute
    )
    whatif = finding_what_if(t, scores, fixed, rows, cells)
    return StragglerFinding("moving", step, ranks, "moving", steps_window, [Evidence(
        "steps", as_datetime(scores.end_ts.get(step)),
        f"slow outliers in {int(flagged.any(axis=1).sum())} of {len(steps_window)} steps "
        f"({steps_window[0]}-{steps_window[-1]}), spread over {len(ranks)} ranks, none slow in "
        "more than "
        f"{int(counts.max())} of them: the imbalance moves with the data")], whatif)
