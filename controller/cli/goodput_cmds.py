"""`faultlens goodput --store S --job J`: ETTR and badput by cause (definitions in
attribution/goodput/).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Mapping

from faultlens.attribution.goodput import BADPUT, Bucket, GoodputReport, goodput
from faultlens.attribution.reading.store import Store
from faultlens.controller.cli.common import (
    CliError,
    add_format_args,
    add_store_arg,
    emit,
    json_default,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "goodput",
        help="ETTR and badput by cause (lost work, "
        "detection, decision, "
        "restart, checkpoint, start-up) of one job",
    )
    add_store_arg(parser)
    add_format_args(parser)
    parser.add_argument("--job", required=True, help="the job id")
    parser.add_argument(
        "--window",
        type=float,
        metavar="SECONDS",
        help="sliding-window length for the sliding ETTR (default: a tenth of the wall clock)",
    )
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="window start, ISO 8601 with a timezone (default: the first attempt's start)",
    )
    parser.add_argument(
        "--until",
        metavar="TIME",
        help="window end, ISO 8601 with a timezone, or 'now' (default: the job's latest activity)",
    )
    parser.add_argument(
        "--live-grace",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="an incident or decision of the last attempt counts as live when it "
        "came at most this "
        "long after the job's last telemetry (default %(default)s)",
    )
    parser.add_argument(
        "--timeline", action="store_true", help="with --json: include every bucket run"
    )
    parser.set_defaults(func=cmd_goodput)


def _when(text: str | None, option: str) -> dt.datetime | None:
    if text is None:
        return None
    if text == "now":
        return dt.datetime.now(dt.UTC)
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            f"{option} {text!r}: expected an ISO 8601 time such as 2026-11-30T12:00:00Z, or 'now'"
        ) from None
    if value.tzinfo is None:
        raise CliError(f"{option} {text!r}: give a timezone (e.g. a trailing Z for UTC)")
    return value


def summary_rows(report: GoodputReport) -> list[dict[str, object]]:
    """One row per bucket: seconds and share of the wall clock, productive first."""
    rows: list[dict[str, object]] = [
        {
            "bucket": "productive",
            "seconds": round(report.productive_s, 3),
            "share": f"{report.productive_s / report.wall_s:.1%}",
        }
    ]
    for bucket in BADPUT:
        seconds = report.badput[bucket]
        rows.append(
            {
                "bucket": str(bucket),
                "seconds": round(seconds, 3),
                "share": f"{seconds / report.wall_s:.1%}",
            }
        )
    return rows


def _largest(seconds: Mapping[Bucket, float]) -> str:
    bucket, value = max(
        ((k, v) for k, v in seconds.items() if k is not Bucket.PRODUCTIVE), key=lambda kv: kv[1]
    )
    return "-" if value <= 0 else f"{bucket} {value:.1f} s"


def cmd_goodput(args: argparse.Namespace) -> int:
    if args.window is not None and args.window <= 0:
        raise CliError("--window must be a positive number of seconds")
    if args.live_grace < 0:
        raise CliError("--live-grace must be >= 0 seconds")
    since, until = _when(args.since, "--since"), _when(args.until, "--until")
    with Store(args.store, jobs=[args.job]) as reader:
        report = goodput(
            reader,
            args.job,
            since=since,
            until=until,
            window_s=args.window,
            live_grace_s=args.live_grace,
        )
    if args.fmt == "json":
        json.dump(
            report.to_dict(include_timeline=args.timeline),
            sys.stdout,
            default=json_default,
            indent=1,
        )
        sys.stdout.write("\n")
        return 0
    if args.fmt == "csv":
        emit(summary_rows(report), "csv")
        return 0
    from faultlens.controller.report.render import render_text

    def say(text: str) -> None:
        render_text(text, hanging="  ", break_words=False)

    say(
        f"job {report.job_id}: {report.start.isoformat()} .. {report.end.isoformat()} "
        f"({report.wall_s:.1f} s wall clock)"
    )
    say(
        f"ETTR {report.ettr:.1%}: {report.productive_s:.1f} s productive; steps kept "
        f"{report.steps_kept}, "
        f"steps thrown away {report.steps_lost}"
    )
    if report.min_sliding_ettr is not None:
        say(
            f"sliding ETTR over {report.window_s:.1f} s windows: lowest "
            f"{report.min_sliding_ettr:.1%}"
        )
    stretch = report.longest_unproductive
    if stretch is not None:
        spent = ", ".join(
            f"{k} {v:.1f} s" for k, v in sorted(stretch.buckets.items(), key=lambda kv: -kv[1])
        )
        say(
            f"longest unproductive stretch: {stretch.seconds:.1f} s from "
            f"{stretch.start.isoformat()} "
            f"({spent})"
        )
    if report.offline:
        say(
            f"{len(report.offline)} incident(s)/decision(s) came from a batch pass after the fact "
            "(not live): "
            "they are charged below but do not define detection, decision or restart time"
        )
    emit(summary_rows(report), "table", title="badput by cause")
    emit(
        [
            {
                "attempt": a.attempt,
                "steps": "-" if a.first_step is None else f"{a.first_step}..{a.last_step}",
                "kept": a.steps_kept,
                "lost": a.steps_lost,
                "what": "-" if a.incident_id is None else f"{a.incident_class} / {a.cause}",
                "action": a.action or "-",
                "productive": round(a.seconds[Bucket.PRODUCTIVE], 1),
                "badput": round(
                    sum(v for k, v in a.seconds.items() if k is not Bucket.PRODUCTIVE), 1
                ),
                "largest badput": _largest(a.seconds),
            }
            for a in report.attempts
        ],
        "table",
        title="per attempt, seconds (from its start to the next attempt's start; steps kept and "
        "thrown away)",
        optional=("largest badput",),
    )
    if report.incidents:
        emit(
            [
                {
                    "incident": c.incident_id + ("" if c.live else " (offline)"),
                    "attempt": c.attempt,
                    "class": c.incident_class,
                    "cause": c.cause,
                    "action": c.action,
                    "lost work": round(c.lost_work_s, 1),
                    "downtime": round(c.downtime_s, 1),
                    "total": round(c.total_s, 1),
                }
                for c in report.incidents
            ],
            "table",
            title="what each attempt-stopping incident cost, seconds",
            optional=("class", "attempt"),
        )
    return 0
