"""Cause classification of a slow worker: its GPU samples in the window against its peers'
(clock-event bits, temperature, SM clock) and the gpu_events of its GPUs; and the nodes whose
multi-metric vector stands out under a robust covariance estimate (scikit-learn MinCovDet)."""

from __future__ import annotations

import datetime as dt
import warnings

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.straggler.report import (
    MAX_PEER_NODES,
    StepScores,
    StragglerFinding,
)
from faultlens.attribution.hardware import as_datetime, row_identifies_gpu, same_gpu
from faultlens.attribution.incident import Cause, Evidence
from faultlens.attribution.reading.telemetry import Placement, Telemetry
from faultlens.attribution.rules import StragglerThresholds

CauseResult = tuple[Cause, float, list[Evidence], list[str], pd.DataFrame | None]


def gpu_key(samples: pd.DataFrame, label: bool = False) -> pd.Series:
    """Which GPU a sample is about: UUID, else PCI bus id, else node+index (a key; `label`: the bare
    index, for culprit_gpus, which holds only real identifiers or indices)."""
    key = samples["gpu_uuid"].astype(object)
    key = key.where(key.notna(), samples["pci_bus_id"].astype(object))
    fallback = (samples["gpu_index"].astype("Int64").astype(str) if label
                else samples["node"].astype(str) + ":gpu" + samples["gpu_index"].astype(str))
    return key.where(key.notna(), fallback)


def own_gpu_mask(samples: pd.DataFrame, placement: Placement) -> pd.Series | None:
    """The samples of the rank's own GPU on its node, None when its placement names no GPU."""
    if placement.gpu_uuid:
        return samples["gpu_uuid"] == placement.gpu_uuid
    if placement.pci_bus_id:
        return samples["pci_bus_id"].astype(object).str.upper() == placement.pci_bus_id.upper()
    index = placement.gpu_index if placement.gpu_index is not None else placement.local_rank
    if index is not None:
        return samples["gpu_index"] == index
    return None


def _split_samples(
    samples: pd.DataFrame,
    finding: StragglerFinding,
    placement: dict[int, Placement],
    culprit_nodes: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the culprits' own GPU samples, their peers': other nodes', else the rest)."""
    mine_mask = pd.Series(False, index=samples.index)
    for rank in finding.ranks:
        p = placement.get(rank)
        if p is None or not p.node:
            continue
        on_node = samples["node"] == p.node
        own = own_gpu_mask(samples, p)
        mine_mask |= on_node & (own if own is not None and (on_node & own).any() else on_node)
    mine = samples[mine_mask]
    peers = samples[~mine_mask & ~samples["node"].isin(culprit_nodes)]
    if peers.empty:
        peers = samples[~mine_mask]
    return mine, peers


def _median(frame: pd.DataFrame, column: str) -> float | None:
    return (
        float(frame[column].median()) if not frame.empty and frame[column].notna().any() else None
    )


def _sample_signals(t: StragglerThresholds, mine: pd.DataFrame, peers: pd.DataFrame,
                    start: dt.datetime) -> tuple[Cause, float, list[Evidence]]:
    """(cause, confidence bonus, evidence) from the culprit GPUs' samples against their peers':
    clock-event bits set far more often, a hot GPU, SM clocks down."""
    g = t.gpu
    evidence: list[Evidence] = []
    cause, bonus = Cause.UNKNOWN, 0.0
    reasons = mine["clocks_event_reasons"].fillna(0).astype(np.int64) if not mine.empty else None
    peer_reasons = (
        peers["clocks_event_reasons"].fillna(0).astype(np.int64) if not peers.empty else None
    )
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
                                     f"{share:.0%} of the culprit GPU samples vs {peer_share:.0%} "
                                     "of peers'"))
    temp, peer_temp = _median(mine, "temp_c"), _median(peers, "temp_c")
    if temp is not None and (temp >= g.hot_temp_c or (peer_temp is not None
                                                        and temp - peer_temp >= g.temp_delta_c)):
        evidence.append(
            Evidence(
                "gpu_samples",
                start,
                f"GPU temperature {temp:.0f} C"
                + (f" vs peers {peer_temp:.0f} C" if peer_temp is not None else ""),
            )
        )
        if cause == Cause.UNKNOWN:
            cause, bonus = Cause.THERMAL, 0.15
        elif cause == Cause.THERMAL:
            bonus += 0.05
    clock, peer_clock = _median(mine, "sm_clock_mhz"), _median(peers, "sm_clock_mhz")
    if clock is not None and peer_clock and clock < g.clock_drop_ratio * peer_clock:
        evidence.append(Evidence("gpu_samples", start, f"SM clock {clock:.0f} MHz vs peers "
                                                       f"{peer_clock:.0f} MHz"))
        bonus += 0.05
    return cause, bonus, evidence


