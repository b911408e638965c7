"""Straggler detection from per-rank compute-section timings, joined with GPU clocks-event reasons.

Synchronous training makes every rank's step wall time the same, so only the compute sections (the steps table's
`sections` map, less the sections that measure waiting: comm, sync, ...) say who is slow. For every step each rank
is scored against its peers with robust statistics (median and MAD), per section and in total; a (rank, step) is
slow when it is `peer_z` robust z-scores above its peers AND the excess is material (`min_ratio`). Peers are the
rank's pipeline stage (ranks.pp_rank) when stages are declared, since stages differ by design. A straggler is
persistent: slow in at least `persistence` of a window of steps; one-off slow steps and evaluation steps never
count. Ranks too few to compare (fewer than min_group_size peers) are scored against their own history instead.

What is slow decides what to blame:
- one rank (or a node's ranks) persistently slow -> that node/GPU; the cause from its GPU samples (thermal bits
  0x20/0x40, power brake 0x80, hot, clocks down relative to peers) or gpu_events, else unknown;
- a whole pipeline stage slower than the others -> workload_imbalance, no node to blame;
- slow outliers that move between ranks from step to step (data-dependent imbalance), or persistent slow ranks
  spread over many nodes with no GPU reason -> workload_imbalance, no node to blame.
Per-node multi-metric vectors (compute ratio, SM clock, temperature, power, throttle share) are scored with a
robust covariance estimate (scikit-learn MinCovDet) when the job spans enough nodes: a culprit node that is also a
multivariate outlier gets that as evidence.
"""

from __future__ import annotations

import datetime as dt
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attribution.hardware import as_datetime, row_identifies_gpu, same_gpu
from attribution.incident import Cause, Evidence, Incident, IncidentClass
from attribution.rules import StragglerThresholds
from attribution.telemetry import SECTION_PREFIX, Placement, Telemetry, placements, section_columns

MAD_SCALE = 1.4826
SYSTEMIC_MIN_NODES = 3
MAX_PEER_NODES = 63  # peers whose GPU samples are compared with the culprit's


@dataclass(frozen=True)
class StepScores:
    """Per-step, per-rank scores of one attempt (index: step, columns: rank)."""

    compute: pd.DataFrame  # compute seconds
    ratio: pd.DataFrame  # compute / peer median
    flagged: pd.DataFrame  # slow this step (bool)
    sections: dict[str, pd.DataFrame]  # section -> seconds
    groups: dict[object, list[int]]
    group_kind: str  # "pipeline stage" or "all ranks"
    start_ts: pd.Series  # per step: earliest start
    end_ts: pd.Series  # per step: latest end


@dataclass
class StragglerFinding:
    """One detected slowdown before it becomes an incident."""

    kind: str  # rank, stage, moving, systemic
    step: int  # the step at which it was first persistent
    ranks: list[int]
    key: str
    window: list[int] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)


def _nanmedian(values: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, axis=axis)


