"""The demo's closing report: incidents, decisions, lost steps and time, ETTR, and how to open the store."""

from __future__ import annotations

import statistics

from rich.console import Console
from rich.table import Table

from attribution.store import Store
from controller.supervisor.run import RunResult


def lost_steps(result: RunResult) -> list[int | None]:
    """Per attempt: steps computed but thrown away (last step reached minus the step the next attempt resumed
    from); None for the last attempt."""
    lost: list[int | None] = []
    for record, following in zip(result.attempts, [*result.attempts[1:], None], strict=True):
        if following is None or record.last_step is None:
            lost.append(None)
            continue
        resumed = following.restored_step if following.restored_step is not None else -1
        lost.append(max(0, record.last_step - resumed))
    return lost


def step_time_s(store: str, job_id: str) -> float | None:
    with Store(store, jobs=[job_id]) as reader:
        rows = reader.query("SELECT duration_s FROM steps WHERE phase = 'train' AND duration_s IS NOT NULL "
                            "AND job_id = ?", [job_id]).column(0).to_pylist()
    return statistics.median(rows) if rows else None


def print_report(result: RunResult, console: Console, *, wall_s: float, store: str) -> None:
    table = Table(title=f"faultlens demo: job {result.job_id} ({result.outcome.value})")
    for column in ("attempt", "nodes", "injected fault", "incident", "culprit", "decision", "resumed from",
                   "lost steps", "seconds"):
        table.add_column(column, overflow="fold")
    for record, lost in zip(result.attempts, lost_steps(result), strict=True):
        incident, decision = record.incident, record.decision
        table.add_row(
            str(record.attempt), ",".join(record.nodes), record.fault or "-",
            "-" if incident is None else f"{incident.incident_class.value} / {incident.cause.value}",
            "-" if incident is None else f"{','.join(incident.culprit_nodes) or '?'} rank "
                                         f"{','.join(map(str, incident.culprit_ranks)) or '?'}",
            "-" if decision is None else decision.action.value + (
                f" (exclude {','.join(decision.exclude_nodes)})" if decision.exclude_nodes else ""),
            "scratch" if record.restored_step is None else f"step {record.restored_step} ({record.restored_tier})",
            "-" if lost is None else str(lost),
            f"{((record.ended or record.started) - record.started).total_seconds():.1f}",
        )
    console.print(table)
    step_s = step_time_s(store, result.job_id)
    last = result.attempts[-1].last_step if result.attempts else None
    kept = 0 if last is None else last + 1
    if step_s is not None and wall_s > 0:
        useful = kept * step_s
        console.print(f"ETTR (kept steps x median step time / wall time): {kept} x {step_s:.3f} s / {wall_s:.1f} s "
                      f"= {useful / wall_s:.0%}; steps thrown away: {sum(x or 0 for x in lost_steps(result))}; "
                      f"nodes excluded: {', '.join(result.excluded) or 'none'}")
    automatic = sum(1 for r in result.attempts if r.decision is not None and r.decision.action.value == "failover")
    humans = sum(1 for r in result.attempts if r.decision is not None and r.decision.action.value != "failover")
    console.print(f"{automatic} incidents recovered automatically, {humans} escalated to a human; "
                  f"whole run {wall_s:.0f} s")
    console.print(f'Open the store in DuckDB: faultlens sql --store {store} '
                  f'"SELECT ts, class, cause, culprit_nodes, culprit_ranks, rule FROM incidents ORDER BY ts"')
