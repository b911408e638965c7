"""The demo's closing report: one short block per attempt (what was injected, what faultlens found,
what it decided, where the next attempt resumed), ETTR and badput by cause
(faultlens.attribution.goodput over the store), the HTML report's path and how to open the store.
Plain lines folded to the output's width: readable in a log file."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from faultlens.attribution.goodput import GoodputError, GoodputReport, goodput
from faultlens.controller.report.render import output_width, render_text
from faultlens.controller.report.wording import culprit_text, restore_text, seconds_text, short_path
from faultlens.controller.supervisor.run import RunResult


def run_goodput(result: RunResult) -> GoodputReport | None:
    """Goodput of the demo's job over the supervisor's own window: from the first attempt's launch
    to the last attempt's end, with each attempt starting when the supervisor launched it (the store
    first sees an attempt when its ranks have initialised, seconds later)."""
    if not result.attempts:
        return None
    first, last = result.attempts[0], result.attempts[-1]
    try:
        return goodput(
            result.store,
            result.job_id,
            since=first.started,
            until=last.ended or last.started,
            attempt_starts={record.attempt: record.started for record in result.attempts},
        )
    except GoodputError:
        return None


def attempt_lines(result: RunResult, lost: dict[int, int]) -> list[tuple[str, str]]:
    """(label, text) pairs, one block per attempt."""
    lines: list[tuple[str, str]] = []
    for record in result.attempts:
        seconds = ((record.ended or record.started) - record.started).total_seconds()
        head = (f"attempt {record.attempt} on {','.join(record.nodes)}, "
                f"{restore_text(record.restored_step, record.restored_tier)}, "
                f"{seconds_text(seconds)}")
        if record.attempt in lost:
            n = lost[record.attempt]
            head += f", {n} step{'' if n == 1 else 's'} thrown away"
        lines.append(("", head))
        lines.append(("injected", record.fault or "nothing"))
        incident, decision = record.incident, record.decision
        if incident is None:
            lines.append(("found", "no incident"))
        else:
            culprit = culprit_text(
                incident.culprit_nodes,
                incident.culprit_ranks,
                incident.culprit_gpus,
                incident.cause.value,
            )
            lines.append(("found", f"{incident.incident_class.value} / {incident.cause.value}: "
                                   f"{culprit} "
                                   f"({incident.rule}, confidence {incident.confidence:.2f}) "
                                   f"{incident.incident_id}"))
        if decision is not None:
            reason = decision.reason or ""
            text = f"{decision.action.value} ({decision.policy_rule})" + (
                f": {reason}" if reason else ""
            )
            excluded = ",".join(decision.exclude_nodes)
            if excluded and excluded not in reason:
                text += f"; exclude {excluded}"
            if decision.restore is not None and decision.action.value == "failover" \
                    and f"step {decision.restore.step}" not in reason:
                text += f"; resume {restore_text(decision.restore.step, decision.restore.tier)}"
            lines.append(("decision", text))
    return lines


def print_attempts(result: RunResult, out: TextIO, lost: dict[int, int] | None = None,
                   title: str | None = None) -> None:
    """The per-attempt blocks (shared with `faultlens run`)."""
    width = output_width(out)
    render_text(title or f"job {result.job_id}: {result.outcome.value} after "
                         f"{len(result.attempts)} attempt(s)",
                out=out, width=width)
    for label, text in attempt_lines(result, lost or {}):
        if not label:
            render_text(text, out=out, width=width, break_words=False)
        else:
            render_text(
                f"  {label:<9} {text}", out=out, width=width, hanging=" " * 12, break_words=False
            )


def print_report(result: RunResult, out: TextIO, *, wall_s: float, store: str,
                 html: Path | None = None) -> GoodputReport | None:
    """Print the closing report; returns the goodput report it used (None when the store had
    nothing).
    """
    width = output_width(out)
    report = run_goodput(result)
    lost = {a.attempt: a.steps_lost for a in report.attempts} if report is not None else {}
    out.write("\n")
    print_attempts(result, out, lost, title=f"faultlens demo: job {result.job_id}, "
                                            f"{result.outcome.value} after "
                                            f"{len(result.attempts)} attempt(s)")
    out.write("\n")
    if report is not None:
        badput = ", ".join(
            f"{bucket} {seconds:.1f} s"
            for bucket, seconds in sorted(report.badput.items(), key=lambda kv: -kv[1])
            if seconds >= 0.05
        )
        render_text(f"ETTR (faultlens goodput): {report.productive_s:.1f} s productive of "
                    f"{report.wall_s:.1f} s "
                    f"wall clock = {report.ettr:.0%}", out=out, width=width)
        render_text(f"badput: {badput}", out=out, width=width, hanging="  ")
        render_text(f"steps thrown away: {report.steps_lost}; nodes excluded: "
                    f"{', '.join(result.excluded) or 'none'}",
                    out=out, width=width, hanging="  ")
        if report.longest_unproductive is not None:
            render_text(
                f"longest unproductive stretch: {report.longest_unproductive.seconds:.1f} s",
                out=out,
                width=width,
            )
    automatic = sum(
        1
        for r in result.attempts
        if r.decision is not None and r.decision.action.value == "failover"
    )
    humans = sum(
        1
        for r in result.attempts
        if r.decision is not None and r.decision.action.value != "failover"
    )
    render_text(f"{automatic} incidents recovered automatically, {humans} escalated to a human; "
                f"whole run {wall_s:.0f} s", out=out, width=width)
    out.write("\n")
    render_text(
        f"jobs:      faultlens jobs --store {store}", out=out, width=width, hanging=" " * 11
    )
    escalated = [
        r.incident
        for r in result.attempts
        if r.incident is not None
        and r.decision is not None
        and r.decision.action.value != "failover"
    ]
    if escalated:
        render_text(
            f"escalated: faultlens incident --store {store} {escalated[-1].incident_id}",
            out=out,
            width=width,
            hanging=" " * 11,
        )
    render_text(
        f"goodput:   faultlens goodput --store {store} --job {result.job_id}",
        out=out,
        width=width,
        hanging=" " * 11,
    )
    if html is not None:
        out.write(f"report:    {short_path(html)}\n")  # a path: never folded
    render_text(f'SQL:       faultlens sql --store {store} "SELECT ts, class, cause, '
                'culprit_nodes, culprit_ranks, '
                f'rule FROM incidents ORDER BY ts"', out=out, width=width, hanging=" " * 11)
    return report