def robust_z(values: np.ndarray, floor_frac: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise robust z-scores: (x - median) / (1.4826 * MAD), MAD floored at floor_frac x median.
    Returns (z, median, scale) with NaN where a row has no values."""
    median = _nanmedian(values, axis=1)
    mad = _nanmedian(np.abs(values - median[:, None]), axis=1)
    scale = MAD_SCALE * np.maximum(mad, floor_frac * np.abs(median))
    scale = np.where(scale > 0, scale, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (values - median[:, None]) / scale[:, None]
    return z, median, scale


def _rolling_sum(frame: pd.DataFrame, window: int) -> pd.DataFrame:
    return frame.astype(float).rolling(window, min_periods=1).sum()


class StragglerDetector:
    """Scores per-rank section timings and turns persistent slowness into straggler incidents."""

    def __init__(self, thresholds: StragglerThresholds) -> None:
        self.t = thresholds

    # ------------------------------------------------------------ scoring

    def compute_sections(self, steps: pd.DataFrame) -> list[str]:
        excluded = [e.lower() for e in self.t.exclude_sections]
        return [c for c in section_columns(steps)
                if not any(e in c[len(SECTION_PREFIX):].lower() for e in excluded)]

    def scores(self, attempt_steps: pd.DataFrame, placement: dict[int, Placement]) -> StepScores | None:
        """Score one attempt's steps; None when there is nothing to score (no sections, too few steps)."""
        t = self.t
        sections = self.compute_sections(attempt_steps)
        if not sections or attempt_steps.empty:
            return None
        rows = attempt_steps[attempt_steps["step"].notna() & attempt_steps["rank"].notna()]
        phase = rows["phase"].astype(object).where(rows["phase"].notna(), "train") if "phase" in rows.columns \
            else pd.Series("train", index=rows.index)
        rows = rows[phase.isin(t.phases)]
        if rows.empty:
            return None
        rows = rows[rows["step"] >= rows["step"].min() + t.warmup_steps]
        values = rows[sections].astype(float)
        rows = rows.assign(_compute=values.sum(axis=1, min_count=1))
        rows = rows[rows["_compute"].notna()]
        if rows.empty:
            return None
        rows = rows.assign(step=rows["step"].astype(np.int64), rank=rows["rank"].astype(np.int64))
        matrix = _Matrix(rows["step"].to_numpy(), rows["rank"].to_numpy())
        compute = matrix.frame(rows["_compute"].to_numpy(dtype=float))
        section_frames = {c[len(SECTION_PREFIX):]: matrix.frame(rows[c].to_numpy(dtype=float))
                          for c in sections if rows[c].notna().any()}
        groups, group_kind = self._groups(list(compute.columns), placement)
        ratio = pd.DataFrame(np.nan, index=compute.index, columns=compute.columns)
        flagged = pd.DataFrame(False, index=compute.index, columns=compute.columns)
        for members in groups.values():
            cols = [compute.columns.get_loc(r) for r in members]
            block = compute.iloc[:, cols].to_numpy(dtype=float)
            if len(members) >= t.min_group_size:
                z, median, _ = robust_z(block, t.mad_floor_frac)
                with np.errstate(invalid="ignore", divide="ignore"):
                    block_ratio = block / median[:, None]
                slow = (z >= t.peer_z) & (block_ratio >= t.min_ratio)
                # a single section can be the slow one while waiting hides it in the total (DDP overlaps the
                # gradient all-reduce with backward): flag it when its excess alone is material
                for frame in section_frames.values():
                    part = frame.iloc[:, cols].to_numpy(dtype=float)
                    sz, smedian, _ = robust_z(part, t.mad_floor_frac)
                    excess = part - smedian[:, None]
                    slow |= (sz >= t.peer_z) & (excess >= (t.min_ratio - 1.0) * median[:, None])
            else:
                block_ratio, slow = self._self_scores(block)
            ratio.iloc[:, cols] = block_ratio
            flagged.iloc[:, cols] = np.nan_to_num(slow.astype(float), nan=0.0).astype(bool)
        done = rows["end_ts"].where(rows["end_ts"].notna(), rows["ts"]) if "end_ts" in rows.columns else rows["ts"]
        begun = rows["start_ts"].where(rows["start_ts"].notna(), done) if "start_ts" in rows.columns else done
        start_ts = begun.groupby(rows["step"]).min().reindex(compute.index)
        end_ts = done.groupby(rows["step"]).max().reindex(compute.index)
        return StepScores(compute, ratio, flagged, section_frames, groups, group_kind, start_ts, end_ts)

    def _groups(self, ranks: list[int], placement: dict[int, Placement]) -> tuple[dict[object, list[int]], str]:
        stages = {r: placement[r].pp_rank if r in placement else None for r in ranks}
        if all(s is not None for s in stages.values()):
            groups: dict[object, list[int]] = {}
            for rank, stage in stages.items():
                groups.setdefault(stage, []).append(rank)
            if len(groups) >= 2 and all(len(m) >= self.t.min_group_size for m in groups.values()):
                return groups, "pipeline stage"
        if len(ranks) < self.t.min_group_size:
            return {"all": ranks}, "own history"
        return {"all": ranks}, "all ranks"

    def _self_scores(self, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Too few peers: each rank against the median of its own previous steps."""
        frame = pd.DataFrame(block)
        history = frame.shift(1).rolling(self.t.self_baseline_steps, min_periods=self.t.min_window_steps)
        median = history.median().to_numpy()
        mad = (frame.shift(1) - history.median()).abs().rolling(
            self.t.self_baseline_steps, min_periods=self.t.min_window_steps).median().to_numpy()
        scale = MAD_SCALE * np.maximum(mad, self.t.mad_floor_frac * np.abs(median))
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = block / median
            z = (block - median) / scale
        return ratio, (z >= self.t.peer_z) & (ratio >= self.t.min_ratio)

    # ------------------------------------------------------------ findings

    def findings(self, scores: StepScores, placement: dict[int, Placement]) -> list[StragglerFinding]:
        t = self.t
        w = t.window_steps
        valid = scores.compute.notna()
        counts = _rolling_sum(valid, w)
        fraction = _rolling_sum(scores.flagged, w) / counts.where(counts > 0)
        persistent = (fraction >= t.persistence) & (counts >= t.min_window_steps)
        steps = list(scores.compute.index)
        found: list[StragglerFinding] = []

        first_persistent = {int(rank): int(persistent.index[persistent[rank].to_numpy().argmax()])
                            for rank in persistent.columns if persistent[rank].any()}
        if first_persistent:
            found.extend(self._persistent_findings(first_persistent, placement, scores))

        stage = self._stage_finding(scores)
        if stage is not None:
            found.append(stage)

        any_flag = scores.flagged.any(axis=1).astype(float)
        step_fraction = any_flag.rolling(w, min_periods=1).sum() / valid.any(axis=1).astype(float).rolling(
            w, min_periods=1).sum()
        per_rank = _rolling_sum(scores.flagged, w)
        distinct = (per_rank > 0).sum(axis=1)
        window_count = valid.any(axis=1).astype(float).rolling(w, min_periods=1).sum()
        # moving: no rank is slow in more than half the share that would make it persistent
        concentrated = per_rank.max(axis=1) / window_count >= t.persistence / 2
        moving = ((step_fraction >= t.moving_min_step_fraction) & (distinct >= t.moving_min_distinct_ranks)
                  & ~persistent.any(axis=1) & ~concentrated & (window_count >= t.min_window_steps))
        if moving.any():
            step = int(moving.index[moving.to_numpy().argmax()])
            position = steps.index(step)
            window = steps[max(0, position - w + 1): position + 1]
            flagged = scores.flagged.loc[window]
            ranks = sorted(int(r) for r in flagged.columns[flagged.any(axis=0)])
            per_rank = flagged.sum(axis=0)
            found.append(StragglerFinding(
                "moving", step, ranks, "moving", window, [Evidence(
                    "steps", as_datetime(scores.end_ts.get(step)),
                    f"slow outliers in {int(flagged.any(axis=1).sum())} of {len(window)} steps "
                    f"({window[0]}-{window[-1]}), spread over {len(ranks)} ranks, none slow in more than "
                    f"{int(per_rank.max())} of them: the imbalance moves with the data")]))
        return found

    def _persistent_findings(self, first: dict[int, int], placement: dict[int, Placement],
                             scores: StepScores) -> list[StragglerFinding]:
        t = self.t
        steps = list(scores.compute.index)
        by_node: dict[str, list[int]] = {}
        for rank in first:
            node = placement[rank].node if rank in placement and placement[rank].node else f"rank-{rank}"
            by_node.setdefault(node, []).append(rank)
        if self._spread(by_node, placement):
            step = min(first.values())
            position = steps.index(step)
            window = steps[max(0, position - t.window_steps + 1): position + 1]
            ranks = sorted(first)
            return [StragglerFinding("systemic", step, ranks, "systemic", window, [Evidence(
                "steps", as_datetime(scores.end_ts.get(step)),
                f"{len(ranks)} ranks on {len(by_node)} nodes persistently slower than their peers from step "
                f"{step}: a systemic imbalance, not one node")])]
        found = []
        for node, ranks in sorted(by_node.items()):
            step = min(first[r] for r in ranks)
            position = steps.index(step)
            window = steps[max(0, position - t.window_steps + 1): position + 1]
            found.append(StragglerFinding("rank", step, sorted(ranks), f"node:{node}", window))
        return found

    def _spread(self, by_node: dict[str, list[int]], placement: dict[int, Placement]) -> bool:
        """Persistent ranks spread over many nodes, each holding only a minority of its node's ranks."""
        node_sizes: dict[str, int] = {}
        for p in placement.values():
            if p.node:
                node_sizes[p.node] = node_sizes.get(p.node, 0) + 1
        minority = [n for n, ranks in by_node.items()
                    if len(ranks) < self.t.node_fraction * node_sizes.get(n, len(ranks))]
        return len(minority) >= SYSTEMIC_MIN_NODES

    def _stage_finding(self, scores: StepScores) -> StragglerFinding | None:
        t = self.t
        if scores.group_kind != "pipeline stage" or len(scores.groups) < 2:
            return None
        names = list(scores.groups)
        medians = np.column_stack([
            _nanmedian(scores.compute[members].to_numpy(dtype=float), axis=1) for members in scores.groups.values()])
        flags = np.zeros_like(medians, dtype=bool)
        ratios = np.full_like(medians, np.nan)
        for j in range(len(names)):
            others = np.delete(medians, j, axis=1)
            reference = _nanmedian(others, axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                ratios[:, j] = medians[:, j] / reference
            flags[:, j] = ratios[:, j] >= t.stage_min_ratio
        frame = pd.DataFrame(flags, index=scores.compute.index, columns=names)
        counts = pd.Series(1.0, index=frame.index).rolling(t.window_steps, min_periods=1).sum()
        persistent = frame.astype(float).rolling(t.window_steps, min_periods=1).sum().div(counts, axis=0)
        persistent = (persistent >= t.persistence) & (counts >= t.min_window_steps).to_numpy()[:, None]
        if not persistent.to_numpy().any():
            return None
        hit = persistent.to_numpy()
        row = int(hit.any(axis=1).argmax())
        column = int(hit[row].argmax())
        stage = names[column]
        step = int(frame.index[row])
        steps = list(frame.index)
        window = steps[max(0, row - t.window_steps + 1): row + 1]
        window_ratio = float(np.nanmedian(ratios[max(0, row - t.window_steps + 1): row + 1, column]))
        ranks = sorted(int(r) for r in scores.groups[stage])
        return StragglerFinding("stage", step, ranks, f"stage:{stage}", window, [Evidence(
            "steps", as_datetime(scores.end_ts.get(step)),
            f"pipeline stage {stage} (ranks {ranks[:8]}{'...' if len(ranks) > 8 else ''}) computes "
            f"{window_ratio:.2f}x the other stages' median over steps {window[0]}-{window[-1]}: "
            f"a pipeline imbalance, no node to blame")])

    # ------------------------------------------------------------ evidence and cause

    def describe_ranks(self, finding: StragglerFinding, scores: StepScores,
                       placement: dict[int, Placement]) -> list[Evidence]:
        window = finding.window
        evidence = []
        end = as_datetime(scores.end_ts.get(finding.step))
        for rank in finding.ranks[:4]:
            flagged = int(scores.flagged.loc[window, rank].sum())
            ratio = float(np.nanmedian(scores.ratio.loc[window, rank].to_numpy(dtype=float)))
            section_text = ""
            ratios = {}
            for name, frame in scores.sections.items():
                peers = _nanmedian(frame.loc[window].to_numpy(dtype=float), axis=1)
                mine = frame.loc[window, rank].to_numpy(dtype=float)
                with np.errstate(invalid="ignore", divide="ignore"):
                    ratios[name] = float(np.nanmedian(mine / peers)) if np.isfinite(mine).any() else np.nan
            finite = {k: v for k, v in ratios.items() if np.isfinite(v)}
            if finite:
                worst = max(finite, key=lambda k: finite[k])
                section_text = f"; slowest section {worst} {finite[worst]:.2f}x peers"
            own = self._own_history(rank, window, scores)
            where = f" on {placement[rank].node}" if rank in placement and placement[rank].node else ""
            base = ("its own earlier median" if scores.group_kind == "own history"
                    else f"its peers' median ({scores.group_kind})")
            lead = f"compute {ratio:.2f}x {base}"
            if finite and scores.group_kind != "own history" and finite[worst] > 1.1 * max(ratio, 1.0):
                # the total hides the slow section (peers wait for the rank inside theirs): lead with the section
                lead = (f"slowest section {worst} {finite[worst]:.2f}x peers, while its compute sections together "
                        f"are {ratio:.2f}x {base} (its peers wait for it inside theirs)")
                section_text = ""
            evidence.append(Evidence(
                "steps", end, f"rank {rank}{where}: {lead}, "
                              f"slow in {flagged} of {len(window)} steps ({window[0]}-{window[-1]}){section_text}"
                              f"{own}"))
        return evidence

    def _own_history(self, rank: int, window: list[int], scores: StepScores) -> str:
        """Was the rank slow relative to its peers before the window too (slow from the start, e.g. a weaker
        GPU or a heavier partition) or did it become slow (fail-slow)?"""
        ratio = scores.ratio[rank]
        before = ratio.loc[ratio.index < window[0]].dropna().tail(self.t.self_baseline_steps)
        if len(before) < self.t.min_window_steps:
            return "; no earlier history of its own"
        compute = scores.compute[rank]
        then = float(compute.loc[before.index].median())
        flagged = scores.flagged.loc[window, rank]
        now = float(compute.loc[flagged[flagged].index].median()) if flagged.any() else float(
            compute.loc[window].median())
        change = now / then if then > 0 else float("nan")
        earlier = float(before.median())
        if earlier < 1 + (self.t.min_ratio - 1) / 2:
            return f"; {change:.2f}x its own earlier median: it became slow (it matched its peers before)"
        return f"; {earlier:.2f}x its peers already before: slow from the start"

    def gpu_cause(self, finding: StragglerFinding, scores: StepScores, placement: dict[int, Placement],
                  telemetry: Telemetry) -> tuple[Cause, float, list[Evidence], list[str], list[str]]:
        """Cause from the culprits' GPU samples (and gpu_events) in the window, compared with their peers'.
        Returns (cause, confidence bonus, evidence, culprit GPUs, outlier nodes)."""
        g = self.t.gpu
        start = as_datetime(scores.start_ts.loc[finding.window].min())
        end = as_datetime(scores.end_ts.loc[finding.window].max())
        nodes = sorted({p.node for p in placement.values() if p.node})
        culprit_nodes = sorted({placement[r].node for r in finding.ranks if r in placement and placement[r].node})
        if start is None or end is None or not culprit_nodes:
            return Cause.UNKNOWN, 0.0, [], [], []
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
        outliers = self.node_outliers(scores, placement, samples)
        return cause, bonus, evidence[:4], gpus, outliers

    def node_outliers(self, scores: StepScores, placement: dict[int, Placement],
                      samples: pd.DataFrame | None) -> list[str]:
        """Nodes whose multi-metric vector (compute ratio, SM clock, temperature, power, throttle share) is an
        outlier under a robust covariance estimate (MinCovDet); empty when the job spans too few nodes."""
        o = self.t.outliers
        node_of = {r: p.node for r, p in placement.items() if p.node}
        if len(set(node_of.values())) < o.min_nodes:
            return []
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
            return []
        from scipy.special import chdtri  # the chi-square quantile, without importing all of scipy.stats
        from sklearn.covariance import MinCovDet

        standardised = (features - features.median()) / (features.quantile(0.75) - features.quantile(0.25) + 1e-9)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimate = MinCovDet(random_state=o.random_state).fit(standardised.to_numpy())
        distances = estimate.mahalanobis(standardised.to_numpy())
        cutoff = float(chdtri(features.shape[1], 1.0 - o.chi2_quantile))
        return [str(node) for node, d in zip(features.index, distances, strict=True) if d > cutoff]

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
            scores = self.scores(rows, placement)
            if scores is None:
                continue
            for finding in self.findings(scores, placement):
                incidents.append(self._incident(finding, scores, placement, telemetry, job, attempt, now))
        return incidents

    def _incident(self, finding: StragglerFinding, scores: StepScores, placement: dict[int, Placement],
                  telemetry: Telemetry, job: str | None, attempt: int | None, now: dt.datetime) -> Incident:
        first_step = next((s for s in finding.window if scores.flagged.loc[s, finding.ranks].any()),
                          finding.window[0]) if finding.ranks else finding.window[0]
        first_signal = as_datetime(scores.start_ts.get(first_step)) or now
        evidence = list(finding.evidence)
        if finding.kind in {"stage", "moving", "systemic"}:
            cause, rule = Cause.WORKLOAD_IMBALANCE, {"stage": "straggler-pipeline-stage",
                                                     "moving": "straggler-moving-imbalance",
                                                     "systemic": "straggler-systemic"}[finding.kind]
            confidence = 0.8 if finding.kind == "stage" else 0.65
            summary = {"stage": "straggler: a pipeline stage is slower than the others",
                       "moving": "straggler: data-dependent imbalance moving between ranks",
                       "systemic": "straggler: many ranks on many nodes slow"}[finding.kind]
            summary += "; cause workload_imbalance, no node to blame"
            return Incident(
                incident_id=Incident.make_id("straggler", job, attempt, finding.key), incident_class=IncidentClass
                .STRAGGLER, cause=cause, first_signal_ts=first_signal, detected_ts=now, confidence=confidence,
                rule=rule, summary=summary, job_id=job, attempt=attempt, evidence=tuple(evidence[:12]),
                step=finding.step, details={"ranks": finding.ranks})
        evidence.extend(self.describe_ranks(finding, scores, placement))
        cause, bonus, gpu_evidence, gpus, outliers = self.gpu_cause(finding, scores, placement, telemetry)
        evidence.extend(gpu_evidence)
        nodes = sorted({placement[r].node for r in finding.ranks if r in placement and placement[r].node})
        node_sizes = {n: sum(1 for p in placement.values() if p.node == n) for n in nodes}
        node_level = any(sum(1 for r in finding.ranks if r in placement and placement[r].node == n)
                         >= max(2, self.t.node_fraction * node_sizes[n]) for n in nodes)
        if outliers:
            hit = sorted(set(outliers) & set(nodes))
            if hit:
                evidence.append(Evidence("gpu_samples", first_signal, f"node(s) {', '.join(hit)} stand out of "
                                         f"{len({p.node for p in placement.values()})} nodes on compute, clocks, "
                                         "temperature, power and throttling together (robust covariance)"))
                bonus += 0.05
        window_flags = scores.flagged.loc[finding.window, finding.ranks]
        persistence = float(window_flags.mean(axis=0).max()) if not window_flags.empty else 0.0
        confidence = min(0.97, 0.55 + 0.2 * persistence + bonus)
        if not gpus:
            gpus = [placement[r].gpu_label for r in finding.ranks if r in placement and placement[r].gpu_label]
        rule = "straggler-node" if node_level else "straggler-single-rank"
        if cause != Cause.UNKNOWN:
            rule += f"-{cause.value}"
        who = (f"node {nodes[0]} ({len(finding.ranks)} ranks)" if node_level and nodes else
               f"rank{'s' if len(finding.ranks) > 1 else ''} {', '.join(map(str, finding.ranks))}"
               + (f" on {', '.join(nodes)}" if nodes else ""))
        return Incident(
            incident_id=Incident.make_id("straggler", job, attempt, finding.key),
            incident_class=IncidentClass.STRAGGLER, cause=cause, first_signal_ts=first_signal, detected_ts=now,
            confidence=round(confidence, 3), rule=rule,
            summary=f"straggler: {who} persistently slower than peers from step {first_step}; cause {cause.value}",
            job_id=job, attempt=attempt, culprit_nodes=tuple(nodes), culprit_ranks=tuple(finding.ranks),
            culprit_gpus=tuple(sorted(set(gpus))), evidence=tuple(evidence[:12]), step=finding.step)


class _Matrix:
    """Scatters per-row values into a (step x rank) frame; a (step, rank) given twice gets the mean."""

    def __init__(self, steps: np.ndarray, ranks: np.ndarray) -> None:
        self.steps, step_of = np.unique(steps, return_inverse=True)
        self.ranks, rank_of = np.unique(ranks, return_inverse=True)
        self.cells = step_of * len(self.ranks) + rank_of
        self.shape = (len(self.steps), len(self.ranks))

    def frame(self, values: np.ndarray) -> pd.DataFrame:
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
