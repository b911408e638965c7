"""Attempts with no primary failure of a rank of their own: a node lost (its torchrun agent died by
a signal nobody sent, or every rank of it fell silent while its peers echoed the loss), a node whose
GPU reported hardware errors while its peers lost contact, a rank that left (its training loop
ended by itself, exit 0, while its peers went on and failed waiting for it), collective timeouts
only (a hang to analyse), or nothing to blame. Also the line that folds the survivors' echoes into
an incident."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pandas as pd

from faultlens.attribution.detectors.crash.failures import (
    WAIT,
    FailureKind,
    HangTrigger,
    RankFailure,
)
from faultlens.attribution.detectors.crash.lifecycle import (
    ended_agents,
    lost_agents,
    running_agents,
)
from faultlens.attribution.detectors.crash.liveness import (
    alive_after,
    closed_ranks,
    death_step,
    last_progress,
)
from faultlens.attribution.hardware import XidCatalogLike, hardware_findings
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Placement, Telemetry
from faultlens.attribution.rules import CrashRules


def node_lost(
    rules: CrashRules,
    telemetry: Telemetry,
    job: str | None,
    attempt: int | None,
    failures: list[RankFailure],
    placement: dict[int, Placement],
    secondary_line: Evidence | None,
    now: dt.datetime,
) -> Incident | None:
    """A node whose torchrun agent died by a signal nobody in the job sent: the host (its ranks died
    with it, or train on unwatched)."""
    lost = lost_agents(telemetry.process_events).get(
        (job or "", attempt if attempt is not None else -1), []
    )
    nodes = sorted({node for node, _, _, _ in lost})
    if len(nodes) != 1:
        return None
    node = nodes[0]
    ts, signal, text = min((ts, signal, text) for n, ts, signal, text in lost if n == node)
    ranks = sorted(r for r, p in placement.items() if p.node == node)
    own = [
        f
        for f in failures
        if f.rank is not None
        and ((placement[f.rank].node if f.rank in placement else None) or f.node) == node
    ]
    if any(f.kind in (FailureKind.EXCEPTION, FailureKind.OOM) and f.ts <= ts for f in own):
        return None  # a rank's own failure came first: the normal path explains it
    alive = alive_after(telemetry.heartbeats, attempt, ranks, ts + dt.timedelta(seconds=1))
    rule = "crash-agent-lost" if alive else "crash-node-lost"
    evidence = [Evidence("process_events", ts, text)]
    if alive:
        evidence.append(
            Evidence(
                "heartbeats",
                None,
                f"ranks {alive} of {node} kept running after their agent died: unwatched",
            )
        )
    else:
        silent = [r for r in ranks if r not in {f.rank for f in own}]
        evidence.append(
            Evidence(
                "process_events",
                ts,
                f"{node}'s ranks {ranks} died with it"
                + (f" ({len(silent)} reported nothing)" if silent else ""),
            )
        )
    if secondary_line:
        evidence.append(secondary_line)
    gpus = sorted({placement[r].gpu_label for r in ranks if placement[r].gpu_label})
    step = next(
        (s for s in (death_step(telemetry, attempt, r) for r in ranks) if s is not None), None
    )
    first = min([ts, *(f.ts for f in failures)])
    what = (
        "its torchrun agent was lost ("
        + signal
        + ")"
        + (", its ranks run on unwatched" if alive else ", its ranks with it")
    )
    return Incident(
        incident_id=Incident.make_id("crash", job, attempt),
        incident_class=IncidentClass.CRASH,
        cause=Cause.HOST,
        first_signal_ts=first,
        detected_ts=now,
        confidence=rules.conf(rule, 0.85),
        rule=rule,
        summary=f"crash: node loss: {node}: {what}; cause host",
        job_id=job,
        attempt=attempt,
        culprit_nodes=(node,),
        culprit_ranks=tuple(ranks),
        culprit_gpus=tuple(gpus),
        evidence=tuple(evidence[: rules.evidence_limit]),
        step=step,
        details={"primary_kind": "node_lost", "failures": len(failures), "alive": alive},
    )


def secondary_summary(failures: list[RankFailure], primary: RankFailure | None) -> Evidence | None:
    """One line of evidence for every failure but the primary, folded into the incident."""
    others = [f for f in failures if f is not primary]
    rows = sum(f.rows for f in others)
    if not others:
        return None
    kinds = Counter(f.kind.value for f in others)
    first = min(f.ts for f in others)
    parts = ", ".join(f"{kind} x{count}" for kind, count in kinds.most_common())
    return Evidence(
        "process_events",
        first,
        f"{rows} more error signal(s) from {len(others)} "
        "other rank(s), "
        f"folded into this incident ({parts})",
    )


def _vanished_echoes(failures: list[RankFailure]) -> set[int]:
    """Ranks that only echoed a lost peer and left no record of how they ended (no exit row, no
    signal): a node dies process by process, and a rank can print its node-mate's loss in the moment
    before it goes too."""
    return {
        f.rank
        for f in failures
        if f.rank is not None
        and f.kind == FailureKind.SECONDARY
        and f.exit_code is None
        and f.signal is None
    }


#: how long after the others began failing a node's last step or heartbeat still belongs to the same
#: moment: every rank's aborted step closes as the exception unwinds, a few ms after the echo lines
#: are stamped (a CI run's lost node ended its last step 3 ms after them and was read as still
#: training)
_GRACE = dt.timedelta(seconds=2)


def _silent_node(
    rules: CrashRules,
    telemetry: Telemetry,
    job: str | None,
    attempt: int | None,
    failures: list[RankFailure],
    placement: dict[int, Placement],
    silent: list[int],
    vanished_echoes: set[int],
    candidates: list[str],
    secondary_line: Evidence | None,
    now: dt.datetime,
) -> Incident | None:
    """Every rank of one node said nothing (or only echoed a node-mate's loss and vanished with no
    exit) while ranks of other nodes echoed a lost peer, and that node made no progress after they
    began failing: the node was lost (no agent report needed). vanished_echoes:
    _vanished_echoes(failures); candidates: the nodes it may be (one, or nothing is said)."""
    if len(candidates) != 1:
        return None
    node = candidates[0]
    ranks = sorted(r for r, p in placement.items() if p.node == node)
    vanished = vanished_echoes & set(ranks)
    if not ranks or not set(ranks) <= set(silent) | vanished:
        return None
    others = [f for f in failures if f.rank not in ranks and f.node != node]
    if not any(f.kind == FailureKind.SECONDARY for f in others):
        return None
    first = min(f.ts for f in others)  # when the rest of the job began failing
    if node in ended_agents(telemetry.process_events, job, attempt):
        return None  # its torchrun agent exited 0: the node ended its part, it was not lost
    progressed = last_progress(telemetry, attempt, ranks)
    if progressed is not None and progressed > first + _GRACE:
        return None  # it was still training after the others failed: not lost
    if alive_after(telemetry.heartbeats, attempt, ranks, first + _GRACE):
        return None
    rule = "crash-node-silent"
    echoed = (
        f"; ranks {sorted(vanished)} only echoed a node-mate's loss, then vanished with no exit"
        if vanished
        else ""
    )
    evidence = [
        Evidence(
            "process_events",
            first,
            f"every rank of {node} ({ranks}) fell silent "
            "while "
            f"{len(others)} rank(s) of other nodes lost "
            f"contact{echoed}",
        )
    ]
    evidence.extend(e for f in sorted(others, key=lambda f: f.ts)[:2] for e in f.evidence[:1])
    if secondary_line:
        evidence.append(secondary_line)
    gpus = sorted({placement[r].gpu_label for r in ranks if placement[r].gpu_label})
    return Incident(
        incident_id=Incident.make_id("crash", job, attempt),
        incident_class=IncidentClass.CRASH,
        cause=Cause.HOST,
        first_signal_ts=min([first, progressed or first, *(f.ts for f in failures)]),
        detected_ts=now,
        confidence=rules.conf(rule, 0.75),
        rule=rule,
        summary=f"crash: node loss: every rank of {node} fell silent while its peers lost contact; "
        "cause host",
        job_id=job,
        attempt=attempt,
        culprit_nodes=(node,),
        culprit_ranks=tuple(ranks),
        culprit_gpus=tuple(gpus),
        evidence=tuple(evidence[: rules.evidence_limit]),
        step=next(
            (s for s in (death_step(telemetry, attempt, r) for r in ranks) if s is not None), None
        ),
        details={
            "primary_kind": "node_silent",
            "failures": len(failures),
            "vanished_echoes": sorted(vanished),
            "failures_from": first.isoformat(),
        },
    )


def no_primary(
    rules: CrashRules,
    catalog: XidCatalogLike | None,
    telemetry: Telemetry,
    job: str | None,
    attempt: int | None,
    failures: list[RankFailure],
    placement: dict[int, Placement],
    secondary_line: Evidence | None,
    now: dt.datetime,
) -> Incident | HangTrigger | object | None:
    """An attempt whose failing ranks all echoed another's failure or were stopped: a node whose GPU
    reported hardware errors, nothing (stopped from outside), a hang (collective timeouts), WAIT (a
    report still to come), a silent node, else a crash with no primary seen."""
    first = min(f.ts for f in failures)
    # a node whose ranks said nothing while the others echoed a failure, or whose GPU reported
    # hardware errors
    reported = {f.rank for f in failures}
    # a rank that closed its step timer ended its training loop itself: it is not silent (a lost
    # node's processes never close anything)
    closed = closed_ranks(telemetry.heartbeats, attempt)
    silent = sorted(r for r in placement if r not in reported and r not in closed)
    nodes = sorted({p.node for p in placement.values() if p.node})
    node_findings = {
        node: hardware_findings(telemetry.gpu_events, node, first, rules, catalog) for node in nodes
    }
    node_findings = {n: f for n, f in node_findings.items() if f}
    if len(node_findings) == 1:
        node, findings = next(iter(node_findings.items()))
        best = findings[0]
        ranks = sorted(r for r, p in placement.items() if p.node == node)
        rule = "crash-hardware-node-no-report"
        evidence = [best.evidence(), *(f.evidence() for f in findings[1:3])]
        if secondary_line:
            evidence.append(secondary_line)
        return Incident(
            incident_id=Incident.make_id("crash", job, attempt),
            incident_class=IncidentClass.CRASH,
            cause=best.cause,
            first_signal_ts=min(best.ts, first),
            detected_ts=now,
            confidence=min(rules.conf(rule), best.confidence),
            rule=rule,
            summary=f"crash: {node} reported {best.kind} and its peers lost contact; cause "
            f"{best.cause.value}",
            job_id=job,
            attempt=attempt,
            culprit_nodes=(node,),
            culprit_ranks=tuple(ranks),
            culprit_gpus=(best.gpu,) if best.gpu else (),
            evidence=tuple(evidence[: rules.evidence_limit]),
        )
    if all(f.kind == FailureKind.TERMINATED for f in failures):
        return None  # stopped from outside (cancelled, preempted): not a crash to attribute
    left = left_early(
        rules, telemetry, job, attempt, failures, placement, closed, first, secondary_line, now
    )
    if left is not None:
        return left
    timeouts = [f for f in failures if f.timeout_rows]
    if timeouts:
        evidence = [e for f in sorted(timeouts, key=lambda f: f.ts)[:3] for e in f.evidence[:1]]
        return HangTrigger(job, attempt, min(f.ts for f in timeouts), tuple(evidence))
    silent_nodes = sorted(
        {placement[r].node for r in silent if placement[r].node}
        - {f.node for f in failures if f.node}
    )
    running = running_agents(telemetry.process_events, job, attempt)
    # a silent rank whose agent still runs: that agent's report of what happened to it is still to
    # come (its node-mates' own error files and teed lines land first, so the node is not silent as
    # a whole)
    unreported = {placement[r].node for r in silent if placement[r].node} & running
    if (unreported or (silent_nodes and set(silent_nodes) <= running)) and (
        now - first
    ).total_seconds() < rules.silent_node_wait_s:
        return WAIT
    # a lost node may have said something on its way down: a rank that only echoed its node-mate's
    # death and left no exit (nobody was left to report one) goes with the node's silent ranks
    vanished = _vanished_echoes(failures)
    lost_nodes = sorted(
        {placement[r].node for r in silent if placement[r].node}
        - {
            f.node or (placement[f.rank].node if f.rank in placement else None)
            for f in failures
            if f.rank not in vanished
        }
    )
    silent_node = _silent_node(
        rules,
        telemetry,
        job,
        attempt,
        failures,
        placement,
        silent,
        vanished,
        silent_nodes or lost_nodes,
        secondary_line,
        now,
    )
    if silent_node is not None:
        return silent_node
    rule = "crash-no-primary"
    evidence = [e for f in sorted(failures, key=lambda f: f.ts)[:3] for e in f.evidence[:1]]
    if silent:
        evidence.insert(
            0,
            Evidence(
                "process_events",
                first,
                f"ranks {silent} reported no failure while {len(failures)} others echoed one",
            ),
        )
    return Incident(
        incident_id=Incident.make_id("crash", job, attempt),
        incident_class=IncidentClass.CRASH,
        cause=Cause.UNKNOWN,
        first_signal_ts=first,
        detected_ts=now,
        confidence=rules.conf(rule),
        rule=rule,
        summary="crash: every failing rank echoed another's failure; the primary one "
        "was not seen"
        + (
            f" (silent ranks {silent} on {', '.join(silent_nodes) or 'unknown nodes'})"
            if silent
            else ""
        ),
        job_id=job,
        attempt=attempt,
        culprit_nodes=tuple(silent_nodes) if len(silent_nodes) == 1 else (),
        culprit_ranks=tuple(silent) if silent_nodes and len(silent_nodes) == 1 else (),
        evidence=tuple(evidence[: rules.evidence_limit]),
    )


def _reached_steps(heartbeats: pd.DataFrame, attempt: int | None, column: str) -> dict[int, int]:
    """rank -> the highest `column` (step: completed; current_step: entered) in `attempt`."""
    if heartbeats.empty or column not in heartbeats.columns or "rank" not in heartbeats.columns:
        return {}
    rows = heartbeats[heartbeats["rank"].notna() & heartbeats[column].notna()]
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    return {int(r): int(s) for r, s in rows.groupby("rank")[column].max().items()}


def left_early(
    rules: CrashRules,
    telemetry: Telemetry,
    job: str | None,
    attempt: int | None,
    failures: list[RankFailure],
    placement: dict[int, Placement],
    closed: dict[int, dt.datetime],
    first: dt.datetime,
    secondary_line: Evidence | None,
    now: dt.datetime,
) -> Incident | None:
    """Ranks that ended their training loop themselves (step timer closed, no failure of their own)
    before their peers' failures, while those peers went on past the leaver's last step and then
    failed waiting for it: the rank that left (uneven data per rank, an early return) is the
    culprit, not a crash of nobody. Software: the same data or code leaves the same way again."""
    reported = {f.rank for f in failures}
    # torchrun's error files stamp a failure in whole seconds: a leaver that closed within that
    # second closed before it
    coarse = any(f.whole_second and f.ts == first for f in failures)
    before = first + dt.timedelta(seconds=1) if coarse else None
    leavers = sorted(
        r for r, ts in closed.items()
        if r not in reported and (ts < before if before is not None else ts <= first)
    )
    if not leavers:
        return None
    done = _reached_steps(telemetry.heartbeats, attempt, "step")
    entered = _reached_steps(telemetry.heartbeats, attempt, "current_step")
    left_at = max((done.get(r, -1) for r in leavers), default=-1)
    went_on = [
        r for r in reported if r is not None and max(done.get(r, -1), entered.get(r, -1)) > left_at
    ]
    if not went_on:
        return None  # the peers had not gone past it: an ending, not a rank that left
    nodes = sorted({placement[r].node for r in leavers if r in placement and placement[r].node})
    rule = "crash-rank-left-early"
    where = f" on {', '.join(nodes)}" if nodes else ""
    names = ", ".join(map(str, leavers))
    text = (
        f"rank{'s' if len(leavers) > 1 else ''} {names}{where} left after step {left_at} "
        "(step timer closed, no error of its own) while "
        f"{len(went_on)} peer rank(s) went on to step {left_at + 1} and then failed waiting"
    )
    evidence = [Evidence("heartbeats", closed[leavers[0]], text)]
    evidence.extend(e for f in sorted(failures, key=lambda f: f.ts)[:2] for e in f.evidence[:1])
    if secondary_line:
        evidence.append(secondary_line)
    return Incident(
        incident_id=Incident.make_id("crash", job, attempt),
        incident_class=IncidentClass.CRASH,
        cause=Cause.SOFTWARE,
        first_signal_ts=closed[leavers[0]],
        detected_ts=now,
        confidence=rules.conf(rule, 0.8),
        rule=rule,
        summary=f"crash: {text}",
        job_id=job,
        attempt=attempt,
        culprit_nodes=tuple(nodes),
        culprit_ranks=tuple(leavers),
        evidence=tuple(evidence[: rules.evidence_limit]),
        step=left_at + 1,
    )
