"""The plain table path (no rich import) draws exactly what rich draws, for the tables it takes:
many shapes (columns, rows, empty cells and headers, spaces, numbers, times, widths up to the
limit), each compared with rich's own output of the same rows; a table it does not take (a wide
cell, non-ASCII, several lines, a terminal) still goes to rich."""

from __future__ import annotations

import datetime as dt
import io
import random
import string

import pytest

from faultlens.controller.report import render
from faultlens.controller.report.render import render_table


def _both(rows, columns, width, monkeypatch, title=None, optional=()):
    plain = io.StringIO()
    render_table(rows, columns, out=plain, width=width, title=title, optional=optional)
    with monkeypatch.context() as patch:
        patch.setattr(render, "_plain_box", lambda *args: None)
        rich = io.StringIO()
        render_table(rows, columns, out=rich, width=width, title=title, optional=optional)
    return plain.getvalue(), rich.getvalue()


def _word(rng: random.Random, longest: int) -> str:
    alphabet = string.ascii_letters + string.digits + " -_./:[]()=,"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


@pytest.mark.parametrize("seed", range(60))
def test_plain_box_is_rich_table(seed, monkeypatch):
    rng = random.Random(seed)
    ncols = rng.randint(1, 6)
    columns = [_word(rng, 8) or f"c{i}" for i in range(ncols)]
    columns = list(dict.fromkeys(columns))
    rows = []
    for _ in range(rng.randint(0, 7)):
        row = {}
        for column in columns:
            kind = rng.random()
            if kind < 0.2:
                row[column] = rng.randint(-(10**6), 10**9)
            elif kind < 0.3:
                row[column] = rng.random() * 1000
            elif kind < 0.4:
                row[column] = None
            elif kind < 0.5:
                row[column] = dt.datetime(2026, 12, 7, rng.randint(0, 23), tzinfo=dt.UTC)
            else:
                row[column] = _word(rng, 14)
        rows.append(row)
    width = rng.choice([40, 80, 120])
    optional = rng.sample(columns, rng.randint(0, len(columns)))
    plain, rich = _both(
        rows, columns, width, monkeypatch, title=rng.choice([None, "store x"]), optional=optional
    )
    assert plain == rich


def test_select_one_and_header_only(monkeypatch):
    for rows, columns in (([{"1": 1}], None), ([], ["a", "bb"]), ([{"": "q", "z": ""}], None)):
        plain, rich = _both(rows, columns, 80, monkeypatch)
        assert plain == rich


def test_tables_the_plain_path_leaves_to_rich(monkeypatch):
    wide = [{"message": "x" * 100, "n": 1}]
    other = [{"node": "nöde-1", "n": 1}, {"node": "a\nb", "n": 2}]
    for rows in (wide, other):
        assert (
            render._plain_box(
                list(rows[0]), [[str(v) for v in r.values()] for r in rows], 80, io.StringIO()
            )
            is None
        )
        plain, rich = _both(rows, None, 80, monkeypatch)
        assert plain == rich

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert render._plain_box(["a"], [["1"]], 80, Terminal()) is None
    assert render._plain_box(["a"], [["1"]], 80, io.StringIO()) is not None
