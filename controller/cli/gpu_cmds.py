"""GPU health commands: `faultlens collect` (the node agent) and `faultlens ingest kmsg|dcgm`
(one-shot imports).

`collect` offers and builds the sources of the source registry (collectors/sources/builtin.py
REGISTRY, read when the parser is built and when it runs: a source registered there is offered by
`--sources` and built by cmd_collect with nothing changed here).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import signal
import sys
from pathlib import Path

from faultlens.collectors.sources.agent import NodeAgent
from faultlens.collectors.sources.builtin import REGISTRY
from faultlens.collectors.sources.dcgm import read_scrape
from faultlens.collectors.sources.kmsg import read_kernel_log
from faultlens.collectors.sources.otel_export import GpuOtelExporter
from faultlens.collectors.sources.registry import SourceInputs
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.layout import StoreError
from faultlens.collectors.store.schema import SchemaError
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.common import CliError, add_store_arg

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'500ms', '1s', '2.5', '5m', '1h' -> seconds."""
    match = _DURATION_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError("expected a duration like 500ms, 1s, 5m or 1h, got "
                                         f"{text!r}")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return seconds


def parse_sources(text: str) -> list[str]:
    """'a,b' -> the registered source names it lists, once each; an unknown name or none refused."""
    registered = REGISTRY.names()
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in registered]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown source {unknown[0]!r}: expected a comma list of "
                                         f"{', '.join(registered)}" if unknown
                                         else "expected at least one source")
    return list(dict.fromkeys(names))


