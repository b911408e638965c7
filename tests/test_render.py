"""The CLI's tables: cell text shown literally (never read as markup), output fitted to 80 columns
in a pipe, a vertical record view for rows too wide for a table, SQL errors with DuckDB's hints."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest

from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main
from faultlens.controller.report.render import render_record, render_table

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
        "by peer "
        "[127.0.0.1]:44313")
MARKUP_FAMILY = [
    "[rank0]: Traceback (most recent call last):",
    GLOO,
    "[/bold] stray closing tag",
    "[bold]x[/]",
    "[red]not red[/red]",
    ":warning: no emoji",
    "[link=http://x]y[/link]",
    "\\[escaped]",
    "[[0, 1]]",
    "[E ProcessGroupGloo.cpp:144] Rank 1 [127.0.0.1]:1 timed out",
]


def _lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


@pytest.mark.parametrize("text", MARKUP_FAMILY)
def test_cells_and_titles_render_literally(text):
    out = io.StringIO()
    render_table([{"message": text, "n": 1}], title=text, out=out, width=200)
    shown = out.getvalue()
    assert shown.count(text) == 2  # the title and the cell, as written


@pytest.fixture
def events_store(store_dir):
    now = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    rows = [
        {
            "ts": now + dt.timedelta(seconds=i),
            "node": "node-1",
            "job_id": "j",
            "rank": i,
            "kind": "comm_error",
            "message": text,
        }
        for i, text in enumerate(MARKUP_FAMILY)
    ]
    with SegmentSink(store_dir) as sink:
        sink.write("process_events", rows)
    return store_dir


def test_sql_shows_brackets_literally(events_store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["sql", "--store", str(events_store), "SELECT '[rank0]: Traceback' AS m"]) == 0
    assert "[rank0]: Traceback" in capsys.readouterr().out
    assert main(["sql", "--store", str(events_store), "SELECT rank, message FROM process_events "
                                                      "ORDER BY rank"]) == 0
    out = capsys.readouterr().out
    # the table folds long cells; the text is all there
    squeezed = "".join(c for c in out if c not in " │┃\n")
    for text in MARKUP_FAMILY:
        assert text.replace(" ", "") in squeezed
    assert max(len(line) for line in _lines(out)) <= 80


def _demo_rows(n: int) -> list[dict]:
    return [
        {
            "attempt": i,
            "nodes": "node-0,node-1",
            "injected fault": "straggler: rank 3's GPU "
            "overheats, computes "
            "250 ms slower from step 6",
            "incident": "straggler / thermal",
            "culprit": "node-1 rank 3",
            "decision": "failover (exclude node-1)",
            "resumed from": "step 10 (local+durable)",
            "lost steps": 3,
            "seconds": 15.2,
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("width", [40, 60, 80, 100, 132])
@pytest.mark.parametrize("columns", [2, 5, 9])
def test_every_line_fits_and_no_word_per_line_columns(width, columns):
    rows = [{k: v for k, v in list(row.items())[:columns]} for row in _demo_rows(5)]
    out = io.StringIO()
    render_table(
        rows,
        title="a title that is long enough to be folded when the width is small " * 2,
        out=out,
        width=width,
    )
    lines = _lines(out.getvalue())
    assert max(len(line) for line in lines) <= width
    # the old tables squeezed 9 columns into 80 by breaking words ("stragg|ler", "overhe|ats"):
    # words up to 10 characters stay whole
    for token in ("straggler", "overheats", "failover", "thermal", "attempt"):
        if any(token in str(v) for row in rows for v in [*row.values(), *row]):
            assert token in out.getvalue(), out.getvalue()


def test_wide_rows_become_vertical_records_with_every_value():
    out = io.StringIO()
    render_table(_demo_rows(2), out=out, width=80)
    text = out.getvalue()
    assert "-[ 1 ]" in text and "-[ 2 ]" in text
    assert "injected fault : straggler: rank 3's GPU overheats" in text


def test_long_cells_are_cut_with_a_note_and_record_view_keeps_them():
    long = "x" * 50 + " " + "word " * 200
    out = io.StringIO()
    render_table([{"a": 1, "b": long}], out=out, width=80)
    assert "…" in out.getvalue() and "--json" in out.getvalue()
    assert max(len(line) for line in _lines(out.getvalue())) <= 80
    record = io.StringIO()
    render_record({"b": long}, out=record, width=80)
    assert record.getvalue().count("word") == 200


def test_empty_and_null_cells():
    out = io.StringIO()
    render_table(
        [{"a": None, "b": float("nan"), "c": [1, 2], "d": {"k": "[v]"}}], out=out, width=80
    )
    assert '[1, 2]' in out.getvalue() and '{"k": "[v]"}' in out.getvalue()
    none = io.StringIO()
    render_table([], ["a"], title="t", out=none, width=80)
    assert "t" in none.getvalue()


@pytest.mark.parametrize(("query", "hint"), [
    ("SELECT mesage FROM process_events", 'Candidate bindings: "message"'),
    ("SELECT * FROM proces_events", 'Did you mean "process_events"'),
    ("SELECT lenght(message) FROM process_events", 'Did you mean "length"'),
])
def test_sql_errors_keep_duckdb_hints(events_store, capsys, query, hint):
    assert main(["sql", "--store", str(events_store), query]) == 2
    err = capsys.readouterr().err
    assert hint in err
    assert err.count("\n") == 1  # still one line


def test_json_output_is_untouched(events_store, capsys):
    assert (
        main(["sql", "--store", str(events_store), "--json", "SELECT message FROM process_events"])
        == 0
    )
    assert [r["message"] for r in json.loads(capsys.readouterr().out)] == MARKUP_FAMILY


def test_help_and_sql_import_no_heavy_library(events_store):
    """`faultlens --help` and `faultlens sql` import only what they run (the start-up bench measures
    the time).
    """
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    heavy = ("torch", "sklearn", "numba", "opentelemetry", "pandas", "scipy")
    probe = ("import runpy, sys; sys.argv = ['faultlens', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('faultlens.controller.cli.main', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             f"print('LOADED', [m for m in {heavy!r} if m in sys.modules], file=sys.stderr)")
    for argv in (["--help"], ["sql", "--store", str(events_store), "SELECT count(*) FROM "
                                                                   "process_events"]):
        proc = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        )
        assert "LOADED []" in proc.stderr, (argv, proc.stderr[-2000:])
        assert proc.stdout.strip()
