"""Incident assembly: a finding becomes a straggler incident with its cause, culprits, rule,
summary, evidence, confidence and details (a stage, moving or systemic finding: workload_imbalance,
no node to blame; a replica: its node or what its nodes share; a worker: its node or rank, the cause
from its GPUs)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from faultlens.attribution.detectors.straggler.cause import gpu_cause, node_outliers
from faultlens.attribution.detectors.straggler.evidence import (
    common_evidence,
    describe_ranks,
    details,
    worker_confidence,
)
from faultlens.attribution.detectors.straggler.report import (
    StepScores,
    StragglerFinding,
    ranks_text,
)
from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Placement, Telemetry
from faultlens.attribution.rules import StragglerThresholds

_WORKLOAD_WHAT = {
    "stage": "the slow stage",
    "moving": "every slow outlier",
    "systemic": "the slow ranks",
}
_WORKLOAD_RULE = {"stage": "straggler-pipeline-stage", "moving": "straggler-moving-imbalance",
                  "systemic": "straggler-systemic"}


@dataclass(frozen=True)
class _Context:
    """What every kind of straggler incident shares."""

    finding: StragglerFinding
    scores: StepScores
    placement: dict[int, Placement]
    telemetry: Telemetry
    job: str | None
    attempt: int | None
    now: dt.datetime
    first_step: int
    first_signal: dt.datetime
    incident_id: str
    saving: str  # "; fixing it saves N% of step time", or ""


def make_incident(
    t: StragglerThresholds,
    finding: StragglerFinding,
    scores: StepScores,
    placement: dict[int, Placement],
    telemetry: Telemetry,
    job: str | None,
    attempt: int | None,
    now: dt.datetime,
) -> Incident:
    """The straggler incident of one finding."""
    first_step = (
        next(
            (s for s in finding.window if scores.flagged.loc[s, finding.ranks].any()),
            finding.window[0],
        )
        if finding.kind in {"rank", "systemic"}
        else finding.window[0]
    )
    first_signal = as_datetime(scores.start_ts.get(first_step)) or now
    saving = (f"; fixing it saves {finding.whatif.saving_fraction:.0%} of step time"
              if finding.whatif is not None else "")
    incident_id = Incident.make_id("straggler", job, attempt, finding.key)
    context = _Context(
        finding,
        scores,
        placement,
        telemetry,
        job,
        attempt,
        now,
        first_step,
        first_signal,
        incident_id,
        saving,
    )
    if finding.kind in _WORKLOAD_RULE:
        return _workload_incident(context)
    if finding.kind == "replica":
        return _replica_incident(t, context)
    return _worker_incident(t, context)


def _workload_incident(c: _Context) -> Incident:
    """A stage, moving or systemic finding: workload_imbalance, notified, no node to blame."""
    finding = c.finding
    evidence = list(finding.evidence)
    evidence.extend(common_evidence(finding, c.scores, _WORKLOAD_WHAT[finding.kind]))
    confidence = 0.8 if finding.kind == "stage" else 0.65
    summary = {"stage": "straggler: pipeline stage "
                        f"{', '.join(map(str, finding.where.get('stages', [])))} "
                        "is slower than the others in every replica",
               "moving": "straggler: data-dependent imbalance moving between ranks",
               "systemic": "straggler: many ranks on many nodes slow"}[finding.kind]
    summary += f"; cause workload_imbalance, no node to blame{c.saving}"
    return Incident(
        incident_id=c.incident_id,
        incident_class=IncidentClass.STRAGGLER,
        cause=Cause.WORKLOAD_IMBALANCE,
        first_signal_ts=c.first_signal,
        detected_ts=c.now,
        confidence=confidence,
        rule=_WORKLOAD_RULE[finding.kind],
        summary=summary,
        job_id=c.job,
        attempt=c.attempt,
        evidence=tuple(evidence[:12]),
        step=finding.step,
        details=details(finding, c.scores),
    )


def _worker_incident(t: StragglerThresholds, c: _Context) -> Incident:
    """Slow workers on one node (or single ranks): the node when most of its ranks are slow, the
    cause from the GPU samples and events, and the node's standing among all nodes."""
    finding, scores, placement = c.finding, c.scores, c.placement
    evidence = list(finding.evidence)
    evidence.extend(describe_ranks(t, finding, scores, placement))
    evidence.extend(common_evidence(finding, scores, f"rank{'s' if len(finding.ranks) > 1 else ''} "
                                                     f"{', '.join(map(str, finding.ranks[:4]))}"))
    cause, bonus, gpu_evidence, gpus, samples = gpu_cause(
        t, finding, scores, placement, c.telemetry
    )
    had_samples = samples is not None
    evidence.extend(gpu_evidence)
    nodes = sorted(
        {placement[r].node for r in finding.ranks if r in placement and placement[r].node}
    )
    node_sizes = {n: sum(1 for p in placement.values() if p.node == n) for n in nodes}
    node_level = any(sum(1 for r in finding.ranks if r in placement and placement[r].node == n)
                     >= max(2, t.node_fraction * node_sizes[n]) for n in nodes)
    outliers, features = node_outliers(t, scores, placement, samples)
    hit = sorted(set(outliers) & set(nodes))
    if hit:
        gpu_features = [f for f in features if f != "compute ratio"]
        evidence.append(Evidence("gpu_samples" if gpu_features else "steps", c.first_signal,
                                 f"node(s) {', '.join(hit)} stand out of "
                                 f"{len({p.node for p in placement.values()})} nodes on "
                                 f"{', '.join(features)} "
                                 f"together (robust covariance)"))
        if gpu_features:
            bonus += 0.05
    confidence = worker_confidence(t, finding, scores, bonus)
    if not gpus:
        gpus = [
            placement[r].gpu_label
            for r in finding.ranks
            if r in placement and placement[r].gpu_label
        ]
    rule = "straggler-node" if node_level else "straggler-single-rank"
    if cause != Cause.UNKNOWN:
        rule += f"-{cause.value}"
    who = (f"node {nodes[0]} ({len(finding.ranks)} ranks)" if node_level and nodes else
           f"rank{'s' if len(finding.ranks) > 1 else ''} {', '.join(map(str, finding.ranks))}"
           + (f" on {', '.join(nodes)}" if nodes else ""))
    why = (
        ""
        if cause != Cause.UNKNOWN
        else (
            " (GPU samples show nothing that explains it)"
            if had_samples
            else " (no GPU samples in the store: timing evidence only)"
        )
    )
    return Incident(
        incident_id=c.incident_id,
        incident_class=IncidentClass.STRAGGLER,
        cause=cause,
        first_signal_ts=c.first_signal,
        detected_ts=c.now,
        confidence=round(confidence, 3),
        rule=rule,
        summary=f"straggler: {who} persistently slower than {scores.group_kind} from step "
        f"{c.first_step}; "
        f"cause {cause.value}{why}{c.saving}",
        job_id=c.job,
        attempt=c.attempt,
        culprit_nodes=tuple(nodes),
        culprit_ranks=tuple(finding.ranks),
        culprit_gpus=tuple(sorted(set(gpus))),
        evidence=tuple(evidence[:12]),
        step=finding.step,
        details=details(finding, scores),
    )


