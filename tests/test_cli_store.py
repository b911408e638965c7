import csv
import datetime as dt
import io
import json
import subprocess
import sys

import pytest

from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main
from tests.conftest import REPO_ROOT


@pytest.fixture
def small_store(store_dir):
    now = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    with SegmentSink(store_dir) as sink:
        sink.write(
            "gpu_events",
            [
                {
                    "ts": now,
                    "node": "node-07",
                    "kind": "xid",
                    "code": 79,
                    "message": "GPU has fallen off the bus.",
                },
                {"ts": now, "node": "node-02", "kind": "xid", "code": 13, "message": "Graphics"},
            ],
        )
    return store_dir


def test_help_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("demo", "tables", "sql", "compact", "retention", "ingest"):
        assert command in out


@pytest.mark.parametrize(
    "command", [["tables"], ["sql", "SELECT 1"], ["compact"], ["retention", "--days", "3"]]
)
def test_nonexistent_store_is_one_line_exit_2(tmp_path, capsys, command):
    missing = tmp_path / "nope"
    code = main([*command[:1], "--store", str(missing), *command[1:]])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "no such directory" in err and str(missing) in err
    assert not missing.exists()


def test_store_path_that_is_a_file(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("x")
    assert main(["tables", "--store", str(path)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_store_path_from_subprocess_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "tables",
            "--store",
            str(tmp_path / "x"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip().startswith("faultlens tables: "
                                                                             "error:")


def test_sql_outputs(small_store, capsys):
    query = "SELECT node, code FROM gpu_events ORDER BY code DESC"
    assert main(["sql", "--store", str(small_store), query, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"node": "node-07", "code": 79},
        {"node": "node-02", "code": 13},
    ]
    assert main(["sql", "--store", str(small_store), query, "--csv"]) == 0
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [
        ["node", "code"],
        ["node-07", "79"],
        ["node-02", "13"],
    ]
    assert main(["sql", "--store", str(small_store), query]) == 0
    table = capsys.readouterr().out
    assert "node-07" in table and "79" in table


def test_bad_sql_is_one_line(small_store, capsys):
    assert main(["sql", "--store", str(small_store), "SELECT nope FROM gpu_events"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "query failed" in err


def test_store_from_environment(small_store, capsys, monkeypatch):
    monkeypatch.setenv("FAULTLENS_STORE", str(small_store))
    # the default is read when the parser is built
    assert main(["tables", "--json"]) == 0
    rows = {r["table"]: r["rows"] for r in json.loads(capsys.readouterr().out)}
    assert rows["gpu_events"] == 2 and rows["steps"] == 0


def test_compact_and_retention_commands(small_store, capsys):
    assert main(["compact", "--store", str(small_store)]) == 0
    # one segment per partition: nothing to merge
    assert "compacted 0 partitions" in capsys.readouterr().out
    assert main(["retention", "--store", str(small_store), "--days", "100000"]) == 0
    assert "removed 0 partitions" in capsys.readouterr().out
