"""The cause of a primary failure and the incident it makes: what was found around it (the same
fingerprint on other ranks and nodes, repeats in earlier attempts, hardware GPU events, a known
signature), the rule that decides the cause, culprits and confidence from that, and the incident's
evidence and summary."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from faultlens.attribution.detectors.crash.failures import FailureKind, RankFailure
from faultlens.attribution.hardware import HardwareFinding
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Placement
from faultlens.attribution.rules import CrashRules, CrashSignature

#: an earlier attempt whose primary failure had the same fingerprint: (attempt, its failure, the
#: same step)
Repeat = tuple[int | None, RankFailure, bool]


@dataclass(frozen=True)
class CrashFindings:
    """What the cause of one attempt's primary failure is decided from."""

    primary: RankFailure
    node: str | None  # the primary's node (the ranks table's name over a report's host name)
    own: Placement | None  # where the primary rank ran
    step: int | None  # the step it died in
    same: tuple[RankFailure, ...]  # other ranks that failed with the same fingerprint
    other_nodes: frozenset[str]  # their nodes besides the primary's
    repeats: tuple[Repeat, ...]  # earlier attempts that failed the same way, newest first
    findings: tuple[HardwareFinding, ...]  # GPU events near the failure on its node, best first
    signature: CrashSignature | None  # the known failure text it matches


@dataclass(frozen=True)
class Verdict:
    """The cause decided for a primary failure, by which rule, with what confidence, and whom it
    blames.
    """

    cause: Cause
    rule: str
    confidence: float
    culprit_ranks: tuple[int, ...]
    culprit_nodes: tuple[str, ...]
    culprit_gpus: tuple[str, ...]
    first_signal: dt.datetime


def _default_cause(rules: CrashRules, primary: RankFailure) -> tuple[Cause, str, float]:
    if primary.kind == FailureKind.OOM:
        return Cause.OOM, "crash-oom", rules.conf("crash-oom", 0.9)
    if primary.kind == FailureKind.EXCEPTION:
        return Cause.SOFTWARE, "crash-exception", rules.conf("crash-exception")
    if primary.kind == FailureKind.KILLED:
        return Cause.UNKNOWN, "crash-killed-by-signal", rules.conf("crash-killed-by-signal")
    return Cause.UNKNOWN, "crash-nonzero-exit", rules.conf("crash-nonzero-exit")


def decide_cause(rules: CrashRules, found: CrashFindings) -> Verdict:
    """The first rule that holds: the same fingerprint on other nodes, a repeat at the same step,
    hardware events, a repeat at another step (not for a known network/hardware error text), a
    signature, else the default."""
    primary, node, own = found.primary, found.node, found.own
    culprit_ranks = [primary.rank] if primary.rank is not None else []
    culprit_nodes = [node] if node else []
    culprit_gpus = [own.gpu_label] if own is not None and own.gpu_label else []
    first_signal = primary.ts
    cause, rule, confidence = _default_cause(rules, primary)
    same, repeats, findings, signature = found.same, found.repeats, found.findings, found.signature
    if same:
        culprit_ranks = sorted({primary.rank, *(f.rank for f in same)} - {None})
    if same and found.other_nodes:
        cause = (
            Cause.OOM if signature is not None and signature.cause == Cause.OOM else Cause.SOFTWARE
        )
        rule = "crash-software-same-fingerprint-multi-node"
        confidence = rules.conf(rule)
        culprit_nodes = []
        culprit_gpus = []
    elif repeats and any(r[2] for r in repeats):
        cause, rule = Cause.SOFTWARE, "crash-software-repeat-same-step"
        confidence = rules.conf(rule)
        culprit_nodes, culprit_gpus = [], []
    elif findings:
        best = findings[0]
        cause = best.cause
        rule = "crash-hardware-same-gpu" if best.same_gpu else "crash-hardware-same-node"
        confidence = rules.conf(rule) * min(1.0, best.confidence / 0.9)
        if not (best.same_gpu and culprit_gpus):
            culprit_gpus = [best.gpu] if best.gpu else culprit_gpus
        first_signal = min(first_signal, best.ts)
    elif repeats and not (signature is not None and signature.cause.is_hardware):
        # the same code position failing again at another step is a bug, unless the failure is a
        # known network/hardware error: those fail in the same collective call wherever and whenever
        # a link dies
        cause = Cause.SOFTWARE
        rule = "crash-software-repeat-signal" if primary.kind == FailureKind.KILLED else \
            "crash-software-repeat-fingerprint"
        confidence = rules.conf(rule)
        culprit_nodes, culprit_gpus = [], []
    elif signature is not None:
        cause, rule, confidence = signature.cause, signature.id, signature.confidence
    # the job asked for more memory than it has: the workload's, no node to blame
    if cause == Cause.OOM:
        culprit_nodes, culprit_gpus = [], []
    return Verdict(
        cause,
        rule,
        confidence,
        tuple(int(r) for r in culprit_ranks),
        tuple(culprit_nodes),
        tuple(culprit_gpus),
        first_signal,
    )


