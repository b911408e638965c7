"""Straggler detection from per-rank compute-section timings, decomposed over the job's parallel coordinates, with
the what-if cost of each slowdown and the GPU signals that explain a slow GPU.

Synchronous training makes every rank's step wall time the same, so only a rank's own work (the sections the
vocabulary of rules/comm_ops.yaml calls compute or data; communication is waiting, unknown sections are reported
and never scored) says who is slow. Per step, compute is decomposed (attribution/straggler_decompose.py) into
- a stage effect: a pipeline stage slow in every replica -> one systemic incident (workload_imbalance: layers or
  a loss head), notified, no node excluded;
- a replica effect: every stage of one replica slow -> the replica, and what it shares (its node when it holds
  one, else the switch or network its nodes share);
- a worker effect: a rank slow against the same place in the other replicas (or its own history with one
  replica) -> that rank's node (or the whole node when most of its ranks are slow); the cause from its GPU samples
  (thermal bits 0x20/0x40, power brake 0x80, hot, clocks down relative to peers) or gpu_events, else unknown;
- slow workers on many nodes, or slow outliers that move between ranks from step to step (data-dependent
  imbalance) -> workload_imbalance, no node to blame.
A finding is persistent: slow in at least `persistence` of a window of steps; one-off slow steps and evaluation
steps never count. Every finding carries its what-if (attribution/straggler_whatif.py): the step time if the
culprit ran at its peers' speed, "fixing this saves N% of step time"; a finding that would save less than
min_step_slowdown raises nothing. Evidence cites only the tables that hold it, and confidence counts only what
was used. Per-node multi-metric vectors (compute ratio, and SM clock, temperature, power, throttle share where
GPU samples exist) are scored with a robust covariance estimate (scikit-learn MinCovDet) when the job spans enough
nodes.
"""

from __future__ import annotations

import datetime as dt
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from faultlens.attribution.hardware import as_datetime, row_identifies_gpu, same_gpu
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.rules import StragglerThresholds
from faultlens.attribution.straggler_decompose import Decomposition, decompose, nanmedian, robust_z, rolling_sum
from faultlens.attribution.straggler_layout import Layout, build_layout
from faultlens.attribution.straggler_vocab import SectionKind, Vocabulary, load_vocabulary
from faultlens.attribution.straggler_whatif import StepModel, WhatIf, what_if
from faultlens.attribution.telemetry import SECTION_PREFIX, Placement, Telemetry, placements, section_columns

SYSTEMIC_MIN_NODES = 3
MAX_PEER_NODES = 63  # peers whose GPU samples are compared with the culprit's
UNKNOWN_SHARE_REPORTED = 0.02  # unknown sections holding at least this share of step time are named
# the data-parallel sync: collectives across replicas whose waiting is a replica's slack behind the slowest one
SYNC_OPS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})


def _section_ratios(scores: StepScores, rank: int, column: int, rows: np.ndarray) -> dict[str, float]:
    """Each compute section of `rank` against its peers' reference, median over `rows` (finite ones only)."""
    ratios = {}
    for name, frame in scores.sections.items():
        mine = frame[rank].to_numpy(dtype=float)[rows]
        ref = scores.parts.section_refs[name][rows, column]
        with np.errstate(invalid="ignore", divide="ignore"):
            value = float(np.nanmedian(mine / ref)) if np.isfinite(mine).any() else np.nan
        if np.isfinite(value):
            ratios[name] = value
    return ratios

__all__ = ["StepScores", "StragglerDetector", "StragglerFinding", "robust_z"]


@dataclass(frozen=True)
class StepScores:
    """Per-step, per-rank scores of one attempt (frames: index step, columns rank)."""

    compute: pd.DataFrame  # own-work seconds
    ratio: pd.DataFrame  # worker ratio: compute / the same place in the other replicas (or own history)
    flagged: pd.DataFrame  # worker slow this step (bool)
    sections: dict[str, pd.DataFrame]  # own-work section -> seconds
    layout: Layout
    parts: Decomposition
    step_s: np.ndarray  # observed step time per step (median over ranks)
    start_ts: pd.Series  # per step: earliest start
    end_ts: pd.Series  # per step: latest end
    comm_sections: dict[str, str] = field(default_factory=dict)  # comm section -> collective kind
    unknown_sections: dict[str, float] = field(default_factory=dict)  # unknown section -> share of step time
    sync: pd.DataFrame | None = None  # seconds in data-parallel sync collectives (SYNC_OPS), where timed
    ends: pd.DataFrame | None = None  # each rank's step end, epoch seconds (where sync is timed)
    remaining: Remaining | None = None  # the job's remaining time, from the length it declares (None: unknown)

    @property
    def group_kind(self) -> str:
        return self.parts.comparison


@dataclass(frozen=True)
class Remaining:
    """The job's remaining run time: the steps it declares it will run (the ranks rows' total_steps, which the step
    timer writes from StepTimer(total_steps=), $FAULTLENS_TOTAL_STEPS or `faultlens run --total-steps`) less the
    steps done, times the recent step time (the median of the last window's steps, the slowdown included)."""

    seconds: float
    total_steps: int
    last_step: int
    step_s: float

    def details(self) -> dict[str, float | int]:
        return {"remaining_s": round(self.seconds, 3), "total_steps": self.total_steps,
                "remaining_from_step": self.last_step, "remaining_step_s": round(self.step_s, 6)}


def remaining_time(ranks_table: pd.DataFrame, attempt: int | None, last_step: int,
                   recent_step_s: float) -> Remaining | None:
    """The job's remaining time from its declared total_steps (the ranks rows of `attempt`, else of the job;
    ranks that disagree: the least), or None when nothing declares it or the step time is unknown."""
    if ranks_table is None or ranks_table.empty or "total_steps" not in ranks_table.columns:
        return None
    rows = ranks_table
    if attempt is not None and "attempt" in rows.columns and (rows["attempt"] == attempt).any():
        rows = rows[rows["attempt"] == attempt]
    declared = pd.to_numeric(rows["total_steps"], errors="coerce")
    declared = declared[declared > 0]
    if declared.empty or not np.isfinite(recent_step_s) or recent_step_s <= 0:
        return None
    total = int(declared.min())
    left = max(0, total - int(last_step) - 1)  # steps numbered from 0: the last one is total - 1
    return Remaining(left * float(recent_step_s), total, int(last_step), float(recent_step_s))


