"""`faultlens ingest steps FILE`: a per-rank timing table (Parquet or CSV: rank, step, section,
start, duration, with a column mapping and the placement) -> the steps and ranks tables, for offline
straggler analysis."""

from __future__ import annotations

import argparse

from faultlens.collectors.artifacts.step_table import (
    COORDS,
    OPTIONAL,
    REQUIRED,
    UNITS,
    read_step_table,
)
from faultlens.collectors.store.layout import StoreError
from faultlens.collectors.store.schema import SchemaError
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.common import CliError, add_store_arg

NAMES = REQUIRED + OPTIONAL + COORDS


def _mapping(pairs: list[str], what: str) -> dict[str, str]:
    mapping = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        if not sep or not name or not column:
            raise CliError(f"{what} {pair!r}: expected NAME=COLUMN, e.g. rank=global_rank")
        if name not in NAMES:
            raise CliError(f"{what} {pair!r}: unknown name {name!r}; expected one of "
                           f"{', '.join(NAMES)}")
        mapping[name] = column
    return mapping


def register_ingest(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser(
        "steps", help="a per-rank timing table (Parquet/CSV: rank, step, section, start, duration) "
                      "-> steps, ranks",
        description="Reads one row per (rank, step, section) timing (Megatron timers, a profiler "
                    "export), sums a "
        "section timed several times in a step, and writes one steps row per rank and step plus "
        "one ranks row per "
        "rank (node, dp_rank, pp_rank, tp_rank, cp_rank, ep_rank from the same file or "
        "--placement), so "
        "`faultlens attribute` can find stragglers offline.")
    parser.add_argument("file", metavar="FILE", help="the timing table (.parquet or .csv)")
    add_store_arg(parser)
    parser.add_argument("--map", dest="mapping", action="append", default=[], metavar="NAME=COLUMN",
                        help=f"the file's column for NAME (one of {', '.join(NAMES)}); repeatable")
    parser.add_argument(
        "--duration-unit", choices=sorted(UNITS), default="s", help="unit of duration (s)"
    )
    parser.add_argument("--start-unit", choices=sorted(UNITS), default="s",
                        help="unit of a numeric start since the epoch (s); timestamps are read as "
                             "they are")
    parser.add_argument(
        "--placement",
        default=None,
        metavar="FILE",
        help="a table of rank and node / dp_rank / pp_rank / ... (.parquet or .csv)",
    )
    parser.add_argument("--placement-map", dest="placement_mapping", action="append", default=[],
                        metavar="NAME=COLUMN", help="column mapping of the placement table; "
                                                    "repeatable")
    parser.add_argument("--job", default=None, help="job id for the rows (default: the file's "
                                                    "job_id column)")
    parser.add_argument("--attempt", type=int, default=None, help="attempt number (default: the "
                                                                  "file's, else 0)")
    parser.add_argument("--node", default=None, help="node for every rank (default: the file's or "
                                                     "placement's)")
    parser.set_defaults(func=run_ingest)


def run_ingest(args: argparse.Namespace) -> int:
    tables = read_step_table(args.file, mapping=_mapping(args.mapping, "--map"),
                             duration_unit=args.duration_unit, start_unit=args.start_unit,
                             placement=args.placement,
                             placement_mapping=_mapping(args.placement_mapping, "--placement-map"),
                             job_id=args.job, attempt=args.attempt, node=args.node)
    try:
        with SegmentSink(args.store, flush_rows=10_000_000, flush_age_s=3600) as sink:
            sink.write("steps", tables.steps)
            sink.write("ranks", tables.ranks)
    except (StoreError, SchemaError, OSError) as exc:
        raise CliError(f"{args.store}: cannot write: {exc}") from None
    print(f"ingested {tables.steps.num_rows} steps rows ({tables.rows_in} timings, "
          f"{len(tables.sections)} sections) "
          f"and {tables.ranks.num_rows} ranks rows from {args.file} into {args.store}")
    return 0