def parse_time(text: str) -> int:
    """An ISO 8601 time (naive = UTC) -> ns since the epoch."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected an ISO 8601 time like 2026-11-30T08:00:00Z, "
                                         f"got {text!r}") \
            from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1e9)


def register(subparsers: argparse._SubParsersAction) -> None:
    collect = subparsers.add_parser(
        "collect", help="run the node agent: GPU health sources -> store (and OpenTelemetry when "
                        "OTEL_* says so)",
        description="Runs the GPU health sources of one node and writes gpu_samples/gpu_events "
                    "segments. Without a "
        "GPU the nvml source says once 'NVML unavailable: <reason>' and the other sources go on. "
        "--nvml-timeline "
        "replays a recorded timeline (docs/recorded-timeline.md) instead of asking NVML.")
    add_store_arg(collect)
    collect.add_argument("--node", help="node name (default: $FAULTLENS_NODE or the hostname)")
    collect.add_argument("--cluster", help="cluster name (default: $FAULTLENS_CLUSTER)")
    collect.add_argument("--job", help="job id the rows belong to (default: none, node-level rows)")
    collect.add_argument("--sources", type=parse_sources, default=list(REGISTRY.names()),
                         help=f"comma list of {', '.join(REGISTRY.names())} (default: all)")
    collect.add_argument("--interval", type=parse_duration, default=1.0, help="poll interval "
                                                                              "(default: 1s)")
    collect.add_argument("--duration", type=parse_duration, help="stop after this long (default: "
                                                                 "run until killed)")
    collect.add_argument("--kmsg-path", default="/dev/kmsg",
                         help="kernel log: /dev/kmsg, a log file, or a file of journalctl -k -o "
                              "json (default: "
                         "%(default)s)")
    collect.add_argument("--kmsg-from-start", action="store_true",
                         help="also read what the kernel log already holds (default: only new "
                              "lines)")
    collect.add_argument("--dcgm-url", default="http://127.0.0.1:9400/metrics",
                         help="dcgm-exporter URL or scrape file (default: %(default)s)")
    collect.add_argument("--nvml-timeline", type=Path,
                         help="use the recorded backend with this timeline file instead of NVML "
                              "(tests, demos)")
    collect.add_argument("--nvml-timeline-scale", type=float, default=1.0,
                         help="stretch the timeline's times by this factor (default: 1)")
    collect.add_argument("--flush-age", type=parse_duration, default=5.0,
                         help="write a segment when its oldest row is this old (default: 5s)")
    collect.set_defaults(func=cmd_collect)


def register_ingest(kinds: argparse._SubParsersAction) -> None:
    kmsg = kinds.add_parser("kmsg", help="import GPU events from a kernel log (text, /dev/kmsg "
                                         "dump, journalctl -k "
                            "-o json)")
    add_store_arg(kmsg)
    kmsg.add_argument("file", type=Path, help="the kernel log file")
    kmsg.add_argument("--node", help="node name for every row (default: the line's hostname, else "
                                     "this host)")
    kmsg.add_argument("--boot-time", type=parse_time,
                      help="boot time of the machine that wrote the log, for lines stamped "
                           "relative to boot")
    kmsg.add_argument("--utc", action="store_true", help="syslog / dmesg -T times are UTC "
                                                         "(default: local time)")
    kmsg.set_defaults(func=cmd_ingest_kmsg)

    dcgm = kinds.add_parser("dcgm", help="import one dcgm-exporter scrape (file or http URL)")
    add_store_arg(dcgm)
    dcgm.add_argument("location", help="scrape file or http(s) URL of dcgm-exporter's /metrics")
    dcgm.add_argument("--node", help="node name for every row (default: the hostname label, else "
                                     "this host)")
    dcgm.add_argument("--timeout", type=parse_duration, default=5.0, help="HTTP timeout (default: "
                                                                          "5s)")
    dcgm.set_defaults(func=cmd_ingest_dcgm)


def _configure_logging() -> None:
    root = logging.getLogger("faultlens")
    if not any(getattr(handler, "_faultlens", False) for handler in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("faultlens collect: %(message)s"))
        handler._faultlens = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    root.propagate = False


def cmd_collect(args: argparse.Namespace) -> int:
    _configure_logging()
    base = NodeIdentity.from_env(args.node)
    identity = NodeIdentity(node=base.node, cluster=args.cluster or base.cluster, job_id=args.job,
                            attempt=base.attempt if args.job else None)
    exporter = GpuOtelExporter.from_env(node=identity.node)
    inputs = SourceInputs(identity, kmsg_path=args.kmsg_path, kmsg_from_start=args.kmsg_from_start,
                          dcgm_url=args.dcgm_url, nvml_timeline=args.nvml_timeline,
                          nvml_timeline_scale=args.nvml_timeline_scale)
    sources = REGISTRY.build(inputs, args.sources)
    sink = SegmentSink(args.store, flush_age_s=args.flush_age)
    agent = NodeAgent(sources, sink, interval_s=args.interval, exporter=exporter)

    def stop(signum: int, frame: object) -> None:
        agent.stop()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        stats = agent.run(args.duration)
    finally:
        signal.signal(signal.SIGTERM, previous)
    rows = ", ".join(f"{count} {table}" for table, count in sorted(stats.rows.items())) or "no rows"
    print(f"collected {rows} on node {identity.node} in {stats.ticks} polls into {args.store}")
    return 0


def _write(store: str, table_rows: dict[str, list[dict]], what: str) -> dict[str, int]:
    written = {}
    try:
        with SegmentSink(store) as sink:
            for table, rows in table_rows.items():
                if rows:
                    sink.write(table, rows)
                    written[table] = len(rows)
    except (StoreError, SchemaError) as exc:
        raise CliError(f"{what}: cannot store: {exc}") from None
    return written


def cmd_ingest_kmsg(args: argparse.Namespace) -> int:
    identity = NodeIdentity.from_env(args.node)
    result = read_kernel_log(
        args.file,
        identity,
        host_from_line=args.node is None,
        boot_time=args.boot_time,
        tz=dt.UTC if args.utc else None,
    )
    written = _write(args.store, {"gpu_events": result.rows}, f"kmsg {args.file}")
    stats = result.stats
    for note in result.notes:  # what the reader skipped or read differently, one line each
        print(f"faultlens ingest: warning: {note}", file=sys.stderr)
    if stats.bad_lines:
        line_no, reason = stats.bad_examples[0]
        print(f"faultlens ingest: warning: kmsg {args.file}: skipped {stats.bad_lines} bad "
              "line(s), first at line "
              f"{line_no}: {reason}", file=sys.stderr)
    print(f"kmsg {args.file}: {stats.lines} lines, {written.get('gpu_events', 0)} GPU events -> "
          f"{args.store}")
    return 0


def cmd_ingest_dcgm(args: argparse.Namespace) -> int:
    identity = NodeIdentity.from_env(args.node)
    samples, events, stats = read_scrape(
        args.location, identity, host_from_labels=args.node is None, timeout_s=args.timeout
    )
    written = _write(
        args.store, {"gpu_samples": samples, "gpu_events": events}, f"dcgm {args.location}"
    )
    if stats.bad_lines:
        line_no, reason = stats.bad_examples[0]
        print(f"faultlens ingest: warning: dcgm {args.location}: skipped {stats.bad_lines} bad "
              "line(s), first at "
              f"line {line_no}: {reason}", file=sys.stderr)
    print(f"dcgm {args.location}: {written.get('gpu_samples', 0)} GPU samples, "
          f"{written.get('gpu_events', 0)} "
          f"GPU events -> {args.store}")
    return 0
