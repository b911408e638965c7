"""How the CLI shows rows: literally (cell text is never read as markup) and within the output's
width.

The one function a command calls is `render_table(rows, columns=None, *, title=None, out=None,
width=None)`:

- every cell is shown as its own text (`[rank0]: Traceback` stays `[rank0]: Traceback`; no rich
  markup, no highlighting, no emoji codes);
- the table fits the width: the terminal's when `out` is a terminal, else $COLUMNS, else 80 (a pipe,
  a log file);
- each column gets at least a readable width (its header's longest word, at least MIN_COLUMN
  characters, or its widest cell when that is narrower); times, numbers and identifiers (a column
  named as one: job, incident_id, node, ts...) get their whole width and are never folded: they are
  the strings users copy. When the columns cannot all get that, the caller's optional columns are
  left out first (with a note), then the rows are shown one record at a time, `key : value` lines
  (a vertical record view, like psql's \\x), instead of a table folded one word per line;
- a cell longer than a table cell can reasonably hold is cut with an ellipsis and a note says so
  (--json and --csv always have the whole text); multi-line cells keep at most MAX_CELL_LINES lines
  in a table.

`render_record(record, ...)` shows one mapping as `key : value` lines; `render_text(text, ...)`
writes a paragraph folded at word boundaries to the same width. All three write plain text when
`out` is not a terminal.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import os
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

DEFAULT_WIDTH = 80
MIN_COLUMN = 10
MAX_CELL_LINES = 4
MAX_RECORD_CHARS = 4000
ELLIPSIS = "…"


def output_width(out: TextIO | None = None) -> int:
    """Columns to fit: the terminal's when `out` is one, else $COLUMNS, else 80."""
    out = out or sys.stdout
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= 20:
        return int(columns)
    try:
        if out.isatty():
            return max(20, os.get_terminal_size(out.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        pass
    return DEFAULT_WIDTH


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def cell_text(value: Any) -> str:
    """The text of one cell: '' for null/NaN, JSON for lists and mappings, ISO for times, str()
    otherwise.
    """
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _fold(text: str, width: int) -> list[str]:
    """Fold text at word boundaries (breaking words longer than the width), keeping its own line
    breaks.
    """
    lines: list[str] = []
    for line in text.expandtabs(4).splitlines() or [""]:
        lines.extend(
            textwrap.wrap(
                line,
                width=max(1, width),
                break_long_words=True,
                break_on_hyphens=False,
                replace_whitespace=False,
                drop_whitespace=True,
            )
            or [""]
        )
    return lines


#: a column whose name ends so holds strings users copy (ids, names, times): never folded
IDENTIFIER_SUFFIXES = (
    "id",
    "ids",
    "uuid",
    "job",
    "incident",
    "decision",
    "node",
    "nodes",
    "ts",
    "time",
    "fingerprint",
    "hook",
    "uri",
    "path",
    "start",
    "end",
    "at",
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool)


def _whole(column: str, values: Sequence[Any], texts: Sequence[str]) -> bool:
    """Cells shown whole, never folded: times, numbers, and the identifiers of a column named as
    one (job ids, incident ids, nodes: the strings users copy), when they hold no spaces."""
    present = [(v, t) for v, t in zip(values, texts, strict=True) if t]
    if not present:
        return False
    if all(isinstance(v, (dt.datetime, dt.date, dt.time)) or _is_number(v) for v, _ in present):
        return True
    words = re.split(r"[^a-z]+", str(column).lower().strip())
    named = bool(words) and words[-1] in IDENTIFIER_SUFFIXES
    return named and all(len(t.split()) == 1 and "\n" not in t for _, t in present)


def _min_width(header: str, cells: Sequence[str], whole: bool = False) -> int:
    widest = max((max((len(line) for line in c.splitlines()), default=0) for c in cells), default=0)
    header_word = max((len(word) for word in header.split()), default=0)
    if whole:
        return max(widest, header_word)
    natural = max(len(header), widest)
    readable = max(MIN_COLUMN, header_word)
    return min(natural, readable)


def _console(out: TextIO, width: int):
    from rich.console import Console

    return Console(
        file=out, width=width, markup=False, highlight=False, emoji=False, soft_wrap=False
    )


def render_text(
    text: str,
    *,
    out: TextIO | None = None,
    width: int | None = None,
    indent: str = "",
    hanging: str = "",
    break_words: bool = True,
) -> None:
    """Write a paragraph literally, folded at word boundaries to the width (`hanging` indents the
    folded lines; `break_words=False` keeps a word longer than the width whole, e.g. a path to
    copy)."""
    out = out or sys.stdout
    width = width or output_width(out)
    for i, line in enumerate(text.splitlines() or [""]):
        first = indent if i == 0 else indent + hanging
        folded = textwrap.wrap(
            line,
            width=max(20, width),
            initial_indent=first,
            subsequent_indent=indent + hanging,
            break_long_words=break_words,
            break_on_hyphens=False,
        )
        out.write("\n".join(folded or [first]) + "\n")
    out.flush()


def _record_lines(
    record: Mapping[str, Any], width: int, whole: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    keys = [str(k) for k in record]
    key_width = min(max((len(k) for k in keys), default=0), max(8, width // 3))
    value_width = max(10, width - key_width - 3)
    lines: list[str] = []
    for key, value in record.items():
        text = cell_text(value)
        if len(text) > MAX_RECORD_CHARS:
            text = text[:MAX_RECORD_CHARS] + f"{ELLIPSIS} ({len(text)} characters in all)"
        name = str(key)
        if len(name) > key_width:
            lines.append(name)
            name = ""
        folded = [text] if str(key) in whole else _fold(text, value_width)
        lines.append(f"{name:<{key_width}} : {folded[0]}".rstrip())
        lines.extend(f"{'':<{key_width}}   {line}".rstrip() for line in folded[1:])
    return lines


def render_record(
    record: Mapping[str, Any],
    *,
    title: str | None = None,
    out: TextIO | None = None,
    width: int | None = None,
) -> None:
    """One mapping as `key : value` lines, values folded to the width."""
    out = out or sys.stdout
    width = width or output_width(out)
    if title:
        render_text(title, out=out, width=width)
    out.write("\n".join(_record_lines(record, width)) + "\n")
    out.flush()


def _cut(text: str, column_width: int) -> tuple[str, bool]:
    """At most MAX_CELL_LINES lines of the text folded to the column's width; True when something
    was cut.
    """
    lines = _fold(text, column_width)
    if len(lines) <= MAX_CELL_LINES:
        return text, False
    return "\n".join(lines[:MAX_CELL_LINES]).rstrip()[:-1] + ELLIPSIS, True


def _printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


def _plain_box(
    columns: Sequence[str], texts: Sequence[Sequence[str]], width: int, out: TextIO
) -> str | None:
    """The table as rich draws it (box.HEAVY_HEAD, one space of padding, left-justified) when that
    takes no measuring: output that is not a terminal (no styles), every header and cell one line
    of printable ASCII, the natural widths within `width`. None otherwise (rich draws it). Saves a
    short command rich's import (~a fifth of a `faultlens sql` start)."""
    try:
        if out.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    headers = [str(c) for c in columns]
    if not all(_printable(h) for h in headers) or not all(
        _printable(t) for row in texts for t in row
    ):
        return None
    widths = [max([len(h), *(len(row[i]) for row in texts)]) for i, h in enumerate(headers)]
    if sum(widths) + 3 * len(widths) + 1 > width:
        return None

    def line(left: str, fill: str, cross: str, right: str) -> str:
        return left + cross.join(fill * (w + 2) for w in widths) + right + "\n"

    def cells(edge: str, values: Sequence[str]) -> str:
        return edge + edge.join(f" {v:<{w}} " for v, w in zip(values, widths, strict=True)) + (
            edge + "\n"
        )

    parts = [line("┏", "━", "┳", "┓"), cells("┃", headers), line("┡", "━", "╇", "┩")]
    parts += [cells("│", row) for row in texts]
    parts.append(line("└", "─", "┴", "┘"))
    return "".join(parts)


def render_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
    out: TextIO | None = None,
    width: int | None = None,
    optional: Sequence[str] = (),
) -> None:
    """Show rows as a table that fits the width, or as vertical records when it cannot (see the
    module doc). Identifiers, times and numbers are never folded: when the columns do not fit, the
    `optional` columns are left out first (in the order given, with a note), then the rows are shown
    as records."""
    out = out or sys.stdout
    width = width or output_width(out)
    rows = list(rows)
    columns = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    if not columns:
        if title:
            render_text(title, out=out, width=width)
        out.write("(no rows)\n")
        return
    texts = [[cell_text(row.get(c)) for c in columns] for row in rows]
    whole = [
        _whole(c, [row.get(c) for row in rows], [t[i] for t in texts])
        for i, c in enumerate(columns)
    ]
    minimums = [_min_width(str(c), [t[i] for t in texts], whole[i]) for i, c in enumerate(columns)]
    left_out: list[str] = []
    for name in optional:
        if sum(minimums) + 3 * len(columns) + 1 <= width:
            break
        if name in columns and len(columns) > 1:
            i = columns.index(name)
            left_out.append(name)
            for seq in (columns, whole, minimums):
                del seq[i]
            for t in texts:
                del t[i]
    frame = 3 * len(columns) + 1
    if sum(minimums) + frame > width:
        if title:
            render_text(title, out=out, width=width)
        if not rows:
            out.write("(no rows)\n")
        keep = {c for c, w in zip(columns, whole, strict=True) if w}
        for n, row in enumerate(rows, 1):
            label = f"-[ {n} ]"
            out.write(label + "-" * max(0, min(width, 40) - len(label)) + "\n")
            out.write(
                "\n".join(_record_lines({c: row.get(c) for c in columns}, width, keep)) + "\n"
            )
        out.flush()
        return
    plain = _plain_box(columns, texts, width, out)
    if plain is not None:
        if title:
            render_text(title, out=out, width=width)
        out.write(plain)
        if left_out:
            render_text(
                f"(left out to fit {width} columns: {', '.join(left_out)}; --json or --csv "
                "show every column)",
                out=out,
                width=width,
            )
        out.flush()
        return
    from rich.table import Table
    from rich.text import Text

    share = (width - frame) // len(columns)
    cut_any = False
    if title:
        render_text(title, out=out, width=width)
    table = Table(expand=False)
    for column, minimum, kept in zip(columns, minimums, whole, strict=True):
        if kept:
            table.add_column(Text(str(column)), no_wrap=True, min_width=minimum)
        else:
            table.add_column(Text(str(column)), overflow="fold", min_width=minimum)
    for row_texts in texts:
        cells = []
        for i, text in enumerate(row_texts):
            if whole[i]:
                cells.append(Text(text))
                continue
            kept_text, cut = _cut(text, max(minimums[i], share))
            cut_any = cut_any or cut
            cells.append(Text(kept_text))
        table.add_row(*cells)
    console = _console(out, width)
    console.print(table)
    if left_out:
        render_text(
            f"(left out to fit {width} columns: {', '.join(left_out)}; --json or --csv "
            "show every column)",
            out=out,
            width=width,
        )
    if cut_any:
        render_text(
            f"(long cells cut to {MAX_CELL_LINES} lines: --json or --csv show the whole text)",
            out=out,
            width=width,
        )
    out.flush()
