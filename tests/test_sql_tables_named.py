"""`faultlens sql` binds only the tables its query names: a query naming a table reads its rows,
one naming none runs, the catalog queries see every table, and a misspelt table still gets
DuckDB's own hint (the rest bound and the query run again)."""

from __future__ import annotations

import json

from faultlens.attribution.reading.store import tables_named
from faultlens.collectors.store.schema import TABLE_NAMES
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.cli.main import main


def test_tables_named():
    assert tables_named("select 1") == []
    assert tables_named('SELECT count(*) FROM "Steps" s JOIN ranks USING (rank)') == [
        t for t in TABLE_NAMES if t in ("steps", "ranks")
    ]
    assert tables_named("select * from steps_x") == []
    for sql in (
        "show tables",
        "SELECT * FROM information_schema.tables",
        "describe steps",
        "select * from duckdb_views()",
    ):
        assert tables_named(sql) == list(TABLE_NAMES), sql


def test_sql_on_named_tables_and_the_hint(tmp_path, capsys):
    store = tmp_path / "store"
    with SegmentSink(str(store)) as sink:
        sink.write(
            "steps",
            [
                {
                    "ts": 1_764_460_800_000_000_000 + i,
                    "node": "n1",
                    "job_id": "j",
                    "rank": i,
                    "step": i,
                }
                for i in range(5)
            ],
        )
    assert main(["sql", "--json", "--store", str(store), "select sum(step) AS s FROM steps"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"s": 10}]
    assert main(["sql", "--json", "--store", str(store), "select 41 + 1 AS x"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"x": 42}]
    assert main(["sql", "--json", "--store", str(store), "show tables"]) == 0
    names = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert set(TABLE_NAMES) <= names
    assert main(["sql", "--store", str(store), "select * from step"]) != 0
    err = capsys.readouterr().err
    assert 'Did you mean "steps"' in err and len(err.strip().splitlines()) == 1