def _replica_incident(t: StragglerThresholds, c: _Context) -> Incident:
    """A slow replica: its node (and the cause from its GPUs) when it holds one, else what its nodes
    share.
    """
    finding, scores = c.finding, c.scores
    replica = finding.where["replica"]
    nodes = finding.where.get("nodes", [])
    evidence = list(finding.evidence)
    evidence.extend(common_evidence(finding, scores, f"replica {replica}"))
    one_node = len(nodes) == 1
    cause, gpu_evidence, gpus = Cause.UNKNOWN, [], []
    if one_node:
        cause, _, gpu_evidence, gpus, _ = gpu_cause(t, finding, scores, c.placement, c.telemetry)
        evidence.extend(gpu_evidence)
    where = (f"on node {nodes[0]}" if one_node else
             f"on {', '.join(nodes)}: a resource they share (switch, network, storage), not one "
             "node" if nodes
             else "")
    return Incident(
        incident_id=c.incident_id, incident_class=IncidentClass.STRAGGLER, cause=cause,
        first_signal_ts=c.first_signal, detected_ts=c.now, confidence=0.75,
        rule="straggler-replica-node" if one_node else "straggler-replica",
        summary=f"straggler: replica {replica} (ranks {ranks_text(finding.ranks)}) is slower in "
                "every stage "
                f"{where}; cause {cause.value}{c.saving}",
        job_id=c.job, attempt=c.attempt, culprit_nodes=tuple(nodes) if one_node else (),
        culprit_ranks=tuple(finding.ranks), culprit_gpus=tuple(sorted(set(gpus))),
        evidence=tuple(evidence[:12]), step=finding.step, details=details(finding, scores))
