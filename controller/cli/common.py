"""Shared pieces of the CLI: the --store option, the error type, and table/JSON/CSV output."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from faultlens import environment
from faultlens.errors import FaultlensError

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_STORE = "./faultlens-store"
CSV_SPECIAL = frozenset(',"\r\n')


class CliError(FaultlensError):
    """A user-facing error: printed as one line, exit code `code` (2: bad input or path)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = self.exit_code = code


def _rules_dir(value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value}: not a directory")
    return path


def add_rules_dir_arg(parser: argparse.ArgumentParser) -> None:
    """`--rules DIR`: rule files that replace the shipped ones of the same name (main() applies it
    through faultlens.resources.use_rules_dir, so the processes the command starts read them too).
    """
    parser.add_argument(
        "--rules",
        type=_rules_dir,
        metavar="DIR",
        help="directory of rule files replacing the shipped ones of the same name "
        "(default: $FAULTLENS_RULES, else the packaged rules)",
    )


def add_store_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        default=environment.STORE.get(default=DEFAULT_STORE),
        help="store directory or URL (default: $FAULTLENS_STORE or %(default)s)",
    )


def add_format_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", dest="fmt", action="store_const", const="json", help="JSON output")
    group.add_argument("--csv", dest="fmt", action="store_const", const="csv", help="CSV output")
    parser.set_defaults(fmt="table")


def json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _plain(value: Any) -> Any:
    """Map columns come back as lists of (key, value) pairs; show them as dicts. NaN: null."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, tuple) and len(v) == 2 for v in value)
    ):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def records(table: pa.Table) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.items()} for row in table.to_pylist()]


def _cell(value: Any) -> str:
    from faultlens.controller.report.render import cell_text

    return cell_text(value)


def _csv_field(text: str) -> str:
    if any(ch in text for ch in CSV_SPECIAL):
        return '"' + text.replace('"', '""') + '"'
    return text


def csv_line(cells: Sequence[str]) -> str:
    """One CSV record ending in a plain "\n" (the csv module ends records with "\r\n", which a
    shell's `$(...)` keeps on the last value). RFC 4180 quoting otherwise: a field holding a comma,
    a quote, "\r" or "\n" is quoted (the csv module would leave a bare "\r" unquoted once "\n"
    ends the records, splitting the row for every reader); a lone empty field is written `""` so the
    record is not a blank line."""
    texts = [str(c) for c in cells]
    if texts == [""]:
        return '""\n'
    return ",".join(_csv_field(t) for t in texts) + "\n"


def emit(
    table: pa.Table | Sequence[dict[str, Any]],
    fmt: str,
    out: TextIO | None = None,
    title: str | None = None,
    optional: Sequence[str] = (),
) -> None:
    """Write rows as a table (default: faultlens.controller.report.render.render_table, literal
    text fitted to the width), JSON (a list of objects) or CSV."""
    out = out or sys.stdout
    is_arrow = hasattr(table, "column_names") and hasattr(table, "to_pylist")
    rows = records(table) if is_arrow else [dict(r) for r in table]
    columns = table.column_names if is_arrow else (list(rows[0]) if rows else [])
    if fmt == "json":
        json.dump(rows, out, default=json_default, indent=1)
        out.write("\n")
        return
    if fmt == "csv":
        out.write(csv_line(columns))
        for row in rows:
            out.write(csv_line([_cell(row.get(c)) for c in columns]))
        return
    from faultlens.controller.report.render import render_table

    render_table(rows, columns, title=title, out=out, optional=optional)
