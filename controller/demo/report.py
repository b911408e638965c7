"""The demo's closing report: incidents, decisions, lost steps and time, ETTR and badput by cause (from
attribution.goodput over the store), and how to open the store."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from attribution.goodput import GoodputError, GoodputReport, goodput
from controller.supervisor.run import RunResult


def run_goodput(result: RunResult) -> GoodputReport | None:
    """Goodput of the demo's job over the supervisor's own window: from the first attempt's launch to the last
    attempt's end, with each attempt starting when the supervisor launched it (the store first sees an attempt
    when its ranks have initialised, seconds later)."""
    if not result.attempts:
        return None
    first, last = result.attempts[0], result.attempts[-1]
    try:
        return goodput(result.store, result.job_id, since=first.started, until=last.ended or last.started,
                       attempt_starts={record.attempt: record.started for record in result.attempts})
    except GoodputError:
        return None


def print_report(result: RunResult, console: Console, *, wall_s: float, store: str) -> GoodputReport | None:
    """Print the closing report; returns the goodput report it used (None when the store had nothing)."""
    report = run_goodput(result)
    lost = {a.attempt: a.steps_lost for a in report.attempts} if report is not None else {}
    table = Table(title=f"faultlens demo: job {result.job_id} ({result.outcome.value})")
    for column in ("attempt", "nodes", "injected fault", "incident", "culprit", "decision", "resumed from",
                   "lost steps", "seconds"):
        table.add_column(column, overflow="fold")
    for record in result.attempts:
        incident, decision = record.incident, record.decision
        cells = (
            str(record.attempt), ",".join(record.nodes), record.fault or "-",
            "-" if incident is None else f"{incident.incident_class.value} / {incident.cause.value}",
            "-" if incident is None else f"{','.join(incident.culprit_nodes) or '?'} rank "
                                         f"{','.join(map(str, incident.culprit_ranks)) or '?'}",
            "-" if decision is None else decision.action.value + (
                f" (exclude {','.join(decision.exclude_nodes)})" if decision.exclude_nodes else ""),
            "scratch" if record.restored_step is None else f"step {record.restored_step} ({record.restored_tier})",
            str(lost.get(record.attempt, "-")),
            f"{((record.ended or record.started) - record.started).total_seconds():.1f}",
        )
        table.add_row(*(Text(cell) for cell in cells))  # data, never markup
    console.print(table)
    if report is not None:
        badput = ", ".join(f"{bucket} {seconds:.1f} s" for bucket, seconds
                           in sorted(report.badput.items(), key=lambda kv: -kv[1]) if seconds >= 0.05)
        console.print(f"ETTR (faultlens goodput): {report.productive_s:.1f} s productive of {report.wall_s:.1f} s "
                      f"wall clock = {report.ettr:.0%}; badput: {badput}; steps thrown away: {report.steps_lost}; "
                      f"nodes excluded: {', '.join(result.excluded) or 'none'}", markup=False)
        if report.longest_unproductive is not None:
            console.print(f"longest unproductive stretch: {report.longest_unproductive.seconds:.1f} s; "
                          f"details: faultlens goodput --store {store} --job {result.job_id}", markup=False)
    automatic = sum(1 for r in result.attempts if r.decision is not None and r.decision.action.value == "failover")
    humans = sum(1 for r in result.attempts if r.decision is not None and r.decision.action.value != "failover")
    console.print(f"{automatic} incidents recovered automatically, {humans} escalated to a human; "
                  f"whole run {wall_s:.0f} s", markup=False)
    console.print(f'Open the store in DuckDB: faultlens sql --store {store} '
                  f'"SELECT ts, class, cause, culprit_nodes, culprit_ranks, rule FROM incidents ORDER BY ts"',
                  markup=False)
    return report
