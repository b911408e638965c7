"""`faultlens ingest torchrun LOGDIR_OR_STDERR_FILE ...`: torchrun failure reports, --log-dir trees
and error files -> the process_events table."""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import sys

from faultlens.collectors.sources.process_events import CollectResult, EventContext, collect_paths
from faultlens.collectors.sources.process_rules import load_process_rules
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.common import CliError, add_store_arg


def register_ingest(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "torchrun", help="torchrun stderr reports, --log-dir trees, error.json files -> the "
                         "process_events table",
        description="Reads torchrun's stderr (its Failures / Root Cause report and the workers' "
                    "teed lines), a "
        "torchrun --log-dir tree (<run>/attempt_<n>/<local rank>/error.json and stderr.log) or an "
        "error file "
        "(a worker's error.json, TORCHELASTIC_ERROR_FILE), and writes one process_events row per "
        "exit, exception, "
        "OOM, communication error or watchdog timeout.")
    parser.add_argument("paths", nargs="+", metavar="LOGDIR_OR_STDERR_FILE",
                        help="a torchrun --log-dir directory, a file with torchrun's stderr, or an "
                             "error.json")
    add_store_arg(parser)
    parser.add_argument("--job", default=None, help="job id for the rows (default: torchrun's run "
                                                    "id)")
    parser.add_argument("--node", default=None, help="node name (default: the report's host)")
    parser.add_argument("--cluster", default=None, help="cluster name written into the rows")
    parser.add_argument("--utc", action="store_true",
                        help="torchrun's report times are UTC (default: this machine's local time "
                             "zone)")
    parser.add_argument("--rules", default=None, metavar="FILE_OR_DIR",
                        help="error-text rules file (default: rules/process_errors.yaml), or a "
                             "directory of rule "
                             "files replacing the shipped ones of the same name (default "
                             "$FAULTLENS_RULES)")
    parser.set_defaults(func=run_ingest)


def run_ingest(args: argparse.Namespace) -> int:
    rules = load_process_rules(args.rules)
    context = EventContext(
        node=args.node, cluster=args.cluster, job_id=args.job, tz=dt.UTC if args.utc else None
    )
    result = collect_paths(args.paths, context, rules)
    if not result.rows:
        if result.errors:
            raise CliError(
                result.errors[0]
                + (f" (and {len(result.errors) - 1} more)" if len(result.errors) > 1 else "")
            )
        print(f"no process events in {', '.join(args.paths)} (a run that went well?)")
        return 0
    _write(result, args.store)
    kinds = collections.Counter(row["kind"] for row in result.rows)
    summary = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    print(f"ingested {len(result.rows)} process_events rows ({summary}) from {result.files} "
          f"file(s) into {args.store}")
    for error in result.errors:
        print(f"faultlens ingest torchrun: error: {error}", file=sys.stderr)
    return 1 if result.errors else 0


def _write(result: CollectResult, store: str) -> None:
    table = result.table()
    sink = SegmentSink(store, flush_rows=max(table.num_rows, 1))
    try:
        sink.write("process_events", table)
        sink.flush()
    finally:
        sink.close()