def _event_signals(events: pd.DataFrame, finding: StragglerFinding, placement: dict[int, Placement],
                   culprit_nodes: list[str], start: dt.datetime, end: dt.datetime, cause: Cause,
                   bonus: float) -> tuple[Cause, float, list[Evidence]]:
    """Thermal or power slowdown events on the culprits' GPUs from 5 minutes before the window to
    its end; the cause and bonus only where the samples gave none."""
    evidence: list[Evidence] = []
    if events.empty:
        return cause, bonus, evidence
    near = events[
        events["node"].isin(culprit_nodes)
        & (events["ts"] >= start - dt.timedelta(minutes=5))
        & (events["ts"] <= end)
    ]
    culprits = [placement[r] for r in finding.ranks if r in placement]
    for _, row in near.iterrows():
        kind = str(row["kind"])
        on_gpu = [p for p in culprits if p.node == row["node"]]
        identified = row_identifies_gpu(row) and any(
            p.gpu_index is not None or p.gpu_uuid or p.pci_bus_id for p in on_gpu
        )
        if identified and not any(same_gpu(row, p) for p in on_gpu):
            continue  # another GPU of the node
        if kind in {"thermal_slowdown_start", "power_slowdown_start"}:
            event_cause = Cause.THERMAL if kind.startswith("thermal") else Cause.HOST
            if cause == Cause.UNKNOWN:
                cause, bonus = event_cause, 0.2
            evidence.append(
                Evidence("gpu_events", as_datetime(row["ts"]), f"{kind} on {row['node']}")
            )
    return cause, bonus, evidence


def gpu_cause(t: StragglerThresholds, finding: StragglerFinding, scores: StepScores,
              placement: dict[int, Placement], telemetry: Telemetry) -> CauseResult:
    """Cause from the culprits' GPU samples (and gpu_events) in the window, compared with their
    peers'. Returns (cause, confidence bonus, evidence, culprit GPUs, the window's samples or None).
    """
    start = as_datetime(scores.start_ts.loc[finding.window].min())
    end = as_datetime(scores.end_ts.loc[finding.window].max())
    nodes = sorted({p.node for p in placement.values() if p.node})
    culprit_nodes = sorted(
        {placement[r].node for r in finding.ranks if r in placement and placement[r].node}
    )
    if start is None or end is None or not culprit_nodes:
        return Cause.UNKNOWN, 0.0, [], [], None
    peers_to_fetch = [n for n in nodes if n not in culprit_nodes][:MAX_PEER_NODES]
    samples = telemetry.fetch_samples(culprit_nodes + peers_to_fetch, start, end)
    evidence: list[Evidence] = []
    gpus: list[str] = []
    cause, bonus = Cause.UNKNOWN, 0.0
    if not samples.empty:
        samples = samples.assign(_gpu=gpu_key(samples))
        mine, peers = _split_samples(samples, finding, placement, culprit_nodes)
        gpus = sorted({str(k) for k in gpu_key(mine, label=True).dropna().unique()})
        cause, bonus, evidence = _sample_signals(t, mine, peers, start)
    cause, bonus, events = _event_signals(
        telemetry.gpu_events, finding, placement, culprit_nodes, start, end, cause, bonus
    )
    evidence.extend(events)
    return cause, bonus, evidence[:4], gpus, samples if not samples.empty else None


def node_outliers(t: StragglerThresholds, scores: StepScores, placement: dict[int, Placement],
                  samples: pd.DataFrame | None) -> tuple[list[str], list[str]]:
    """Nodes whose multi-metric vector (compute ratio, and SM clock, temperature, power, throttle
    share where GPU samples exist) is an outlier under a robust covariance estimate (MinCovDet);
    empty when the job spans too few nodes. Returns (outlier nodes, the features used)."""
    o = t.outliers
    node_of = {r: p.node for r, p in placement.items() if p.node}
    if len(set(node_of.values())) < o.min_nodes:
        return [], []
    ratio = scores.ratio.median(axis=0)
    features = pd.DataFrame({"compute_ratio": ratio.groupby(ratio.index.map(node_of)).median()})
    if samples is not None and not samples.empty:
        per_node = samples.groupby("node").agg(
            sm_clock=("sm_clock_mhz", "median"),
            temp=("temp_c", "median"),
            power=("power_w", "median"),
            throttle=(
                "clocks_event_reasons",
                lambda s: float((s.fillna(0).astype(np.int64) != 0).mean()),
            ),
        )
        features = features.join(per_node, how="left")
    features = features.astype(float)
    features = features.loc[:, features.notna().all() & (features.std(ddof=0) > 0)]
    if features.empty or len(features) < max(o.min_nodes, 2 * features.shape[1] + 2):
        return [], []
    # the chi-square quantile, without importing all of scipy.stats
    from scipy.special import chdtri
    from sklearn.covariance import MinCovDet

    standardised = (features - features.median()) / (
        features.quantile(0.75) - features.quantile(0.25) + 1e-9
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimate = MinCovDet(random_state=o.random_state).fit(standardised.to_numpy())
    distances = estimate.mahalanobis(standardised.to_numpy())
    cutoff = float(chdtri(features.shape[1], 1.0 - o.chi2_quantile))
    names = {
        "compute_ratio": "compute ratio",
        "sm_clock": "SM clock",
        "temp": "temperature",
        "power": "power",
        "throttle": "throttling",
    }
    return ([str(node) for node, d in zip(features.index, distances, strict=True) if d > cutoff],
            [names.get(c, c) for c in features.columns])
