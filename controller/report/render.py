"""How the CLI shows rows: literally (cell text is never read as markup) and within the output's
width.

The one function a command calls is `render_table(rows, columns=None, *, title=None, out=None,
width=None)`:

- every cell is shown as its own text (`[rank0]: Traceback` stays `[rank0]: Traceback`; no rich
  markup, no highlighting, no emoji codes);
- the table fits the width: the terminal's when `out` is a terminal, else $COLUMNS, else 80 (a pipe,
  a log file);
- each column gets at least a readable width (its header's longest word, at least MIN_COLUMN
  characters, or its widest cell when that is narrower); when the columns cannot all get that, the
  rows are shown one record at a time, `key : value` lines (a vertical record view, like psql's
  \\x), instead of a table folded one word per line;
- a cell longer than a table cell can reasonably hold is cut with an ellipsis and a note says so
  (--json and --csv always have the whole text); multi-line cells keep at most MAX_CELL_LINES lines
  in a table.

`render_record(record, ...)` shows one mapping as `key : value` lines; `render_text(text, ...)`
writes a paragraph folded at word boundaries to the same width. All three write plain text when
`out` is not a terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
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


def _min_width(header: str, cells: Sequence[str]) -> int:
    natural = max(
        [len(header), *(max((len(line) for line in c.splitlines()), default=0) for c in cells)]
    )
    readable = max(MIN_COLUMN, max((len(word) for word in header.split()), default=0))
    return min(natural, readable)


def _console(out: TextIO, width: int):
    from rich.console import Console

    return Console(
        file=out, width=width, markup=False, highlight=False, emoji=False, soft_wrap=False
    )


def render_text(text: str, *, out: TextIO | None = None, width: int | None = None, indent: str = "",
                hanging: str = "", break_words: bool = True) -> None:
    """Write a paragraph literally, folded at word boundaries to the width (`hanging` indents the
    folded lines; `break_words=False` keeps a word longer than the width whole, e.g. a path to
    copy)."""
    out = out or sys.stdout
    width = width or output_width(out)
    for i, line in enumerate(text.splitlines() or [""]):
        first = indent if i == 0 else indent + hanging
        folded = textwrap.wrap(line, width=max(20, width), initial_indent=first,
                               subsequent_indent=indent + hanging, break_long_words=break_words,
                               break_on_hyphens=False)
        out.write("\n".join(folded or [first]) + "\n")
    out.flush()


def _record_lines(record: Mapping[str, Any], width: int) -> list[str]:
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
        folded = _fold(text, value_width)
        lines.append(f"{name:<{key_width}} : {folded[0]}".rstrip())
        lines.extend(f"{'':<{key_width}}   {line}".rstrip() for line in folded[1:])
    return lines


def render_record(record: Mapping[str, Any], *, title: str | None = None, out: TextIO | None = None,
                  width: int | None = None) -> None:
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


def render_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
    out: TextIO | None = None,
    width: int | None = None,
) -> None:
    """Show rows as a table that fits the width, or as vertical records when it cannot (see the
    module doc).
    """
    out = out or sys.stdout
    width = width or output_width(out)
    rows = list(rows)
    columns = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    texts = [[cell_text(row.get(c)) for c in columns] for row in rows]
    if not columns:
        if title:
            render_text(title, out=out, width=width)
        out.write("(no rows)\n")
        return
    minimums = [_min_width(str(c), [t[i] for t in texts]) for i, c in enumerate(columns)]
    frame = 3 * len(columns) + 1
    if sum(minimums) + frame > width:
        if title:
            render_text(title, out=out, width=width)
        if not rows:
            out.write("(no rows)\n")
        for n, row in enumerate(rows, 1):
            label = f"-[ {n} ]"
            out.write(label + "-" * max(0, min(width, 40) - len(label)) + "\n")
            out.write("\n".join(_record_lines({c: row.get(c) for c in columns}, width)) + "\n")
        out.flush()
        return
    from rich.table import Table
    from rich.text import Text

    share = (width - frame) // len(columns)
    cut_any = False
    if title:
        render_text(title, out=out, width=width)
    table = Table(expand=False)
    for column, minimum in zip(columns, minimums, strict=True):
        table.add_column(Text(str(column)), overflow="fold", min_width=minimum)
    for row_texts in texts:
        cells = []
        for i, text in enumerate(row_texts):
            kept, cut = _cut(text, max(minimums[i], share))
            cut_any = cut_any or cut
            cells.append(Text(kept))
        table.add_row(*cells)
    console = _console(out, width)
    console.print(table)
    if cut_any:
        render_text(f"(long cells cut to {MAX_CELL_LINES} lines: --json or --csv show the whole "
                    "text)",
                    out=out, width=width)
    out.flush()
