"""A collective mismatch: the first rank to fail says that a peer's message did not match the
collective it had posted (gloo: "Received data size doesn't match expected size ... collective
mismatch", then SIGABRT; torch's TORCH_DISTRIBUTED_DEBUG=DETAIL: "Detected mismatch between
collectives on ranks"). The rank that says so is a
victim: the job's ranks left one collective sequence, and the culprit is the rank that left it
(skipped a collective, or called one the others did not).

Without the dead rank's flight-recorder dump the ranks' progress shows who left: in synchronous
training no rank completes a step whose collectives the others are still inside, so a rank that had
completed more steps than a strict majority when the mismatch was reported went past one of them (a
skipped collective puts its rank a step ahead). Ranks behind are not named (a heartbeat still on its
way looks behind), nor is the reporter. With no rank ahead (after `desync_wait_s` for the last
heartbeats), nobody is named: the incident says the job desynchronised and the policy escalates it.
A hang whose dumps show a cycle nothing in them can order is broken the same way
(attribution/detectors/progress/).

The patterns are rules (rules/crash.yaml `mismatch_patterns`); confidences: `hang-desync-apart`,
`hang-desync-no-culprit`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import TYPE_CHECKING

from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Placement, Telemetry
from faultlens.attribution.rules import CrashRules

if TYPE_CHECKING:
    from faultlens.attribution.detectors.crash.failures import RankFailure

RULE_APART = "hang-desync-apart"
RULE_NO_CULPRIT = "hang-desync-no-culprit"


def mismatch_report(
    primary: RankFailure,
    failures: list[RankFailure],
    pattern: re.Pattern[str] | None,
    slack_s: float,
) -> RankFailure | None:
    """The failure that reports a collective mismatch and is the attempt's first failure: the
    primary itself, or a row without a rank (a worker's stderr line read by local rank) in the same
    moment (a death by signal is stamped when torchrun noticed it, up to `slack_s` late)."""
    if pattern is None:
        return None

    def says_mismatch(failure: RankFailure) -> bool:
        return bool(pattern.search(f"{failure.message or ''}\n{failure.traceback or ''}"))

    if says_mismatch(primary):
        return primary
    window = dt.timedelta(seconds=slack_s)
    for failure in failures:
        if failure is primary or not says_mismatch(failure):
            continue
        if failure.rank in (None, primary.rank) and abs(failure.ts - primary.ts) <= window \
                and (failure.node is None or primary.node is None or failure.node == primary.node):
            return failure
    return None


def completed_steps(telemetry: Telemetry, attempt: int | None, ranks: list[int]) -> dict[int, int]:
    """rank -> the last step it completed in `attempt` (its heartbeats, else its step rows)."""
    found: dict[int, int] = {}
    # heartbeats last: they win (no flush delay)
    for frame in (telemetry.steps, telemetry.heartbeats):
        if frame.empty or "step" not in frame.columns or "rank" not in frame.columns:
            continue
        rows = frame[frame["rank"].isin(ranks) & frame["step"].notna()]
        if attempt is not None and "attempt" in rows.columns:
            rows = rows[rows["attempt"] == attempt]
        if "phase" in rows.columns and frame is telemetry.steps:
            rows = rows[rows["phase"].astype(object).fillna("train") == "train"]
        for rank, step in rows.groupby("rank")["step"].max().items():
            found[int(rank)] = int(step)
    return found


def ranks_apart(completed: dict[int, int], reporters: set[int]) -> tuple[list[int], int | None]:
    """(ranks ahead of a strict majority's progress, the majority's last completed step). Only ranks
    ahead count: a rank whose last heartbeat has not landed yet looks behind, none looks ahead by
    delay. Never a reporter (it got a message it did not expect: it is where the others are). Nobody
    when no strict majority agrees."""
    if len(completed) < 3:
        return [], None
    counts = Counter(completed.values())
    step, agreeing = counts.most_common(1)[0]
    if agreeing * 2 <= len(completed):
        return [], step
    apart = sorted(r for r, s in completed.items() if s > step and r not in reporters)
    return apart, step


def apart_text(completed: dict[int, int], apart: list[int], majority: int | None, what: str) -> str:
    """The evidence line of ranks_apart's answer."""
    steps = ", ".join(f"rank {r} step {completed[r]}" for r in apart)
    return (f"{len(completed) - len(apart)} of {len(completed)} ranks had completed step "
            f"{majority}; {steps}: {what}")


def desync_incident(rules: CrashRules, telemetry: Telemetry, job: str | None, attempt: int | None,
                    primary: RankFailure, report: RankFailure, placement: dict[int, Placement],
                    secondary_line: Evidence | None, now: dt.datetime) -> Incident:
    """The collective_hang incident of a reported collective mismatch (see the module docstring):
    `report` is the failure whose text says so, `primary` the attempt's first failure (the same
    rank's death)."""
    ranks = sorted(placement)
    reporter = report.rank if report.rank is not None else primary.rank
    reporters = {reporter} if reporter is not None else set()
    completed = completed_steps(telemetry, attempt, ranks)
    apart, majority = ranks_apart(completed, reporters)
    node = report.node or primary.node
    evidence = [Evidence("process_events", report.ts, "collective mismatch reported"
                         + (f" by rank {reporter}" if reporter is not None else "")
                         + (f" on {node}" if node else "") + ": " + _first_line(report)),
                *primary.evidence[:1]]
    if apart:
        evidence.append(Evidence("heartbeats", None, apart_text(completed, apart, majority,
                                                                "left the others' collective "
                                                                "sequence")))
        rule = RULE_APART
    else:
        shown = ", ".join(f"{r}:{s}" for r, s in sorted(completed.items())[:16])
        evidence.append(Evidence("heartbeats", None, "no rank's progress stands apart from a "
                                                     "strict majority's "
                                                     "(rank:last completed step "
                                                     f"{shown or 'unknown'})"))
        rule = RULE_NO_CULPRIT
    if secondary_line is not None:
        evidence.append(secondary_line)
    nodes = sorted({placement[r].node for r in apart if r in placement and placement[r].node})
    gpus = sorted(
        {placement[r].gpu_label for r in apart if r in placement and placement[r].gpu_label}
    )
    summary = (
        "collective hang: desync (a collective mismatch"
        + (f" reported by rank {reporter}" if reporter is not None else "")
        + ")"
        + (f"; culprit ranks {apart}" if apart else "; no culprit")
        + f"; cause {Cause.UNKNOWN.value}"
    )
    return Incident(
        incident_id=Incident.make_id("collective_hang", job, attempt, "desync"),
        incident_class=IncidentClass.COLLECTIVE_HANG,
        cause=Cause.UNKNOWN,
        first_signal_ts=min(report.ts, primary.ts),
        detected_ts=now,
        confidence=round(rules.conf(rule, 0.3), 3),
        rule=rule,
        summary=summary,
        job_id=job,
        attempt=attempt,
        culprit_nodes=tuple(nodes),
        culprit_ranks=tuple(apart),
        culprit_gpus=tuple(gpus),
        evidence=tuple(evidence[: rules.evidence_limit]),
        step=None if majority is None else majority + 1,
        details={
            "verdict": "desync",
            "reported_by": reporter,
            "completed_steps": {str(r): s for r, s in sorted(completed.items())[:64]},
        },
    )


def _first_line(failure: RankFailure) -> str:
    text = (failure.message or failure.exception_type or "").strip()
    line = text.splitlines()[0] if text else "(no text)"
    return line if len(line) <= 240 else line[:237] + "..."
