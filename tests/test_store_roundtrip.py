"""Rows written through the sink come back through DuckDB identical: types, nulls, tz timestamps,
lists, maps.
"""

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.schema import TABLE_NAMES, rows_to_table, schema_for
from faultlens.collectors.store.sink import SegmentSink
from tests.rowgen import make_rows


def _sorted(table: pa.Table) -> pa.Table:
    # (ts, text column) is unique in generated rows; sort both sides the same way
    return table.sort_by([("ts", "ascending")])


@pytest.mark.parametrize("table", TABLE_NAMES)
def test_round_trip_every_table(store_dir, table):
    rows = make_rows(table, 60, seed=hash(table) % 1000)
    expected = rows_to_table(table, rows)
    with SegmentSink(store_dir, flush_rows=25) as sink:  # several flushes, several partitions
        for start in range(0, len(rows), 7):
            sink.write(table, rows[start:start + 7])
    with Store(store_dir) as store:
        got = store.read_table(table)
    assert got.num_rows == expected.num_rows
    schema = schema_for(table)
    for field in schema:
        got_type = got.schema.field(field.name).type
        if pa.types.is_timestamp(field.type):
            assert got_type.unit == "us" and got_type.tz in ("UTC", "Etc/UTC"), (
                field.name,
                got_type,
            )
        else:
            assert got_type.equals(field.type), (field.name, got_type, field.type)
    got = got.cast(schema.remove_metadata())
    assert _sorted(got).equals(_sorted(expected.cast(schema.remove_metadata()))), table


def test_partition_layout_and_pruning(store_dir):
    rows = make_rows("steps", 30, seed=3, null_every=0)
    with SegmentSink(store_dir) as sink:
        sink.write("steps", rows)
    dirs = sorted(
        {p.parent.relative_to(store_dir).as_posix() for p in store_dir.rglob("*.parquet")}
    )
    assert all(d.startswith("steps/job=job-") and "/date=2026-11-30/node=node-0" in d for d in dirs)
    assert len(dirs) == 2 * 3  # 2 jobs x 3 nodes, one date
    with Store(store_dir, jobs=["job-1"], nodes=["node-02"]) as store:
        got = store.query("SELECT DISTINCT job_id, node FROM steps").to_pylist()
    assert got == [{"job_id": "job-1", "node": "node-02"}]
    with Store(store_dir, date_from="2026-12-01") as store:
        assert store.query("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 0}]


def test_older_segment_with_fewer_columns_still_reads(store_dir):
    """A segment written by an older schema (fewer columns) reads with nulls in the new columns."""
    now = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    old = pa.table(
        {
            "ts": pa.array([now], pa.timestamp("ns", tz="UTC")),
            "node": ["n1"],
            "job_id": ["j"],
            "step": pa.array([5], pa.int64()),
        }
    )
    directory = store_dir / "steps" / "job=j" / "date=2026-11-30" / "node=n1"
    directory.mkdir(parents=True)
    pq.write_table(old, directory / "00000000000000000001-old.parquet")
    with SegmentSink(store_dir) as sink:
        sink.write("steps", [{"ts": now, "node": "n1", "job_id": "j", "step": 6, "loss": 1.5}])
    with Store(store_dir) as store:
        got = store.query("SELECT step, loss, sections FROM steps ORDER BY step").to_pylist()
    assert got == [
        {"step": 5, "loss": None, "sections": None},
        {"step": 6, "loss": 1.5, "sections": None},
    ]


def test_empty_store_has_every_view(store_dir):
    with Store(store_dir) as store:
        for summary in store.summary():
            assert summary.rows == 0
        assert store.query("SELECT * FROM incidents").schema.names == schema_for("incidents").names


def test_temporary_files_are_invisible(store_dir):
    now = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    with SegmentSink(store_dir) as sink:
        sink.write("steps", [{"ts": now, "node": "n1", "step": 1}])
    (segment,) = list(store_dir.rglob("*.parquet"))
    (segment.parent / f".{segment.name}.123.tmp").write_bytes(b"PAR1 half a file")
    with Store(store_dir) as store:
        assert store.query("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 1}]


def test_segments_dictionary_encode_strings_only(store_dir):
    """String leaves (node, phase, the section names of the map) are dictionary encoded; numbers are
    written plain (a dictionary of mostly distinct floats costs twice the encoding time and ends
    larger after zstd)."""
    rows = make_rows("steps", 40, seed=5, null_every=0)
    with SegmentSink(store_dir) as sink:
        sink.write("steps", rows)
    segment = next(store_dir.rglob("*.parquet"))
    meta = pq.ParquetFile(segment).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    dictionary = {path for path, found in encodings.items() if "RLE_DICTIONARY" in found}
    assert {"node", "job_id", "phase", "sections.key_value.key"} <= dictionary
    assert not {"duration_s", "sections.key_value.value", "step", "ts"} & dictionary