def _evidence(rules: CrashRules, found: CrashFindings, verdict: Verdict,
              secondary_line: Evidence | None) -> tuple[Evidence, ...]:
    """The primary's own rows, then what decided (or backs) the cause, then the survivors' echoes in
    one line.
    """
    primary, same, signature = found.primary, found.same, found.signature
    evidence: list[Evidence] = list(primary.evidence)
    if same:
        other_nodes = found.other_nodes
        evidence.append(Evidence("process_events", same[0].ts,
                                 f"same fingerprint {primary.fingerprint} on {len(same)} more "
                                 "rank(s)"
                                 + (f" on {len(other_nodes)} other node(s): "
                                    f"{', '.join(sorted(other_nodes))}"
                                    if other_nodes else " of the same node")))
    for previous_attempt, previous, same_step in found.repeats[:3]:
        what = f"same death ({primary.fingerprint})" if primary.kind == FailureKind.KILLED else \
            "same fingerprint"
        evidence.append(Evidence("process_events", previous.ts,
                                 f"{what} in attempt {previous_attempt} (rank {previous.rank}"
                                 + (f" on {previous.node}" if previous.node else "")
                                 + f"{', same step ' + str(found.step) if same_step else ''})"))
    evidence.extend(f.evidence() for f in found.findings[:3])
    if signature is not None and verdict.rule != signature.id:
        evidence.append(Evidence("process_events", primary.ts, f"matches signature {signature.id}: "
                                 f"{signature.description or signature.cause}"))
    if secondary_line:
        evidence.append(secondary_line)
    return tuple(evidence[: rules.evidence_limit])


def crash_incident(
    rules: CrashRules,
    job: str | None,
    attempt: int | None,
    failures: list[RankFailure],
    found: CrashFindings,
    secondary_line: Evidence | None,
    now: dt.datetime,
) -> Incident:
    """The crash incident of an attempt whose primary failure is `found.primary`."""
    verdict = decide_cause(rules, found)
    primary, node, step = found.primary, found.node, found.step
    what = {
        FailureKind.KILLED: f"killed by {primary.signal}",
        FailureKind.OOM: "ran out of memory",
        FailureKind.EXCEPTION: f"raised {primary.exception_type or 'an exception'}",
        FailureKind.EXITED: f"exited with code {primary.exit_code}",
    }.get(primary.kind, str(primary.kind))
    summary = (
        f"crash: rank {primary.rank}"
        + (f" on {node}" if node else "")
        + f" {what}"
        + (f" at step {step}" if step is not None else "")
        + f"; cause {verdict.cause.value} ({verdict.rule})"
    )
    if len(verdict.culprit_ranks) > 1:
        summary += f"; {len(verdict.culprit_ranks)} ranks failed the same way"
    return Incident(
        incident_id=Incident.make_id("crash", job, attempt),
        incident_class=IncidentClass.CRASH,
        cause=verdict.cause,
        first_signal_ts=verdict.first_signal,
        detected_ts=now,
        confidence=round(float(verdict.confidence), 3),
        rule=verdict.rule,
        summary=summary,
        job_id=job,
        attempt=attempt,
        culprit_nodes=verdict.culprit_nodes,
        culprit_ranks=verdict.culprit_ranks,
        culprit_gpus=verdict.culprit_gpus,
        evidence=_evidence(rules, found, verdict, secondary_line),
        fingerprint=primary.fingerprint,
        step=step,
        details={
            "primary_kind": primary.kind.value,
            "failures": len(failures),
            "secondary_rows": sum(f.secondary_rows for f in failures),
        },
    )
