"""`faultlens doctor`: list the store's bad segments and stale temporary files; `--quarantine` moves
bad segments under <store>/_quarantine/ and removes stale temporary files.

Exit status: 0 when the store is clean (or every problem was dealt with by --quarantine), 1 when
problems remain, 2 when the store cannot be opened or reached.
"""

from __future__ import annotations

import argparse
import sys

from faultlens.attribution.doctor import check_store
from faultlens.collectors.store.schema import TABLE_NAMES
from faultlens.controller.cli.common import add_format_args, add_store_arg, emit


def register(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser(
        "doctor",
        help="check the store: segments readers skip, stale temporary files (--quarantine to fix)",
        description="Lists every segment the store reader skips (unreadable Parquet, 0 bytes, "
        "truncated, columns "
        "or types not of its table) and temporary files of writers that are gone. --quarantine "
        "moves bad segments to <store>/_quarantine/<same path> (nothing is deleted) and removes "
        "stale temporary files.",
    )
    add_store_arg(doctor)
    add_format_args(doctor)
    doctor.add_argument("--table", action="append", choices=TABLE_NAMES, help="only these tables")
    doctor.add_argument("--quick", action="store_true",
                        help="read only each segment's footer (default: read every row, which also "
                             "finds corrupt "
                        "data behind an intact footer)")
    doctor.add_argument("--quarantine", action="store_true",
                        help="move bad segments to <store>/_quarantine/ and remove stale temporary "
                             "files")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    findings = check_store(
        args.store, args.table or TABLE_NAMES, deep=not args.quick, quarantine=args.quarantine
    )
    rows = [
        {
            "table": f.table,
            "problem": f.problem.value,
            "path": f.path,
            "reason": f.reason,
            "action": f.action,
        }
        for f in findings
    ]
    if rows or args.fmt != "table":
        emit(rows, args.fmt, title=f"store {args.store}")
    unresolved = [f for f in findings if not f.action or f.action.startswith("cannot")]
    if not findings:
        print(f"store {args.store}: no problems found", file=sys.stderr)
    elif unresolved:
        print(f"faultlens doctor: {len(unresolved)} problem(s) left; run with --quarantine to set "
              "them aside",
              file=sys.stderr)
    return 1 if unresolved else 0
