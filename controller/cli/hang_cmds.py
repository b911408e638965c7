"""`faultlens analyze-hang DIR` (hang analysis straight on a dump directory) and `faultlens ingest
fr DIR`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultlens.attribution.detectors.hang import HangReport
from faultlens.collectors.artifacts.flight_recorder import DumpSet, auto_processes, read_dump_dir
from faultlens.collectors.artifacts.fr_limits import default_limits
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.training.own_stack import OWN_STACKS_DIR
from faultlens.controller.cli.common import CliError, add_store_arg, json_default
from faultlens.controller.hang_dump_dir import analyze_dump_dir

if TYPE_CHECKING:
    from faultlens.collectors.sources.pystack import ProcessStack


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "analyze-hang", help="find the rank(s) a hung job waits on, from a directory of "
                             "flight-recorder dumps",
        description="Reads every flight-recorder dump in DIR (pickle or JSON, NCCL or gloo) and "
                    "reports the culprit "
        "ranks, the process group and collective, and why.")
    parser.add_argument("directory", metavar="DIR", help="directory of per-rank dumps")
    parser.add_argument("--json", action="store_true", help="JSON output")
    parser.add_argument("--expected-ranks", type=int, metavar="N", default=None,
                        help="world size: ranks 0..N-1 should each have a dump (default: from the "
                             "dumps)")
    parser.add_argument("--processes", type=int, default=None, metavar="P",
                        help="reader processes (default: one per CPU, at most 8, from 1,024 dumps "
                             "on)")
    parser.add_argument("--stacks", metavar="SDIR", default=None,
                        help="the ranks' Python stacks (py-spy JSON, rank_<N>.json) taken during "
                             "the hang "
                        "(default: DIR/stacks, then the ranks' own in DIR/own-stacks, else "
                        "DIR/../stacks)")
    parser.set_defaults(func=run_analyze)


def register_ingest(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser("fr", help="flight-recorder dumps -> the collectives table")
    parser.add_argument("directory", metavar="DIR", help="directory of per-rank dumps")
    add_store_arg(parser)
    parser.add_argument("--job", default=None, help="job id written into the rows")
    parser.add_argument("--node", default=None, help="node name (default: the dumps' own `node` "
                                                     "key)")
    parser.add_argument("--cluster", default=None, help="cluster name written into the rows")
    parser.set_defaults(func=run_ingest)


def _read(directory: str, **kwargs: Any) -> DumpSet:
    dumps = read_dump_dir(directory, **kwargs)
    if not dumps.files:
        first = dumps.errors[0] if dumps.errors else None
        raise CliError(f"{directory}: no readable dump" + (f" ({first})" if first else ""))
    return dumps


def run_analyze(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.expected_ranks is not None and args.expected_ranks <= 0:
        raise CliError("--expected-ranks must be a positive world size")
    if args.expected_ranks is not None and args.expected_ranks > default_limits().max_world_size:
        raise CliError(f"--expected-ranks {args.expected_ranks}: larger than any job (limit "
                       f"{default_limits().max_world_size}, FAULTLENS_FR_MAX_WORLD_SIZE)")
    if args.processes is not None and args.processes <= 0:
        raise CliError("--processes must be positive")
    processes = args.processes or auto_processes(args.directory)
    stacks = _stacks(args.directory, args.stacks)
    # read and analysed together: the analysis' first pass runs on the rows as they are read
    dumps, report = analyze_dump_dir(
        args.directory,
        expected_ranks=range(args.expected_ranks) if args.expected_ranks is not None else None,
        stacks=stacks,
        processes=processes,
    )
    if not dumps.files:
        first = dumps.errors[0] if dumps.errors else None
        raise CliError(f"{args.directory}: no readable dump" + (f" ({first})" if first else ""))
    seconds = time.perf_counter() - started
    if args.json:
        document = report.to_dict() | {
            "dumps": {
                "directory": args.directory,
                "ranks_read": len(dumps.ranks),
                "rows": dumps.table.num_rows,
                "errors": [str(e) for e in dumps.errors],
                "read_seconds": round(dumps.seconds, 3),
                "seconds": round(seconds, 3),
            }
        }
        json.dump(document, sys.stdout, indent=1, default=json_default)
        sys.stdout.write("\n")
    else:
        _print_report(report, dumps, seconds)
    for error in dumps.errors:
        print(f"faultlens analyze-hang: warning: {error}", file=sys.stderr)
    return 0


def _stacks(directory: str, given: str | None) -> dict[int, ProcessStack]:
    """--stacks SDIR, else DIR/stacks (py-spy's) with DIR/own-stacks (the ranks' own, the trigger's)
    where a rank has none there, else DIR/../stacks. The stack reader is imported only where one
    of them exists (~10 ms of a small set's start)."""
    here = Path(directory)
    places = (here / "stacks", here / OWN_STACKS_DIR, here.parent / "stacks")
    if given is None and not any(place.is_dir() for place in places):
        return {}
    from faultlens.collectors.sources.pystack import load_dump_dir_stacks, load_stack_dir

    if given is not None:
        if not Path(given).is_dir():
            raise CliError(f"{given}: no such directory (--stacks)")
        return load_stack_dir(given)
    stacks = load_dump_dir_stacks(directory)
    beside = Path(directory).parent / "stacks"
    return stacks if stacks or not beside.is_dir() else load_stack_dir(beside)


def _print_report(report: HangReport, dumps: DumpSet, seconds: float) -> None:
    out = sys.stdout
    culprits = ", ".join(map(str, report.culprit_ranks)) or "none"
    out.write(f"verdict: {report.verdict.value}   culprit rank(s): {culprits}   confidence: "
              f"{report.confidence:.2f}\n")
    if report.pg_name is not None:
        out.write(f"group: {report.pg_name}" + (f" ({report.pg_desc})" if report.pg_desc else "")
                  + (f"  local pg_id {report.pg_id}" if report.pg_id else "") + "\n")
    if report.collective_seq_id is not None:
        out.write(
            f"collective: seq {report.collective_seq_id}"
            + (f" {report.op}" if report.op else "")
            + "\n"
        )
    for label, ranks in (("never joined", report.never_joined), ("stalled", report.stalled),
                         ("missing dumps", report.missing_dumps)):
        if ranks:
            out.write(f"{label}: {', '.join(map(str, ranks))}\n")
    out.write(f"why: {report.reason}\n")
    if len(report.roots) > 1 or any(root.where for root in report.roots):
        out.write(f"independent roots: {len(report.roots)}\n")
        for i, root in enumerate(report.roots, 1):
            group = root.pg_desc or root.pg_name or "-"
            out.write(
                f"  {i}. rank(s) {', '.join(map(str, root.ranks))}: {root.kind.value} in "
                f"{group}"
                + (f" seq {root.collective_seq_id}" if root.collective_seq_id is not None else "")
                + f"; {len(root.waiting_ranks)} rank(s) wait on it; confidence "
                f"{root.confidence:.2f}\n"
            )
            for line in root.where:
                out.write(f"     {line}\n")
    if report.evidence:
        out.write("evidence:\n")
        for line in report.evidence:
            out.write(f"  - {line}\n")
    out.write(f"({len(dumps.ranks)} dumps, {dumps.table.num_rows} rows, {seconds:.2f}s)\n")


def run_ingest(args: argparse.Namespace) -> int:
    identity = None
    if args.node or args.job or args.cluster:
        identity = NodeIdentity(node=args.node, cluster=args.cluster, job_id=args.job)  # type: ignore[arg-type]
    dumps = _read(args.directory, identity=identity)
    from faultlens.collectors.store.sink import SegmentSink  # (fsspec: the ingest's only)

    sink = SegmentSink(args.store, flush_rows=max(dumps.table.num_rows, 1))
    try:
        sink.write("collectives", dumps.table)
        sink.flush()
    finally:
        sink.close()
    entries = dumps.table.num_rows
    print(f"ingested {entries} rows from {len(dumps.files)} dump(s) (ranks {_span(dumps.ranks)}) "
          f"into {args.store}")
    for error in dumps.errors:
        print(f"faultlens ingest fr: error: {error}", file=sys.stderr)
    return 1 if dumps.errors else 0


def _span(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "none"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
