"""Store commands: tables, sql, compact, retention."""

from __future__ import annotations

import argparse
import sys

from faultlens.attribution.reading.store import QueryError, Store, tables_named
from faultlens.collectors.store.schema import TABLE_NAMES
from faultlens.controller.cli.common import CliError, add_format_args, add_store_arg, emit


def register(subparsers: argparse._SubParsersAction) -> None:
    tables = subparsers.add_parser("tables", help="tables in the store: row counts, segments, time "
                                                  "range")
    add_store_arg(tables)
    add_format_args(tables)
    tables.set_defaults(func=cmd_tables)

    sql = subparsers.add_parser("sql", help="run a SQL query (DuckDB) over the store's tables")
    add_store_arg(sql)
    add_format_args(sql)
    sql.add_argument("query", help="SQL, e.g. \"SELECT node, count(*) FROM gpu_events GROUP BY "
                                   "node\"")
    sql.add_argument("--job", action="append", help="only these jobs (partition pruning; "
                                                    "repeatable)")
    sql.add_argument("--node", action="append", help="only these nodes (repeatable)")
    sql.add_argument("--since", help="first date, YYYY-MM-DD")
    sql.add_argument("--until", help="last date, YYYY-MM-DD")
    sql.set_defaults(func=cmd_sql)

    comp = subparsers.add_parser("compact", help="merge the small segments of each partition")
    add_store_arg(comp)
    comp.add_argument("--table", action="append", choices=TABLE_NAMES, help="only these tables")
    comp.add_argument("--min-segments", type=int, default=2, help="merge partitions with at least "
                                                                  "this many")
    comp.set_defaults(func=cmd_compact)

    ret = subparsers.add_parser("retention", help="delete partitions older than N days")
    add_store_arg(ret)
    ret.add_argument("--days", type=int, required=True, help="keep this many days")
    ret.add_argument("--table", action="append", choices=TABLE_NAMES, help="only these tables")
    ret.add_argument("--dry-run", action="store_true", help="list the partitions that would be "
                                                            "deleted; delete "
                                                            "nothing")
    ret.set_defaults(func=cmd_retention)


def open_store(args: argparse.Namespace, **pruning: object) -> Store:
    return Store(args.store, **pruning)


def cmd_tables(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        rows = [
            {
                "table": s.table,
                "rows": s.rows,
                "segments": s.segments,
                "first_ts": s.ts_min,
                "last_ts": s.ts_max,
                "bad_segments": s.bad_segments,
            }
            for s in store.summary()
        ]
    emit(rows, args.fmt, title=f"store {args.store}")
    bad = sum(row["bad_segments"] for row in rows)
    if bad:
        print(f"faultlens tables: warning: {bad} unreadable segment(s) skipped; `faultlens doctor "
              "--store "
              f"{args.store}` lists them, --quarantine sets them aside", file=sys.stderr)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    # only the tables the query names are listed and bound (the others, and a retry, on an error)
    named = tables_named(args.query)
    with open_store(
        args, jobs=args.job, nodes=args.node, date_from=args.since, date_to=args.until,
        tables=named,
    ) as store:
        try:
            try:
                result = store.query(args.query)
            except QueryError:
                rest = [table for table in TABLE_NAMES if table not in named]
                if not rest:
                    raise
                store.refresh(rest)
                result = store.query(args.query)
        except QueryError as exc:
            raise CliError(f"query failed: {exc}") from None
    emit(result, args.fmt)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    # (maintenance and the layout load fsspec and asyncio: imported by the commands that use them)
    from faultlens.attribution.reading.maintenance import compact
    from faultlens.collectors.store.layout import resolve_store

    location = resolve_store(args.store)
    results = compact(location, args.table or TABLE_NAMES, min_segments=args.min_segments)
    for r in results:
        print(f"{r.table}: {r.segments_in} segments, {r.rows} rows -> {r.path}")
    print(f"compacted {len(results)} partitions")
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    if args.days < 0:
        raise CliError(f"--days must be >= 0, got {args.days}")
    from faultlens.attribution.reading.maintenance import retention
    from faultlens.collectors.store.layout import resolve_store

    results = retention(
        resolve_store(args.store), args.days, args.table or TABLE_NAMES, dry_run=args.dry_run
    )
    verb = "would remove" if args.dry_run else "removed"
    for r in results:
        print(f"{r.table}: {verb} {r.partition} ({r.segments} segments)")
    print(
        f"{verb} {len(results)} partitions older than {args.days} days"
        + (" (dry run: nothing deleted)" if args.dry_run else "")
    )
    return 0
