import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.collectors.store.schema import (
    IDENTITY_FIELDS,
    METADATA_VERSION_KEY,
    SCHEMA_VERSION,
    TABLE_NAMES,
    SchemaError,
    rows_to_table,
    schema_for,
    validate,
)
from faultlens.collectors.store.sink import SegmentSink

DESIGN_TABLES = {
    "ranks",
    "gpu_samples",
    "gpu_events",
    "steps",
    "collectives",
    "process_events",
    "incidents",
    "decisions",
    "checkpoints",
    "heartbeats",
    "node_checks",
    "numerics",
}


def test_every_design_table_has_identity_columns_first():
    assert set(TABLE_NAMES) == DESIGN_TABLES
    for table in TABLE_NAMES:
        names = schema_for(table).names
        assert names[: len(IDENTITY_FIELDS)] == [f.name for f in IDENTITY_FIELDS]
        assert schema_for(table).field("ts").type == pa.timestamp("us", tz="UTC")


def test_wrong_column_type_names_table_and_column():
    batch = pa.table(
        {"ts": pa.array([0], pa.timestamp("ns", tz="UTC")), "code": pa.array(["seventy-nine"])}
    )
    with pytest.raises(SchemaError, match=r"table 'gpu_events': column 'code': expected int32, got "
                                          r"string"):
        validate("gpu_events", batch)


def test_unknown_column_and_unknown_table_and_missing_ts():
    ts = pa.array([0], pa.timestamp("ns", tz="UTC"))
    with pytest.raises(SchemaError, match="column 'bogus' is not in the schema"):
        validate("steps", pa.table({"ts": ts, "bogus": [1]}))
    with pytest.raises(SchemaError, match="unknown table 'stepz'"):
        validate("stepz", pa.table({"ts": ts}))
    with pytest.raises(SchemaError, match="column 'ts' is required"):
        validate("steps", pa.table({"step": [1]}))
    with pytest.raises(SchemaError, match="column 'ts': expected no nulls"):
        validate("steps", pa.table({"ts": pa.array([None], pa.timestamp("ns", tz="UTC"))}))


def test_naive_timestamps_are_refused_and_widths_are_cast():
    with pytest.raises(SchemaError, match="column 'ts': expected timestamp"):
        validate("steps", pa.table({"ts": pa.array([0], pa.timestamp("ns"))}))
    table = validate("steps", pa.table({"ts": pa.array([0], pa.timestamp("us", tz="UTC")),
                                         "step": pa.array([7], pa.int8())}))
    assert table.schema.field("step").type == pa.int64()
    assert table.column("step").to_pylist() == [7]
    assert table.column("rank").null_count == 1


def test_rows_with_bad_value_name_the_column():
    now = dt.datetime.now(dt.UTC)
    with pytest.raises(SchemaError, match="table 'steps': column 'step'"):
        rows_to_table("steps", [{"ts": now, "step": "twelve"}])
    with pytest.raises(SchemaError, match="column 'stepp' is not in the schema"):
        rows_to_table("steps", [{"ts": now, "stepp": 1}])


def test_sink_refuses_bad_batch_and_keeps_buffered_rows(store_dir):
    now = dt.datetime.now(dt.UTC)
    sink = SegmentSink(store_dir, flush_rows=1000)
    sink.write("steps", [{"ts": now, "step": 1, "node": "n"}])
    with pytest.raises(SchemaError):
        sink.write("steps", pa.table({"ts": pa.array([now]), "step": pa.array(["x"])}))
    assert sink.pending_rows("steps") == 1
    (result,) = sink.flush("steps")
    assert result.rows == 1


def test_schema_version_in_parquet_metadata(store_dir):
    now = dt.datetime.now(dt.UTC)
    with SegmentSink(store_dir) as sink:
        sink.write("gpu_events", [{"ts": now, "node": "n1", "kind": "xid", "code": 79}])
    (path,) = list(store_dir.rglob("*.parquet"))
    metadata = pq.read_schema(path).metadata
    assert metadata[METADATA_VERSION_KEY] == SCHEMA_VERSION.encode()
    assert metadata[b"faultlens.table"] == b"gpu_events"
