"""`--csv` output: records end in a plain "\\n" (a shell's `$(...)` and `read` get the value, not
the value and a carriage return), and every cell survives a round trip through Python's csv reader
and DuckDB's read_csv, whatever it holds (commas, quotes, CR, LF, CRLF, leading spaces, nothing)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import subprocess
import sys

import duckdb
import pytest

from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main
from tests.conftest import REPO_ROOT

MESSAGES = [
    "plain",
    "a, comma",
    'a "quoted" word',
    "carriage\rreturn",
    "two\nlines",
    "windows\r\nline",
    "trailing newline\n",
    "  leading spaces",
    "ünïcödé ✓",
    "",
    "[rank0]: Traceback (most recent call last):",
]


@pytest.fixture
def message_store(store_dir):
    now = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    rows = [
        {
            "ts": now + dt.timedelta(seconds=i),
            "node": f"node-{i % 3}",
            "job_id": "job-csv",
            "rank": i,
            "kind": "comm_error",
            "message": text,
        }
        for i, text in enumerate(MESSAGES)
    ]
    with SegmentSink(store_dir) as sink:
        sink.write("process_events", rows)
    return store_dir


def _records_end_in_lf(text: str) -> bool:
    """No "\\r" outside a quoted field."""
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif ch == "\r" and not quoted:
            return False
    return not quoted and text.endswith("\n") and not text.endswith("\r\n")


def test_sql_csv_round_trips_every_cell_with_plain_newlines(message_store, capsys, tmp_path):
    query = "SELECT rank, node, message FROM process_events ORDER BY rank"
    assert main(["sql", "--store", str(message_store), "--csv", query]) == 0
    out = capsys.readouterr().out
    assert _records_end_in_lf(out), repr(out)
    rows = list(csv.reader(io.StringIO(out, newline="")))
    assert rows[0] == ["rank", "node", "message"]
    assert [r[2] for r in rows[1:]] == MESSAGES
    assert [int(r[0]) for r in rows[1:]] == list(range(len(MESSAGES)))
    # another reader of the same file: DuckDB's
    path = tmp_path / "out.csv"
    path.write_text(out, encoding="utf-8", newline="")
    con = duckdb.connect()
    try:
        read = con.execute(
            "SELECT message FROM read_csv(?, header=true, quote='\"', escape='\"', "
            "all_varchar=true) ORDER BY CAST(rank AS INT)",
            [str(path)],
        ).fetchall()
    finally:
        con.close()
    assert [m or "" for (m,) in read] == MESSAGES


@pytest.mark.parametrize(
    "cells, line",
    [
        (["a", "b"], "a,b\n"),
        ([""], '""\n'),
        (["", ""], ",\n"),
        (["x\ry"], '"x\ry"\n'),
        (['say "hi"', "1,2"], '"say ""hi""","1,2"\n'),
    ],
)
def test_csv_line_quotes_what_must_be_quoted(cells, line):
    from faultlens.controller.cli.common import csv_line

    assert csv_line(cells) == line
    assert list(csv.reader(io.StringIO(line, newline=""))) == [cells]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "faultlens.controller.cli.main", *args]


def test_csv_value_in_a_shell_substitution(message_store):
    """What a shell script does with the output: the last line's value, compared as a string."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    script = (
        'n=$("$@" | tail -n 1); '
        'if [ "$n" = "11" ]; then echo same; else printf "%s" "$n" | od -c; exit 1; fi'
    )
    query = "SELECT count(*) AS n FROM process_events"
    proc = subprocess.run(
        ["bash", "-c", script, "sh", *_cli("sql", "--store", str(message_store), "--csv", query)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "same", proc.stdout + proc.stderr
    # line by line, as `while IFS=, read -r ...` reads it: no field ends in a carriage return
    script = '"$@" | { read -r header; while IFS=, read -r rank node; do echo "[$node]"; done; }'
    query = "SELECT rank, node FROM process_events ORDER BY rank"
    proc = subprocess.run(
        ["bash", "-c", script, "sh", *_cli("sql", "--store", str(message_store), "--csv", query)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [f"[node-{i % 3}]" for i in range(len(MESSAGES))]


def test_every_csv_command_ends_records_in_lf(message_store, capsys):
    assert main(["tables", "--store", str(message_store), "--csv"]) == 0
    out = capsys.readouterr().out
    assert _records_end_in_lf(out) and out.startswith("table,rows,")
    assert main(["decisions", "--store", str(message_store), "--csv"]) == 0
    out = capsys.readouterr().out
    assert _records_end_in_lf(out) or out == ""
