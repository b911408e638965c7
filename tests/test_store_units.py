"""Timestamps are UTC microseconds in the store (schema version 2); version-1 segments hold
nanoseconds, written by pyarrow exactly as the old sink wrote them (validate() against the ns
schema, then write_segment). A store that mixes both reads as microseconds everywhere: the DuckDB
views (local files and the pyarrow-dataset path of object stores), the follower's segment tail,
segment checks, compaction; detectors' frames stay nanoseconds."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.attribution.reading.maintenance import compact
from faultlens.attribution.reading.segment_check import check_segment, inspect_segment
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.tail import SegmentTail
from faultlens.attribution.reading.telemetry import to_frame
from faultlens.collectors.store.layout import partition_dir, resolve_store, write_segment
from faultlens.collectors.store.schema import (
    METADATA_VERSION_KEY,
    rows_to_table,
    schema_for,
    validate,
)
from faultlens.collectors.store.sink import SegmentSink

DAY = "2026-11-30"
BASE_NS = 1_796_040_000_123_456_789  # 2026-11-30T12:00:00.123456789Z: digits below the microsecond
OLD_TS = pa.timestamp("ns", tz="UTC")


def _old_type(typ: pa.DataType) -> pa.DataType:
    """The version-1 type of a column: every timestamp, nested ones too (evidence), in nanoseconds.
    """
    if pa.types.is_timestamp(typ):
        return OLD_TS
    if pa.types.is_list(typ):
        return pa.list_(_old_type(typ.value_type))
    if pa.types.is_struct(typ):
        return pa.struct(
            [typ.field(i).with_type(_old_type(typ.field(i).type)) for i in range(typ.num_fields)]
        )
    return typ


def old_schema(table: str) -> pa.Schema:
    schema = schema_for(table)
    return pa.schema([f.with_type(_old_type(f.type)) for f in schema],
                     metadata={**schema.metadata, METADATA_VERSION_KEY: b"1"})


def write_old_segment(location, table: str, rows: list[dict], job: str, node: str) -> str:
    """One segment as the version-1 sink wrote it: nanosecond timestamps, schema_version 1, zstd."""
    data = pa.Table.from_pylist(rows, schema=old_schema(table))
    assert data.schema.field("ts").type == OLD_TS
    return write_segment(
        location, partition_dir(location, table, job, DAY, node), data, compression="zstd"
    )


def step_rows(job: str, node: str, n: int, base_ns: int) -> list[dict]:
    return [
        {
            "ts": base_ns + i * 1_000_000_001 + 999,
            "cluster": "c",
            "node": node,
            "job_id": job,
            "attempt": 0,
            "rank": i % 4,
            "step": i,
            "phase": "train",
            "start_ts": base_ns + i * 1_000_000_001,
            "end_ts": base_ns + i * 1_000_000_001 + 999,
            "duration_s": 0.9,
            "sections": [("fwd", 0.5)],
            "loss": 2.0,
        }
        for i in range(n)
    ]


def _mixed_store(url: str) -> tuple[object, list[dict], list[dict]]:
    """A store with a version-1 steps segment and version-2 segments in the same partition and in
    another.
    """
    location = resolve_store(url, create=True)
    old = step_rows("job-a", "n1", 7, BASE_NS)
    new = step_rows("job-a", "n1", 5, BASE_NS + 100 * 1_000_000_000) + step_rows(
        "job-b", "n2", 3, BASE_NS
    )
    path = write_old_segment(location, "steps", old, "job-a", "n1")
    assert pq.read_schema(location.fs.open(path, "rb")).field("ts").type == OLD_TS
    with SegmentSink(location) as sink:
        sink.write("steps", new)
    return location, old, new


def _us(ns: int) -> int:
    return ns // 1000


@pytest.mark.parametrize("url", ["local", "memory"])
def test_store_reads_a_version1_segment_beside_microsecond_ones(tmp_path: Path, url: str) -> None:
    store_url = str(tmp_path / "store") if url == "local" else f"memory://units-{tmp_path.name}"
    location, old, new = _mixed_store(store_url)
    with Store(location) as store:
        assert store.bad_segments() == []
        table = store.query("SELECT * FROM steps")
        assert table.num_rows == len(old) + len(new)
        for name in ("ts", "start_ts", "end_ts"):
            assert table.schema.field(name).type.unit == "us", name
        got = store.query(
            "SELECT job_id, count(*) AS n, epoch_us(min(ts)) AS lo, "
            "epoch_us(max(ts)) AS hi, "
            "epoch_us(max(start_ts)) AS s FROM steps GROUP BY job_id ORDER BY job_id"
        ).to_pylist()
    a_rows = old + [r for r in new if r["job_id"] == "job-a"]
    b_rows = [r for r in new if r["job_id"] == "job-b"]
    assert got == [
        {"job_id": "job-a", "n": len(a_rows), "lo": _us(min(r["ts"] for r in a_rows)),
         "hi": _us(max(r["ts"] for r in a_rows)), "s": _us(max(r["start_ts"] for r in a_rows))},
        {"job_id": "job-b", "n": len(b_rows), "lo": _us(min(r["ts"] for r in b_rows)),
         "hi": _us(max(r["ts"] for r in b_rows)), "s": _us(max(r["start_ts"] for r in b_rows))},
    ]


def test_a_store_of_only_microseconds_reads_the_same_type(store_dir: Path) -> None:
    with SegmentSink(str(store_dir)) as sink:
        sink.write("steps", step_rows("job-b", "n2", 3, BASE_NS))
    with Store(str(store_dir)) as store:
        table = store.query("SELECT ts, epoch_us(ts) AS us FROM steps ORDER BY ts")
    assert table.schema.field("ts").type.unit == "us"
    assert table.column("us").to_pylist() == [
        _us(r["ts"]) for r in step_rows("job-b", "n2", 3, BASE_NS)
    ]


def test_nested_evidence_timestamps_of_a_version1_incident_read(store_dir: Path) -> None:
    location = resolve_store(str(store_dir))
    evidence = [{"table": "gpu_events", "ts": BASE_NS, "text": "Xid 79"}]
    old = [{"ts": BASE_NS, "job_id": "j", "node": "n1", "incident_id": "old", "class": "crash",
            "first_signal_ts": BASE_NS, "detected_ts": BASE_NS + 5, "evidence": evidence}]
    write_old_segment(location, "incidents", old, "j", "n1")
    with SegmentSink(str(store_dir)) as sink:
        sink.write("incidents", [{**old[0], "incident_id": "new", "ts": BASE_NS + 1_000}])
    with Store(str(store_dir)) as store:
        assert store.bad_segments() == []
        rows = store.query("SELECT incident_id, evidence, epoch_us(detected_ts) AS d FROM "
                           "incidents "
                           "ORDER BY incident_id").to_pylist()
    assert [r["incident_id"] for r in rows] == ["new", "old"]
    assert all(r["d"] == _us(BASE_NS) for r in rows)
    # nested: DuckDB's cast rounds
    moment = dt.datetime(2026, 11, 30, 12, 0, 0, 123457, tzinfo=dt.UTC)
    for row in rows:
        assert row["evidence"][0]["ts"] in (moment, moment - dt.timedelta(microseconds=1))


def test_segment_check_accepts_both_units_and_says_which_is_old(store_dir: Path) -> None:
    location, _, _ = _mixed_store(str(store_dir))
    paths = sorted(str(p) for p in store_dir.rglob("*.parquet"))
    infos = {p: inspect_segment(location, "steps", p) for p in paths}
    assert all(check_segment(location, "steps", p) is None for p in paths)
    assert sum(info.legacy_units for info in infos.values()) == 1
    # a timestamp column that is not a timestamp is still refused
    bad = pa.table({"ts": pa.array([BASE_NS], pa.int64())})
    directory = partition_dir(location, "steps", "job-c", DAY, "n3")
    path = write_segment(location, directory, bad)
    assert "column 'ts' is int64" in (check_segment(location, "steps", path) or "")


def test_follower_reads_a_version1_segment_as_microseconds(store_dir: Path) -> None:
    location, old, new = _mixed_store(str(store_dir))
    with Store(location) as store:
        arrow_tail = SegmentTail(store, ["steps"], retain_s=1e9, max_rows=10_000, to_frame=to_frame,
                                 arrow_tables=["steps"])
        arrow_tail.poll()
        table = arrow_tail.table("steps")
        frame_tail = SegmentTail(store, ["steps"], retain_s=1e9, max_rows=10_000, to_frame=to_frame)
        frame_tail.poll()
        frame = frame_tail.frame("steps")
    assert arrow_tail.state.unreadable == 0 and frame_tail.state.unreadable == 0
    assert table.num_rows == len(frame) == len(old) + len(new)
    assert table.schema.field("ts").type == schema_for("steps").field("ts").type
    want = sorted(_us(r["ts"]) for r in old + new)
    assert sorted(table.column("ts").cast(pa.int64()).to_pylist()) == want
    # detectors' frames are nanoseconds whatever the store's unit (their arithmetic is in ns)
    assert str(frame["ts"].dtype) == "datetime64[ns, UTC]"
    assert sorted(int(v) // 1000 for v in frame["ts"].astype("int64")) == want


def test_compaction_rewrites_a_version1_partition_in_microseconds(store_dir: Path) -> None:
    location, old, _new = _mixed_store(str(store_dir))
    results = compact(location, ["steps"])
    merged = [r for r in results if "job=job-a" in r.partition]
    assert len(merged) == 1 and merged[0].segments_in == 2
    schema = pq.read_schema(merged[0].path)
    assert schema.field("ts").type.unit == "us" and schema.field("start_ts").type.unit == "us"
    with Store(str(store_dir)) as store:
        got = store.query("SELECT count(*) AS n, epoch_us(min(ts)) AS lo FROM steps WHERE job_id = "
                          "'job-a'")
    assert got.to_pylist() == [{"n": 12, "lo": _us(old[0]["ts"])}]


def test_producers_nanoseconds_become_microseconds_truncated() -> None:
    rows = rows_to_table(
        "steps", [{"ts": BASE_NS, "start_ts": dt.datetime(2026, 11, 30, tzinfo=dt.UTC)}]
    )
    assert rows.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert rows.column("ts").cast(pa.int64()).to_pylist() == [_us(BASE_NS)]
    arrow = validate("steps", pa.table({"ts": pa.array([BASE_NS, -1_001], OLD_TS)}))
    # toward zero, as pyarrow casts
    assert arrow.column("ts").cast(pa.int64()).to_pylist() == [_us(BASE_NS), -1]
