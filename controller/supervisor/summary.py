"""The end summary of `faultlens run`, built from the store: every incident of the job (each as its
first report) with its decision and the decision's delivery status as the store holds them, and
the job's state (attribution/goodput/jobstate.py). The live log and the store cannot disagree: the
summary reads what the live log's decisions wrote, including those that left the job running."""

from __future__ import annotations

import datetime as dt

from faultlens.attribution.goodput.jobstate import JobState, agent_exits, judge_job_state
from faultlens.attribution.reading.queries import decision_rows, incident_rows
from faultlens.attribution.reading.store import Store
from faultlens.controller.delivery import DecisionLog
from faultlens.controller.supervisor.records import RunResult


def _restore(step: int | None, tier: str | None) -> str:
    return "from scratch" if step is None else f"from step {step} ({tier})"


def _culprit(row: dict) -> str:
    nodes = ",".join(row.get("culprit_nodes") or []) or "no node"
    ranks = row.get("culprit_ranks") or []
    return nodes + (
        f" rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}" if ranks else ""
    )


def summary_lines(result: RunResult, *, now: dt.datetime | None = None) -> list[str]:
    """What `faultlens run` prints at the end: the job's state, then per attempt its nodes and the
    incidents of that attempt in the store, each with its decision and delivery status."""
    now = now or dt.datetime.now(dt.UTC)
    with Store(result.store, jobs=[result.job_id]) as store:
        incidents = incident_rows(store, job=result.job_id)
        decisions = decision_rows(store, job=result.job_id)
        exits, launched = agent_exits(store, result.job_id)
    log = DecisionLog(result.store)
    try:
        records = log.records()
    finally:
        log.close()
    by_incident = {d["incident_id"]: d for d in decisions}
    last_attempt = max((r.attempt for r in result.attempts), default=0)
    state = (
        JobState.FAILED
        if result.job_error is not None
        else judge_job_state(
            last_attempt=last_attempt,
            last_ts=None,
            exits=exits,
            launched=launched,
            incidents=incidents,
            decisions=decisions,
            now=now,
            running_within_s=0.0,
        )
    )
    lines = [
        f"job {result.job_id}: {result.outcome.value} after {len(result.attempts)} attempt(s); "
        f"state {state.value}; {len(incidents)} incident(s) in the store"
    ]
    if result.job_error is not None:
        lines.append(f"  job error (no node to blame): {result.job_error.error}")
    for record in result.attempts:
        seconds = ((record.ended or record.started) - record.started).total_seconds()
        lines.append(
            f"attempt {record.attempt} on {','.join(record.nodes)}, "
            f"{_restore(record.restored_step, record.restored_tier)}, {seconds:.1f} s"
            + (f", last step {record.last_step}" if record.last_step is not None else "")
        )
        mine = [i for i in incidents if (i.get("attempt") or 0) == record.attempt]
        if not mine:
            lines.append("  no incident")
        for incident in mine:
            lines.append(
                f"  incident {incident['class']} / {incident['cause']}: "
                f"{_culprit(incident)} ({incident['rule']}, confidence "
                f"{incident['confidence']:.2f}) {incident['incident_id']}"
            )
            decision = by_incident.get(incident["incident_id"])
            if decision is None:
                lines.append("  decision  none")
                continue
            stored = records.get(decision["decision_id"])
            status = stored.status.value if stored is not None else decision["delivery_status"]
            excluded = ",".join(decision.get("exclude_nodes") or []) or "nothing"
            if status == "outrun":  # the job ended before it was carried out
                excluded = f"nothing (the job ended first; it would exclude {excluded})"
            lines.append(f"  decision  {decision['action']} [{status}], excluded {excluded}")
    return lines
