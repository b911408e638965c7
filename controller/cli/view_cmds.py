"""`faultlens jobs`, `faultlens incident ID` and `faultlens report --job J -o report.html`: the
store as an operator reads it (what ran, what broke, what was decided), without SQL."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from faultlens.controller.cli.common import CliError, add_store_arg, json_default


def register(subparsers: argparse._SubParsersAction) -> None:
    jobs = subparsers.add_parser(
        "jobs", help="the jobs in the store: attempts, state, incidents, decisions, ETTR"
    )
    add_store_arg(jobs)
    jobs.add_argument(
        "--json",
        dest="fmt",
        action="store_const",
        const="json",
        default="table",
        help="JSON output",
    )
    jobs.add_argument(
        "--no-ettr", action="store_true", help="skip the goodput accounting (faster on big stores)"
    )
    jobs.set_defaults(func=cmd_jobs)

    incident = subparsers.add_parser(
        "incident",
        help="one incident: what, where, why, the "
        "evidence as a "
        "timeline, the decision and the restore",
    )
    add_store_arg(incident)
    incident.add_argument("incident_id", metavar="ID", help="incident id or a unique prefix of it")
    incident.add_argument(
        "--json", dest="fmt", action="store_const", const="json", default="text", help="JSON output"
    )
    incident.set_defaults(func=cmd_incident)

    report = subparsers.add_parser(
        "report",
        help="one job as a self-contained HTML page: attempts "
        "and incidents "
        "on a timeline, step-time heatmap, GPU signals, "
        "decisions, goodput",
    )
    add_store_arg(report)
    report.add_argument("--job", required=True, help="the job id (faultlens jobs lists them)")
    report.add_argument(
        "-o", "--output", default=None, help="the HTML file (default: report-<job>.html)"
    )
    report.add_argument(
        "--attempt",
        type=int,
        default=None,
        metavar="N",
        help="only attempt N: its incidents, steps, GPU signals and decisions",
    )
    report.set_defaults(func=cmd_report)


def _store(args: argparse.Namespace, jobs: list[str] | None = None):
    from faultlens.attribution.reading.store import Store

    return Store(args.store, jobs=jobs)


def cmd_jobs(args: argparse.Namespace) -> int:
    from faultlens.controller.report.data import list_jobs
    from faultlens.controller.report.render import render_table, render_text

    with _store(args) as store:
        rows = list_jobs(store, with_ettr=not args.no_ettr)
    if args.fmt == "json":
        json.dump([r.to_dict() for r in rows], sys.stdout, default=json_default, indent=1)
        sys.stdout.write("\n")
        return 0
    table = [
        {
            "job": r.job_id,
            "attempts": r.attempts,
            "state": r.state,
            "incidents": r.incidents,
            "decisions": r.decisions,
            "ETTR": "-" if r.ettr is None else f"{r.ettr:.0%}",
        }
        for r in rows
    ]
    render_table(table, title=f"{len(rows)} job(s) in {args.store}")
    if rows:
        render_text(
            f"incidents of a job: faultlens incidents --store {args.store} --job {rows[-1].job_id}",
            hanging="  ",
            break_words=False,
        )
    return 0


def _clock(value: dt.datetime | None) -> str:
    return "(no time)" if value is None else value.astimezone(dt.UTC).strftime("%H:%M:%S.%f")[:-4]


def _offset(value: dt.datetime | None, origin: dt.datetime | None) -> str:
    if value is None or origin is None:
        return ""
    seconds = (value - origin).total_seconds()
    return f"{seconds:+.1f}s"


def incident_record(incident: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) lines of the incident view, in reading order."""
    from faultlens.controller.report.wording import culprit_text, restore_text

    lines: list[tuple[str, str]] = []
    first, detected = incident.get("first_signal_ts"), incident.get("detected_ts")
    lines.append(
        (
            "what",
            f"{incident['class']} / {incident['cause']}: {incident.get('summary') or ''}".strip(),
        )
    )
    where = culprit_text(
        incident.get("culprit_nodes"),
        incident.get("culprit_ranks"),
        incident.get("culprit_gpus"),
        incident.get("cause"),
    )
    lines.append(
        (
            "where",
            where + (f", step {incident['step']}" if incident.get("step") is not None else ""),
        )
    )
    lines.append(("job", f"{incident.get('job_id') or '-'} attempt {incident.get('attempt')}"))
    when = f"first signal {first.isoformat() if first else '-'}"  # one token: never folded
    if first and detected:
        when += f", detected {(detected - first).total_seconds():.1f} s later"
    lines.append(("when", when))
    lines.append(
        (
            "why",
            f"rule {incident.get('rule')}, confidence "
            f"{incident.get('confidence') or 0:.2f}"
            + (f", fingerprint {incident['fingerprint']}" if incident.get("fingerprint") else ""),
        )
    )
    evidence = sorted(
        incident.get("evidence") or [], key=lambda e: (e["ts"] is None, e["ts"] or first)
    )
    for item in evidence:
        when = " ".join(p for p in (_offset(item["ts"], first), _clock(item["ts"])) if p)
        lines.append(("evidence", f"{when} [{item['table']}] {item['text']}"))
    if not incident.get("decisions"):
        lines.append(("decision", "none yet (faultlens decide applies the policy)"))
    for decision in incident.get("decisions") or []:
        text = f"{decision['action']} (policy rule {decision.get('policy_rule') or '?'})"
        reason = decision.get("reason") or ""
        if reason:
            text += f": {reason}"
        excluded = ",".join(decision.get("exclude_nodes") or [])
        if excluded and excluded not in reason:
            text += f"; exclude {excluded}"
        if decision.get("issued_ts") and detected:
            text += (
                f"; issued {(decision['issued_ts'] - detected).total_seconds():.1f} s after "
                "detection"
            )
        lines.append(("decision", text))
        if decision.get("restore_step") is not None:
            lines.append(
                (
                    "restore",
                    restore_text(decision["restore_step"], decision.get("restore_tier"))
                    + (f" ({decision['restore_uri']})" if decision.get("restore_uri") else ""),
                )
            )
        elif decision["action"] == "failover":
            lines.append(("restore", "from scratch (no usable checkpoint)"))
        for delivery in decision.get("deliveries") or []:
            lines.append(
                (
                    "delivery",
                    f"{delivery['hook']}: {delivery['status']}"
                    + (f" ({delivery['error']})" if delivery.get("error") else ""),
                )
            )
    return lines


def cmd_incident(args: argparse.Namespace) -> int:
    from faultlens.controller.report.data import find_incident_id, load_incident
    from faultlens.controller.report.render import output_width, render_text

    with _store(args) as store:
        incident = load_incident(store, find_incident_id(store, args.incident_id))
    if args.fmt == "json":
        json.dump(incident, sys.stdout, default=json_default, indent=1)
        sys.stdout.write("\n")
        return 0
    out = sys.stdout
    width = output_width(out)
    render_text(f"incident {incident['incident_id']}", out=out, width=width, break_words=False)
    previous = None
    for label, text in incident_record(incident):
        shown = label if label != previous else ""
        previous = label
        # ids, times and paths are words users copy: folded between words, never inside one
        render_text(f"{shown:<9} {text}", out=out, width=width, hanging=" " * 10, break_words=False)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from faultlens.controller.report.html import write_report

    output = Path(args.output or f"report-{args.job}.html")
    try:
        with _store(args) as store:  # not pruned to the job: GPU samples carry no job id
            path = write_report(store, args.job, output, attempt=args.attempt)
    except OSError as exc:
        raise CliError(f"{output}: {exc.strerror or exc}") from None
    print(f"wrote {path} (open it in a browser; it needs no network)")
    return 0