@dataclass
class StragglerFinding:
    """One detected slowdown before it becomes an incident."""

    kind: str  # rank, stage, replica, moving, systemic
    step: int  # the step at which it was first persistent
    ranks: list[int]
    key: str
    window: list[int] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    whatif: WhatIf | None = None
    where: dict = field(default_factory=dict)  # stage / replica / nodes of a systemic finding


def _ranks_text(ranks: list[int]) -> str:
    return f"{ranks[:8]}{'...' if len(ranks) > 8 else ''}"


class StragglerDetector:
    """Scores per-rank section timings and turns persistent slowness into straggler incidents."""

    def __init__(self, thresholds: StragglerThresholds, vocabulary: Vocabulary | None = None) -> None:
        self.t = thresholds
        self.vocabulary = vocabulary or load_vocabulary(thresholds.vocabulary_files)

    # ------------------------------------------------------------ scoring

    def classify_sections(self, steps: pd.DataFrame) -> tuple[list[str], dict[str, str], list[str]]:
        """(own-work section columns, comm section -> collective kind, unknown section names)."""
        names = [c[len(SECTION_PREFIX):] for c in section_columns(steps)]
        excluded = [e.lower() for e in self.t.exclude_sections]
        names = [n for n in names if not any(e in n.lower() for e in excluded)]
        chosen, classes = self.vocabulary.scored(names)
        comm = {n: c.op or "other" for n, c in classes.items() if c.kind is SectionKind.COMM}
        unknown = [n for n, c in classes.items() if c.kind is SectionKind.UNKNOWN]
        return [SECTION_PREFIX + n for n in chosen], comm, unknown

    def compute_sections(self, steps: pd.DataFrame) -> list[str]:
        return self.classify_sections(steps)[0]

    def scores(self, attempt_steps: pd.DataFrame, placement: dict[int, Placement],
               ranks_table: pd.DataFrame | None = None, attempt: int | None = None) -> StepScores | None:
        """Score one attempt's steps; None when there is nothing to score (no own-work sections, no steps)."""
        t = self.t
        sections, comm, unknown = self.classify_sections(attempt_steps)
        if not sections or attempt_steps.empty:
            return None
        wanted = [c for c in ("step", "rank", "phase", "ts", "start_ts", "end_ts", "duration_s")
                  if c in attempt_steps.columns]
        sync_columns = [SECTION_PREFIX + n for n, op in comm.items() if op in SYNC_OPS
                        and SECTION_PREFIX + n in attempt_steps.columns]
        rows = attempt_steps[wanted + sections + [SECTION_PREFIX + n for n in unknown] + sync_columns]
        rows = rows.assign(**own_time(attempt_steps, sections, comm))
        keep = (rows["step"].notna() & rows["rank"].notna()).to_numpy().copy()
        if "phase" in rows.columns:
            phase = rows["phase"].astype(object)
            keep &= phase.where(phase.notna(), "train").isin(t.phases).to_numpy()
        if not keep.any():
            return None
        step_values = rows["step"].to_numpy(dtype=float, na_value=np.nan)
        keep &= step_values >= np.nanmin(step_values[keep]) + t.warmup_steps
        own = rows[sections].to_numpy(dtype=float, na_value=np.nan)
        total_compute = np.where(np.isfinite(own).any(axis=1), np.nansum(own, axis=1), np.nan)
        keep &= np.isfinite(total_compute)
        if not keep.any():
            return None
        rows = rows[keep].assign(_compute=total_compute[keep])
        rows = rows.assign(step=rows["step"].astype(np.int64), rank=rows["rank"].astype(np.int64))
        matrix = _Matrix(rows["step"].to_numpy(), rows["rank"].to_numpy())
        compute = matrix.frame(rows["_compute"].to_numpy(dtype=float))
        section_frames = {c[len(SECTION_PREFIX):]: matrix.frame(rows[c].to_numpy(dtype=float))
                          for c in sections if rows[c].notna().any()}
        done = rows["end_ts"].where(rows["end_ts"].notna(), rows["ts"]) if "end_ts" in rows.columns else rows["ts"]
        begun = rows["start_ts"].where(rows["start_ts"].notna(), done) if "start_ts" in rows.columns else done
        duration = rows["duration_s"].astype(float) if "duration_s" in rows.columns else \
            pd.Series(np.nan, index=rows.index)
        duration = duration.where(duration.notna(), (done - begun).dt.total_seconds())
        step_s = matrix.frame(duration.to_numpy(dtype=float)).median(axis=1).to_numpy(dtype=float)
        sync = ends = None
        if sync_columns:
            waits = rows[sync_columns].to_numpy(dtype=float, na_value=np.nan)
            sync = matrix.frame(np.where(np.isfinite(waits).any(axis=1), np.nansum(waits, axis=1), np.nan))
            stamps = pd.to_datetime(done, utc=True, errors="coerce")
            epoch = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=float, na_value=np.nan)
            ends = matrix.frame(epoch)
        start_ts = begun.groupby(rows["step"]).min().reindex(compute.index)
        end_ts = done.groupby(rows["step"]).max().reindex(compute.index)
        layout = build_layout(list(compute.columns), ranks_table if ranks_table is not None else pd.DataFrame(),
                              attempt, placement)
        parts = decompose(compute.to_numpy(dtype=float),
                          {k: v.to_numpy(dtype=float) for k, v in section_frames.items()}, layout, t)
        ratio = pd.DataFrame(parts.worker_ratio, index=compute.index, columns=compute.columns)
        flagged = pd.DataFrame(parts.worker_flag, index=compute.index, columns=compute.columns)
        shares = {}
        total = float(np.nansum(duration.to_numpy(dtype=float)))
        for name in unknown:
            column = SECTION_PREFIX + name
            if column in rows.columns and total > 0:
                share = float(rows[column].astype(float).sum()) / total
                if share >= UNKNOWN_SHARE_REPORTED:
                    shares[name] = share
        return StepScores(compute, ratio, flagged, section_frames, layout, parts, step_s, start_ts, end_ts,
                          {n: op for n, op in comm.items() if SECTION_PREFIX + n in attempt_steps.columns}, shares,
                          sync, ends)

    # ------------------------------------------------------------ findings

    def _persistent(self, flags: np.ndarray, valid: np.ndarray, *, pairwise: bool = False) -> np.ndarray:
        """steps x k: persistent at step s (flagged in >= persistence of the last window_steps valid steps;
        `pairwise`: each column was compared with one partner only, which needs pairwise_persistence).
        A window not yet full (the first steps of an attempt, at least min_window_steps) needs stronger evidence,
        rising linearly from the persistence at a full window to every step flagged at no steps: a few
        contention spikes in the first steps of a loaded machine are not a straggler, a rank slow in every step
        is one from min_window_steps on."""
        w = self.t.window_steps
        needed = max(self.t.persistence, self.t.pairwise_persistence) if pairwise else self.t.persistence
        counts = rolling_sum(valid.astype(float)[:, None], w)
        hits = rolling_sum(flags & valid[:, None], w)
        with np.errstate(invalid="ignore", divide="ignore"):
            fraction = np.where(counts > 0, hits / np.maximum(counts, 1), 0.0)
        missing = np.clip(1.0 - counts / w, 0.0, 1.0)
        needed_here = needed + (1.0 - needed) * missing
        return (fraction >= needed_here - 1e-9) & (counts >= self.t.min_window_steps)

    def _window(self, steps: list[int], step: int) -> list[int]:
        position = steps.index(step)
        return steps[max(0, position - self.t.window_steps + 1): position + 1]

    def findings(self, scores: StepScores, placement: dict[int, Placement]) -> list[StragglerFinding]:
        layout, parts = scores.layout, scores.parts
        steps = list(scores.compute.index)
        compute = scores.compute.to_numpy(dtype=float)
        valid = np.isfinite(compute).any(axis=1)
        found: list[StragglerFinding] = []
        claimed: set[int] = set()

        worker_persistent = self._persistent(parts.worker_flag, valid, pairwise=layout.replicas == 2)
        persistent_ranks = {int(layout.ranks[j]) for j in np.flatnonzero(worker_persistent.any(axis=0))}

        # stage effect: slow in every replica; with one replica only when it did not become slow (own history)
        if layout.stages >= 2:
            stage_persistent = self._persistent(parts.stage_flag, valid)
            slow_stages = []
            for p in np.flatnonzero(stage_persistent.any(axis=0)):
                members = layout.columns(layout.stage == p)
                if layout.replicas == 1 and set(members) <= persistent_ranks:
                    continue  # one replica: the stage's worker became slow, a worker finding
                slow_stages.append(int(p))
            if slow_stages:
                first = min(int(np.flatnonzero(stage_persistent[:, p])[0]) for p in slow_stages)
                step = steps[first]
                ranks = sorted(r for p in slow_stages for r in layout.columns(layout.stage == p))
                window = self._window(steps, step)
                rows = np.isin(scores.compute.index, window)
                ratios = ", ".join(f"stage {p} {float(np.nanmedian(parts.stage_ratio[rows, p])):.2f}x"
                                   for p in slow_stages)
                evidence = [Evidence("steps", as_datetime(scores.end_ts.get(step)),
                                     f"pipeline stage {', '.join(map(str, slow_stages))} (ranks {_ranks_text(ranks)}) "
                                     f"computes slower than the other stages' median in every replica "
                                     f"({layout.describe()}; {ratios}) over steps {window[0]}-{window[-1]}: a "
                                     f"pipeline imbalance (more layers, a heavier loss head) or a configuration, "
                                     f"no node to blame")]
                fixed = compute.copy()
                for p in slow_stages:
                    cols = layout.stage == p
                    factor = np.clip(np.nan_to_num(parts.stage_ratio[:, p], nan=1.0), 1.0, None)
                    fixed[:, cols] = compute[:, cols] / factor[:, None]
                since = self._since(steps, window[0], parts.stage_flag[:, slow_stages].any(axis=1))
                whatif = self._what_if(scores, fixed, since, np.isin(layout.ranks, ranks)[None, :],
                                       self._stage_section_refs(scores, slow_stages))
                found.append(StragglerFinding("stage", step, ranks, "stage:" + ",".join(map(str, slow_stages)),
                                              window, evidence, whatif, {"stages": slow_stages}))
                if layout.replicas == 1:
                    claimed.update(ranks)

        # replica effect: every stage of one replica
        if layout.replicas >= 2 and layout.stages >= 2:
            replica_persistent = self._persistent(parts.replica_flag, valid)
            for d in np.flatnonzero(replica_persistent.any(axis=0)):
                d = int(d)
                first = int(np.flatnonzero(replica_persistent[:, d])[0])
                step = steps[first]
                window = self._window(steps, step)
                ranks = layout.columns(layout.replica == d)
                claimed.update(ranks)
                nodes = sorted({n for n, r in zip(layout.nodes, layout.ranks, strict=True)
                                if n and int(r) in ranks})
                rows = np.isin(scores.compute.index, window)
                ratio = float(np.nanmedian(parts.replica_ratio[rows, d]))
                shared = (f"its node {nodes[0]}" if len(nodes) == 1 else
                          f"what its nodes {', '.join(nodes)} share (a switch, the network, storage)" if nodes
                          else "a resource its ranks share")
                evidence = [Evidence("steps", as_datetime(scores.end_ts.get(step)),
                                     f"replica {d} (ranks {_ranks_text(ranks)}) computes {ratio:.2f}x the same stages "
                                     f"of the other replicas in every stage ({layout.describe()}) over steps "
                                     f"{window[0]}-{window[-1]}: the slowness is the replica's, pointing at "
                                     f"{shared}")]
                cols = layout.replica == d
                fixed = compute.copy()
                fixed[:, cols] = np.minimum(compute[:, cols], parts.peer_ref[:, cols])
                since = self._since(steps, window[0], parts.replica_flag[:, d])
                whatif = self._what_if(scores, fixed, since, cols[None, :])
                found.append(StragglerFinding("replica", step, ranks, f"replica:{d}", window, evidence, whatif,
                                              {"replica": d, "nodes": nodes}))

        # worker effect
        first_persistent = {}
        for j in np.flatnonzero(worker_persistent.any(axis=0)):
            rank = int(layout.ranks[j])
            if rank not in claimed:
                first_persistent[rank] = steps[int(np.flatnonzero(worker_persistent[:, j])[0])]
        if first_persistent:
            found.extend(self._persistent_findings(first_persistent, placement, scores))

        moving = self._moving_finding(scores, worker_persistent, valid)
        if moving is not None:
            found.append(moving)
        return [f for f in found if self._material(f)]

    def _material(self, finding: StragglerFinding) -> bool:
        """Worth an incident: fixing it would save at least min_step_slowdown of step time (no what-if: kept)."""
        if finding.whatif is None:
            return True
        needed = self.t.moving_min_step_slowdown if finding.kind == "moving" else self.t.min_step_slowdown
        return finding.whatif.slowdown >= needed

    @staticmethod
    def _since(steps: list[int], first: int, flagged: np.ndarray) -> np.ndarray:
        """The rows from `first` on where the culprit is flagged (the slowdown as it is now)."""
        return (np.asarray(steps) >= first) & np.asarray(flagged, dtype=bool)

    @staticmethod
    def _stage_section_refs(scores: StepScores, stages: list[int]) -> dict[str, np.ndarray]:
        """Per section, the other stages' level for the ranks of the slow stages (an op kind of a slow stage is
        compared with the same op kind of the other stages, not with its own stage in other replicas)."""
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

    def _what_if(self, scores: StepScores, fixed: np.ndarray, rows: np.ndarray, mask: np.ndarray,
                 section_refs: dict[str, np.ndarray] | None = None) -> WhatIf | None:
        if not rows.any():
            return None
        compute = scores.compute.to_numpy(dtype=float)[rows]
        sections = {k: v.to_numpy(dtype=float)[rows] for k, v in scores.sections.items()}
        refs = {k: v[rows] for k, v in (section_refs or scores.parts.section_refs).items()}
        cells = np.broadcast_to(mask, scores.compute.shape)[rows]
        arrival = None
        if self.t.whatif.sync_arrivals and scores.sync is not None and scores.ends is not None:
            # when each rank reached the data-parallel sync: its step end less its time in the sync
            arrival = (scores.ends.to_numpy(dtype=float) - scores.sync.to_numpy(dtype=float))[rows]
        return what_if(StepModel(scores.layout), compute, fixed[rows], scores.step_s[rows],
                       self.t.whatif.microbatches, sections, refs, cells, arrival=arrival)

    def _persistent_findings(self, first: dict[int, int], placement: dict[int, Placement],
                             scores: StepScores) -> list[StragglerFinding]:
        steps = list(scores.compute.index)
        layout, parts = scores.layout, scores.parts
        compute = scores.compute.to_numpy(dtype=float)
        by_node: dict[str, list[int]] = {}
        for rank in first:
            node = placement[rank].node if rank in placement and placement[rank].node else f"rank-{rank}"
            by_node.setdefault(node, []).append(rank)

        def fixed_for(ranks: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            cols = np.isin(layout.ranks, ranks)
            fixed = compute.copy()
            fixed[:, cols] = np.minimum(compute[:, cols], np.nan_to_num(parts.peer_ref[:, cols], nan=np.inf))
            flagged = scores.flagged.loc[:, ranks].to_numpy().any(axis=1)
            return fixed, flagged, cols

        if len(by_node) >= SYSTEMIC_MIN_NODES:
            step = min(first.values())
            window = self._window(steps, step)
            ranks = sorted(first)
            fixed, flagged, cols = fixed_for(ranks)
            whatif = self._what_if(scores, fixed, self._since(steps, window[0], flagged), cols[None, :])
            return [StragglerFinding("systemic", step, ranks, "systemic", window, [Evidence(
                "steps", as_datetime(scores.end_ts.get(step)),
                f"{len(ranks)} ranks on {len(by_node)} nodes persistently slower than {scores.group_kind} from "
                f"step {step}, in no one stage or replica: a systemic imbalance, not one node")], whatif,
                {"nodes": sorted(by_node)})]
        found = []
        for node, ranks in sorted(by_node.items()):
            step = min(first[r] for r in ranks)
            window = self._window(steps, step)
            fixed, flagged, cols = fixed_for(sorted(ranks))
            whatif = self._what_if(scores, fixed, self._since(steps, window[0], flagged), cols[None, :])
            found.append(StragglerFinding("rank", step, sorted(ranks), f"node:{node}", window, [], whatif))
        return found

    def _moving_finding(self, scores: StepScores, persistent: np.ndarray, valid: np.ndarray) \
            -> StragglerFinding | None:
        t = self.t
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
        pattern = ((step_fraction >= t.moving_min_step_fraction) & (distinct >= t.moving_min_distinct_ranks)
                   & ~persistent.any(axis=1) & ~concentrated & (window_count >= t.min_window_steps))
        # the pattern itself must last (a load spike or a few noisy steps make it for a moment): held at
        # `persistence` of a full window of positions
        held = rolling_sum(pattern.astype(float), w)
        moving = (held >= t.persistence * w) & (np.arange(len(held)) >= w - 1)
        if not moving.any():
            return None
        step = int(flagged_frame.index[int(moving.argmax())])
        window = self._window(steps, step)
        flagged = flagged_frame.loc[window]
        ranks = sorted(int(r) for r in flagged.columns[flagged.any(axis=0)])
        counts = flagged.sum(axis=0)
        rows = np.isin(flagged_frame.index, window)
        compute = scores.compute.to_numpy(dtype=float)
        cells = flagged_frame.to_numpy()
        fixed = np.where(cells, np.minimum(compute, np.nan_to_num(scores.parts.peer_ref, nan=np.inf)), compute)
        whatif = self._what_if(scores, fixed, rows, cells)
        return StragglerFinding("moving", step, ranks, "moving", window, [Evidence(
            "steps", as_datetime(scores.end_ts.get(step)),
            f"slow outliers in {int(flagged.any(axis=1).sum())} of {len(window)} steps ({window[0]}-{window[-1]}), "
            f"spread over {len(ranks)} ranks, none slow in more than {int(counts.max())} of them: the imbalance "
            "moves with the data")], whatif)

    # ------------------------------------------------------------ evidence and cause

    def describe_ranks(self, finding: StragglerFinding, scores: StepScores,
                       placement: dict[int, Placement]) -> list[Evidence]:
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
            finite = _section_ratios(scores, rank, j, use)
            if finite:
                worst = max(finite, key=lambda k: finite[k])
                section_text = f"; slowest section {worst} {finite[worst]:.2f}x"
            own = self._own_history(rank, j, window, scores)
            where = f" on {placement[rank].node}" if rank in placement and placement[rank].node else ""
            coords = (f" (replica {int(layout.replica[j])}, stage {int(layout.stage[j])})"
                      if layout.stages > 1 or "dp_rank" in layout.declared else "")
            base = ("its own earlier median" if scores.group_kind == "own history"
                    else f"its peers' median ({scores.group_kind})")
            lead = f"compute {ratio:.2f}x {base}"
            if finite and scores.group_kind != "own history" and finite[worst] > 1.1 * max(ratio, 1.0):
                # the total hides the slow section (peers wait for the rank inside theirs): lead with the section
                lead = (f"slowest section {worst} {finite[worst]:.2f}x peers, while its compute sections together "
                        f"are {ratio:.2f}x {base} (its peers wait for it inside theirs)")
                section_text = ""
            evidence.append(Evidence(
                "steps", end, f"rank {rank}{where}{coords}: {lead}, "
                              f"slow in {flagged} of {len(window)} steps ({window[0]}-{window[-1]}){section_text}"
                              f"{own}"))
        return evidence

    def _own_history(self, rank: int, column: int, window: list[int], scores: StepScores) -> str:
        """Was the rank slow from the start (a weaker GPU, a heavier partition) or did it become slow (fail-slow)?
        From its own steps: the strongest change point of its compute (median after / median before)."""
        compute = scores.compute[rank].dropna()
        values = compute.to_numpy(dtype=float)
        least = max(3, self.t.min_window_steps // 2)
        if len(values) < 2 * least:
            return "; no earlier history of its own"
        best, at = 0.0, None
        for k in range(least, len(values) - least + 1):
            before = float(np.median(values[max(0, k - self.t.self_baseline_steps):k]))
            after = float(np.median(values[k:]))
            if before > 0 and after / before > best:
                best, at = after / before, int(compute.index[k])
        if at is not None and best >= 1 + (self.t.min_ratio - 1) / 2:
            return f"; {best:.2f}x its own earlier median from step {at}: it became slow"
        if scores.layout.replicas >= 2:
            earlier = float(scores.ratio[rank].loc[compute.index[:least]].median())
            return f"; {earlier:.2f}x its peers already in its first steps: slow from the start"
        return f"; {best:.2f}x its own earlier median"

    def became_slow(self, finding: StragglerFinding, scores: StepScores) -> bool:
        return any("became slow" in self._own_history(r, int(np.searchsorted(scores.layout.ranks, r)),
                                                      finding.window, scores) for r in finding.ranks[:4])

    def gpu_cause(self, finding: StragglerFinding, scores: StepScores, placement: dict[int, Placement],
                  telemetry: Telemetry) -> tuple[Cause, float, list[Evidence], list[str], pd.DataFrame | None]:
        """Cause from the culprits' GPU samples (and gpu_events) in the window, compared with their peers'.
        Returns (cause, confidence bonus, evidence, culprit GPUs, the window's samples or None)."""
        g = self.t.gpu
        start = as_datetime(scores.start_ts.loc[finding.window].min())
        end = as_datetime(scores.end_ts.loc[finding.window].max())
        nodes = sorted({p.node for p in placement.values() if p.node})
        culprit_nodes = sorted({placement[r].node for r in finding.ranks if r in placement and placement[r].node})
        if start is None or end is None or not culprit_nodes:
            return Cause.UNKNOWN, 0.0, [], [], None
        peers_to_fetch = [n for n in nodes if n not in culprit_nodes][:MAX_PEER_NODES]
        samples = telemetry.fetch_samples(culprit_nodes + peers_to_fetch, start, end)
        evidence: list[Evidence] = []
        gpus: list[str] = []
        cause, bonus = Cause.UNKNOWN, 0.0
        if not samples.empty:
            samples = samples.assign(_gpu=_gpu_key(samples))
            mine_mask = pd.Series(False, index=samples.index)
            for rank in finding.ranks:
                p = placement.get(rank)
                if p is None or not p.node:
                    continue
                on_node = samples["node"] == p.node
                own = _own_gpu_mask(samples, p)
                mine_mask |= on_node & (own if own is not None and (on_node & own).any() else on_node)
            mine = samples[mine_mask]
            peers = samples[~mine_mask & ~samples["node"].isin(culprit_nodes)]
            if peers.empty:
                peers = samples[~mine_mask]
            gpus = sorted({str(k) for k in _gpu_key(mine, label=True).dropna().unique()})
            reasons = mine["clocks_event_reasons"].fillna(0).astype(np.int64) if not mine.empty else None
            peer_reasons = peers["clocks_event_reasons"].fillna(0).astype(np.int64) if not peers.empty else None
            for bit in g.clock_event_bits:
                if reasons is None or reasons.empty:
                    break
                share = float(((reasons & bit.mask) != 0).mean())
                peer_share = float(((peer_reasons & bit.mask) != 0).mean()) if peer_reasons is not None \
                    and not peer_reasons.empty else 0.0
                if share >= g.min_event_fraction and share > 2 * peer_share:
                    if cause == Cause.UNKNOWN:
                        cause, bonus = bit.cause, 0.25
                    evidence.append(Evidence("gpu_samples", start, f"{bit.name} (0x{bit.mask:x}) set in "
                                             f"{share:.0%} of the culprit GPU samples vs {peer_share:.0%} of peers'"))
            temp = float(mine["temp_c"].median()) if not mine.empty and mine["temp_c"].notna().any() else None
            peer_temp = float(peers["temp_c"].median()) if not peers.empty and peers["temp_c"].notna().any() \
                else None
            if temp is not None and (temp >= g.hot_temp_c or (peer_temp is not None
                                                                and temp - peer_temp >= g.temp_delta_c)):
                evidence.append(Evidence("gpu_samples", start, f"GPU temperature {temp:.0f} C"
                                         + (f" vs peers {peer_temp:.0f} C" if peer_temp is not None else "")))
                if cause == Cause.UNKNOWN:
                    cause, bonus = Cause.THERMAL, 0.15
                elif cause == Cause.THERMAL:
                    bonus += 0.05
            clock = float(mine["sm_clock_mhz"].median()) if not mine.empty and mine["sm_clock_mhz"].notna().any() \
                else None
            peer_clock = float(peers["sm_clock_mhz"].median()) if not peers.empty and \
                peers["sm_clock_mhz"].notna().any() else None
            if clock is not None and peer_clock and clock < g.clock_drop_ratio * peer_clock:
                evidence.append(Evidence("gpu_samples", start, f"SM clock {clock:.0f} MHz vs peers "
                                                               f"{peer_clock:.0f} MHz"))
                bonus += 0.05
        events = telemetry.gpu_events
        if not events.empty:
            near = events[events["node"].isin(culprit_nodes) & (events["ts"] >= start - dt.timedelta(minutes=5))
                          & (events["ts"] <= end)]
            culprits = [placement[r] for r in finding.ranks if r in placement]
            for _, row in near.iterrows():
                kind = str(row["kind"])
                on_gpu = [p for p in culprits if p.node == row["node"]]
                identified = row_identifies_gpu(row) and any(p.gpu_index is not None or p.gpu_uuid or p.pci_bus_id
                                                             for p in on_gpu)
                if identified and not any(same_gpu(row, p) for p in on_gpu):
                    continue  # another GPU of the node
                if kind in {"thermal_slowdown_start", "power_slowdown_start"}:
                    event_cause = Cause.THERMAL if kind.startswith("thermal") else Cause.HOST
                    if cause == Cause.UNKNOWN:
                        cause, bonus = event_cause, 0.2
                    evidence.append(Evidence("gpu_events", as_datetime(row["ts"]), f"{kind} on {row['node']}"))
        return cause, bonus, evidence[:4], gpus, samples if not samples.empty else None

    def node_outliers(self, scores: StepScores, placement: dict[int, Placement],
                      samples: pd.DataFrame | None) -> tuple[list[str], list[str]]:
        """Nodes whose multi-metric vector (compute ratio, and SM clock, temperature, power, throttle share where
        GPU samples exist) is an outlier under a robust covariance estimate (MinCovDet); empty when the job spans
        too few nodes. Returns (outlier nodes, the features used)."""
        o = self.t.outliers
        node_of = {r: p.node for r, p in placement.items() if p.node}
        if len(set(node_of.values())) < o.min_nodes:
            return [], []
        ratio = scores.ratio.median(axis=0)
        features = pd.DataFrame({"compute_ratio": ratio.groupby(ratio.index.map(node_of)).median()})
        if samples is not None and not samples.empty:
            per_node = samples.groupby("node").agg(
                sm_clock=("sm_clock_mhz", "median"), temp=("temp_c", "median"), power=("power_w", "median"),
                throttle=("clocks_event_reasons", lambda s: float((s.fillna(0).astype(np.int64) != 0).mean())))
            features = features.join(per_node, how="left")
        features = features.astype(float)
        features = features.loc[:, features.notna().all() & (features.std(ddof=0) > 0)]
        if features.empty or len(features) < max(o.min_nodes, 2 * features.shape[1] + 2):
            return [], []
        from scipy.special import chdtri  # the chi-square quantile, without importing all of scipy.stats
        from sklearn.covariance import MinCovDet

        standardised = (features - features.median()) / (features.quantile(0.75) - features.quantile(0.25) + 1e-9)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimate = MinCovDet(random_state=o.random_state).fit(standardised.to_numpy())
        distances = estimate.mahalanobis(standardised.to_numpy())
        cutoff = float(chdtri(features.shape[1], 1.0 - o.chi2_quantile))
        names = {"compute_ratio": "compute ratio", "sm_clock": "SM clock", "temp": "temperature", "power": "power",
                 "throttle": "throttling"}
        return ([str(node) for node, d in zip(features.index, distances, strict=True) if d > cutoff],
                [names.get(c, c) for c in features.columns])

    # ------------------------------------------------------------ incidents

    def attribute(self, telemetry: Telemetry, now: dt.datetime, last_steps: int | None = None) -> list[Incident]:
        """Straggler incidents of every attempt in `telemetry`; `last_steps` scores only each attempt's most
        recent steps (live mode: what can still become a new incident)."""
        incidents = []
        steps = telemetry.steps
        if steps.empty or not self.compute_sections(steps):
            return incidents
        for (job, attempt), rows in steps.groupby(["job_id", "attempt"], dropna=False):
            if last_steps is not None and rows["step"].notna().any():
                rows = rows[rows["step"] > rows["step"].max() - last_steps]
            job = None if job is None or job is pd.NA or job != job else str(job)
            attempt = None if attempt is None or attempt is pd.NA or attempt != attempt else int(attempt)
            placement = placements(telemetry.ranks, attempt, rows)
            ranks_table = telemetry.ranks
            if job is not None and not ranks_table.empty and "job_id" in ranks_table.columns:
                ranks_table = ranks_table[ranks_table["job_id"] == job]
            scores = self.scores(rows, placement, ranks_table, attempt)
            if scores is None:
                continue
            recent = scores.step_s[-self.t.window_steps:]
            recent = recent[np.isfinite(recent)]
            scores = replace(scores, remaining=remaining_time(
                ranks_table, attempt, int(rows["step"].max()), float(np.median(recent)) if len(recent) else np.nan))
            for finding in self.findings(scores, placement):
                incidents.append(self._incident(finding, scores, placement, telemetry, job, attempt, now))
        return incidents

    def _common_evidence(self, finding: StragglerFinding, scores: StepScores, what: str) -> list[Evidence]:
        evidence = []
        end = as_datetime(scores.end_ts.get(finding.step))
        if finding.whatif is not None:
            evidence.append(Evidence("steps", end, finding.whatif.text(what)))
        if scores.unknown_sections:
            names = ", ".join(f"{n} ({s:.0%} of step time)" for n, s in sorted(
                scores.unknown_sections.items(), key=lambda kv: -kv[1])[:4])
            evidence.append(Evidence("steps", end, f"sections of unknown kind, not scored (neither compute nor "
                                                   f"communication in the vocabulary): {names}"))
        return evidence

    def _details(self, finding: StragglerFinding, scores: StepScores) -> dict:
        details: dict = {"ranks": finding.ranks, "kind": finding.kind, "layout": scores.layout.describe(),
                         "comparison": scores.group_kind, **finding.where}
        if finding.whatif is not None:
            details["whatif"] = finding.whatif.details()
            details["saving_fraction"] = round(finding.whatif.saving_fraction, 4)
        # the slowdown policy weighs the saving over this (None: the job declares no length, unknown)
        details.update(scores.remaining.details() if scores.remaining is not None else {"remaining_s": None})
        return details

    def _incident(self, finding: StragglerFinding, scores: StepScores, placement: dict[int, Placement],
                  telemetry: Telemetry, job: str | None, attempt: int | None, now: dt.datetime) -> Incident:
        first_step = next((s for s in finding.window if scores.flagged.loc[s, finding.ranks].any()),
                          finding.window[0]) if finding.kind in {"rank", "systemic"} else finding.window[0]
        first_signal = as_datetime(scores.start_ts.get(first_step)) or now
        evidence = list(finding.evidence)
        saving = (f"; fixing it saves {finding.whatif.saving_fraction:.0%} of step time"
                  if finding.whatif is not None else "")
        incident_id = Incident.make_id("straggler", job, attempt, finding.key)
        if finding.kind in {"stage", "moving", "systemic"}:
            what = {"stage": "the slow stage", "moving": "every slow outlier", "systemic": "the slow ranks"}
            evidence.extend(self._common_evidence(finding, scores, what[finding.kind]))
            rule = {"stage": "straggler-pipeline-stage", "moving": "straggler-moving-imbalance",
                    "systemic": "straggler-systemic"}[finding.kind]
            confidence = 0.8 if finding.kind == "stage" else 0.65
            summary = {"stage": f"straggler: pipeline stage {', '.join(map(str, finding.where.get('stages', [])))} "
                                "is slower than the others in every replica",
                       "moving": "straggler: data-dependent imbalance moving between ranks",
                       "systemic": "straggler: many ranks on many nodes slow"}[finding.kind]
            summary += f"; cause workload_imbalance, no node to blame{saving}"
            return Incident(
                incident_id=incident_id, incident_class=IncidentClass.STRAGGLER, cause=Cause.WORKLOAD_IMBALANCE,
                first_signal_ts=first_signal, detected_ts=now, confidence=confidence, rule=rule, summary=summary,
                job_id=job, attempt=attempt, evidence=tuple(evidence[:12]), step=finding.step,
                details=self._details(finding, scores))
        if finding.kind == "replica":
            return self._replica_incident(finding, scores, placement, telemetry, job, attempt, now, first_signal,
                                          incident_id, saving)
        evidence.extend(self.describe_ranks(finding, scores, placement))
        evidence.extend(self._common_evidence(finding, scores, f"rank{'s' if len(finding.ranks) > 1 else ''} "
                                                               f"{', '.join(map(str, finding.ranks[:4]))}"))
        cause, bonus, gpu_evidence, gpus, samples = self.gpu_cause(finding, scores, placement, telemetry)
        had_samples = samples is not None
        evidence.extend(gpu_evidence)
        nodes = sorted({placement[r].node for r in finding.ranks if r in placement and placement[r].node})
        node_sizes = {n: sum(1 for p in placement.values() if p.node == n) for n in nodes}
        node_level = any(sum(1 for r in finding.ranks if r in placement and placement[r].node == n)
                         >= max(2, self.t.node_fraction * node_sizes[n]) for n in nodes)
        outliers, features = self.node_outliers(scores, placement, samples)
        hit = sorted(set(outliers) & set(nodes))
        if hit:
            gpu_features = [f for f in features if f != "compute ratio"]
            evidence.append(Evidence("gpu_samples" if gpu_features else "steps", first_signal,
                                     f"node(s) {', '.join(hit)} stand out of "
                                     f"{len({p.node for p in placement.values()})} nodes on {', '.join(features)} "
                                     f"together (robust covariance)"))
            if gpu_features:
                bonus += 0.05
        confidence = self._worker_confidence(finding, scores, bonus)
        if not gpus:
            gpus = [placement[r].gpu_label for r in finding.ranks if r in placement and placement[r].gpu_label]
        rule = "straggler-node" if node_level else "straggler-single-rank"
        if cause != Cause.UNKNOWN:
            rule += f"-{cause.value}"
        who = (f"node {nodes[0]} ({len(finding.ranks)} ranks)" if node_level and nodes else
               f"rank{'s' if len(finding.ranks) > 1 else ''} {', '.join(map(str, finding.ranks))}"
               + (f" on {', '.join(nodes)}" if nodes else ""))
        why = "" if cause != Cause.UNKNOWN else (" (GPU samples show nothing that explains it)" if had_samples
                                                else " (no GPU samples in the store: timing evidence only)")
        return Incident(
            incident_id=incident_id, incident_class=IncidentClass.STRAGGLER, cause=cause,
            first_signal_ts=first_signal, detected_ts=now, confidence=round(confidence, 3), rule=rule,
            summary=f"straggler: {who} persistently slower than {scores.group_kind} from step {first_step}; "
                    f"cause {cause.value}{why}{saving}",
            job_id=job, attempt=attempt, culprit_nodes=tuple(nodes), culprit_ranks=tuple(finding.ranks),
            culprit_gpus=tuple(sorted(set(gpus))), evidence=tuple(evidence[:12]), step=finding.step,
            details=self._details(finding, scores))

    def _worker_confidence(self, finding: StragglerFinding, scores: StepScores, bonus: float) -> float:
        """What was used: persistence and strength of the timing evidence, how it was compared (peers in other
        replicas, a change against its own history), and GPU evidence (the bonus)."""
        t = self.t
        window_flags = scores.flagged.loc[finding.window, finding.ranks]
        # persistence since the rank first turned slow in the window (a fail-slow from step k is not diluted by
        # the healthy steps before it)
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
        # where the total hides it (peers wait for the rank inside their own sections): the slowest section's
        # excess over its peers', as the share of the step it adds (a millisecond section at 1.9x its peers adds
        # little; the section's own ratio would overstate it)
        step_s = float(np.nanmedian(scores.step_s[rows])) if rows.any() else np.nan
        for rank in finding.ranks[:4]:
            j = int(np.searchsorted(scores.layout.ranks, rank))
            mine = rows & scores.flagged[rank].to_numpy()
            chosen = mine if mine.any() else rows
            for name, frame in scores.sections.items():
                with warnings.catch_warnings():  # a section the rank never timed in these steps: all NaN
                    warnings.simplefilter("ignore", RuntimeWarning)
                    excess = float(np.nanmedian(frame[rank].to_numpy(dtype=float)[chosen]
                                                - scores.parts.section_refs[name][chosen, j]))
                if np.isfinite(excess) and np.isfinite(step_s) and step_s > 0:
                    ratio = max(ratio, 1.0 + excess / step_s)
        strength = float(np.clip((ratio - 1.0) / (3.0 * (t.min_ratio - 1.0)), 0.0, 1.0))
        comparison = 0.0
        if scores.layout.replicas >= 3 or (scores.layout.replicas == 2 and self.became_slow(finding, scores)):
            comparison = 0.05
        return min(0.97, 0.45 + 0.2 * persistence + 0.2 * strength + comparison + bonus)

    def _replica_incident(self, finding: StragglerFinding, scores: StepScores, placement: dict[int, Placement],
                          telemetry: Telemetry, job: str | None, attempt: int | None, now: dt.datetime,
                          first_signal: dt.datetime, incident_id: str, saving: str) -> Incident:
        replica = finding.where["replica"]
        nodes = finding.where.get("nodes", [])
        evidence = list(finding.evidence)
        evidence.extend(self._common_evidence(finding, scores, f"replica {replica}"))
        one_node = len(nodes) == 1
        cause, gpu_evidence, gpus = Cause.UNKNOWN, [], []
        if one_node:
            cause, _, gpu_evidence, gpus, _ = self.gpu_cause(finding, scores, placement, telemetry)
            evidence.extend(gpu_evidence)
        where = (f"on node {nodes[0]}" if one_node else
                 f"on {', '.join(nodes)}: a resource they share (switch, network, storage), not one node" if nodes
                 else "")
        return Incident(
            incident_id=incident_id, incident_class=IncidentClass.STRAGGLER, cause=cause,
            first_signal_ts=first_signal, detected_ts=now, confidence=0.75,
            rule="straggler-replica-node" if one_node else "straggler-replica",
            summary=f"straggler: replica {replica} (ranks {_ranks_text(finding.ranks)}) is slower in every stage "
                    f"{where}; cause {cause.value}{saving}",
            job_id=job, attempt=attempt, culprit_nodes=tuple(nodes) if one_node else (),
            culprit_ranks=tuple(finding.ranks), culprit_gpus=tuple(sorted(set(gpus))),
            evidence=tuple(evidence[:12]), step=finding.step, details=self._details(finding, scores))


def own_time(steps: pd.DataFrame, sections: list[str], comm: dict[str, str]) -> dict[str, pd.Series]:
    """The own-work section columns that hold communication timed inside them (`forward/recv` in `forward`), with
    that time taken out: a stage waiting for its neighbour in a nested recv has not computed for longer. Only the
    outermost communication below a section counts (an inner one is inside it already)."""
    adjusted = {}
    for column in sections:
        name = column[len(SECTION_PREFIX):]
        inner = [n for n in comm if n.startswith(name + "/")
                 and not any(n.startswith(other + "/") for other in comm if other != n and other.startswith(name + "/"))
                 and SECTION_PREFIX + n in steps.columns]
        if not inner:
            continue
        waits = steps[[SECTION_PREFIX + n for n in inner]].astype(float).fillna(0.0).sum(axis=1)
        adjusted[column] = (steps[column].astype(float) - waits).clip(lower=0.0)
    return adjusted


class _Matrix:
    """Scatters per-row values into a (step x rank) frame; a (step, rank) given twice gets the mean."""

    def __init__(self, steps: np.ndarray, ranks: np.ndarray) -> None:
        self.steps, step_of = np.unique(steps, return_inverse=True)
        self.ranks, rank_of = np.unique(ranks, return_inverse=True)
        self.cells = step_of * len(self.ranks) + rank_of
        self.shape = (len(self.steps), len(self.ranks))
        self.unique: bool | None = None

    def frame(self, values: np.ndarray) -> pd.DataFrame:
        if self.unique is None:
            self.unique = int(np.bincount(self.cells, minlength=1).max()) <= 1
        if self.unique:  # one row per (step, rank): scatter directly
            out = np.full(self.shape[0] * self.shape[1], np.nan)
            out[self.cells] = values
            return pd.DataFrame(out.reshape(self.shape), index=pd.Index(self.steps, name="step"),
                                columns=pd.Index(self.ranks, name="rank"))
        finite = ~np.isnan(values)
        size = self.shape[0] * self.shape[1]
        total = np.bincount(self.cells[finite], weights=values[finite], minlength=size)
        count = np.bincount(self.cells[finite], minlength=size)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / np.maximum(count, 1), np.nan).reshape(self.shape)
        return pd.DataFrame(mean, index=pd.Index(self.steps, name="step"), columns=pd.Index(self.ranks, name="rank"))


def _gpu_key(samples: pd.DataFrame, label: bool = False) -> pd.Series:
    """Which GPU a sample is about: UUID, else PCI bus id, else node+index (a key; `label`: the bare index, for
    culprit_gpus, which holds only real identifiers or indices)."""
    key = samples["gpu_uuid"].astype(object)
    key = key.where(key.notna(), samples["pci_bus_id"].astype(object))
    fallback = (samples["gpu_index"].astype("Int64").astype(str) if label
                else samples["node"].astype(str) + ":gpu" + samples["gpu_index"].astype(str))
    return key.where(key.notna(), fallback)


def _own_gpu_mask(samples: pd.DataFrame, placement: Placement) -> pd.Series | None:
    if placement.gpu_uuid:
        return samples["gpu_uuid"] == placement.gpu_uuid
    if placement.pci_bus_id:
        return samples["pci_bus_id"].astype(object).str.upper() == placement.pci_bus_id.upper()
    index = placement.gpu_index if placement.gpu_index is not None else placement.local_rank
    if index is not None:
        return samples["gpu_index"] == index
    return None
