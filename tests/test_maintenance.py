"""Compaction merges small segments while a concurrent reader never sees a row twice or misses one;
retention removes old partitions only."""

import datetime as dt
import threading
import time

import pyarrow as pa

from faultlens.attribution.reading.maintenance import compact, retention
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.schema import TABLES
from faultlens.collectors.store.sink import SegmentSink

BASE = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


def _write_small_segments(
    store_dir, segments: int, rows_per: int, job: str = "j", nodes: int = 4
) -> int:
    ts_type = TABLES["steps"].field("ts").type
    with SegmentSink(store_dir, flush_rows=rows_per) as sink:
        for s in range(segments):
            ids = list(range(s * rows_per, (s + 1) * rows_per))
            sink.write(
                "steps",
                pa.table(
                    {
                        "ts": pa.array([BASE + dt.timedelta(seconds=i) for i in ids], ts_type),
                        "node": pa.array([f"n{(i // rows_per) % nodes}" for i in ids]),
                        "job_id": pa.array([job] * len(ids)),
                        "step": pa.array(ids, pa.int64()),
                    }
                ),
            )
    return segments * rows_per


def test_compaction_under_a_concurrent_reader(store_dir):
    total = _write_small_segments(store_dir, segments=120, rows_per=20)
    segments_before = len(list(store_dir.rglob("*.parquet")))
    observations = []
    stop = threading.Event()

    errors = []

    def reader() -> None:
        try:
            with Store(store_dir) as store:
                while not stop.is_set():
                    store.refresh(["steps"])
                    row = store.query(
                        "SELECT count(*) AS n, count(DISTINCT step) AS d FROM steps"
                    ).to_pylist()[0]
                    observations.append((row["n"], row["d"]))
        except Exception as exc:  # surfaced in the test thread below
            errors.append(repr(exc))

    def paced_clock() -> float:
        """compact() asks the time as it starts each partition: it starts one only after the reader
        finished one more query, so the reads interleave with the compaction however loaded the
        machine is."""
        target = len(observations) + 1
        deadline = time.monotonic() + 60
        while len(observations) < target and not errors and time.monotonic() < deadline:
            time.sleep(0.002)
        return time.time()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        results = compact(store_dir, ["steps"], clock=paced_clock)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors[0]
    assert {r.partition.rsplit("/", 1)[-1] for r in results} == {
        "node=n0",
        "node=n1",
        "node=n2",
        "node=n3",
    }
    assert sum(r.segments_in for r in results) == segments_before
    assert len(observations) >= 2, (
        f"the reader ran only {len(observations)} times during compaction"
    )
    assert all(obs == (total, total) for obs in observations), set(observations)
    assert len(list(store_dir.rglob("*.parquet"))) == 4
    with Store(store_dir) as store:
        assert store.query("SELECT count(DISTINCT step) AS d FROM steps").to_pylist() == [
            {"d": total}
        ]
    # compacting again with new small segments merges the compacted one too
    _write_small_segments(store_dir, segments=2, rows_per=10, job="j")
    compact(store_dir, ["steps"])
    with Store(store_dir) as store:
        assert store.query("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": total + 20}]


def test_reader_drops_segments_a_compacted_one_replaces(store_dir):
    """A crash between writing the merged segment and deleting the sources must not double rows."""
    _write_small_segments(store_dir, segments=3, rows_per=5, nodes=1)
    sources = sorted(p for p in store_dir.rglob("*.parquet"))
    saved = {p: p.read_bytes() for p in sources}
    compact(store_dir, ["steps"])
    for path, data in saved.items():  # put the sources back, as if deletion never happened
        path.write_bytes(data)
    with Store(store_dir) as store:
        assert store.query(
            "SELECT count(*) AS n, count(DISTINCT step) AS d FROM steps"
        ).to_pylist() == [{"n": 15, "d": 15}]
    compact(store_dir, ["steps"])  # the next compaction removes the leftovers
    assert not any(p.exists() for p in saved)


def test_retention_removes_only_old_partitions(store_dir):
    ts_type = TABLES["gpu_events"].field("ts").type
    with SegmentSink(store_dir) as sink:
        for days_ago in (0, 5, 40):
            sink.write(
                "gpu_events",
                pa.table(
                    {
                        "ts": pa.array([BASE - dt.timedelta(days=days_ago)], ts_type),
                        "node": ["n1"],
                        "kind": ["xid"],
                    }
                ),
            )
    removed = retention(store_dir, 30, today=BASE.date())
    assert [r.partition.split("date=")[1].split("/")[0] for r in removed] == ["2026-10-21"]
    with Store(store_dir) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_events").to_pylist() == [{"n": 2}]
