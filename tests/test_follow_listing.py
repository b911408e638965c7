"""The follower of one job lists only the partitions it needs (attribution/reading/tail.py
PartitionListing): on moto's real S3 HTTP server, the list requests of a poll as the server receives
them, against the full listing of the same tables; and the segments that must be seen are: one
written late into an older date partition of the job, a node-level one of a node of the job, those
of a node that joins the job. The same store on a local directory goes through the fsspec path of
the listing."""

from __future__ import annotations

import datetime as dt
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from faultlens.attribution.engine import Engine
from faultlens.attribution.follow import TAILED_TABLES, Follower
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.collectors.store.layout import (
    StoreLocation,
    list_segments,
    partition_dir,
    resolve_store,
    write_segment,
)
from faultlens.collectors.store.schema import validate
from faultlens.collectors.store.sink import SegmentSink
from tests.engine_rows import at, ranks_rows, steps_rows

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

# ten days; the job's rows are on the last two
DAYS = [f"2026-11-{day:02d}" for day in range(21, 31)]
START = -11.5 * 3600.0  # the job's first step: 2026-11-30 00:30 UTC (engine_rows.T0 is 12:00)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """moto's S3 server on 127.0.0.1 and the (method, query) of every request it receives."""
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    received: list[tuple[str, str]] = []
    app = server._server.app

    def counting(environ, start_response):
        received.append((environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")))
        return app(environ, start_response)

    server._server.app = counting
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="telemetry")
    yield endpoint, received
    server.stop()


def _list_requests(received: list[tuple[str, str]]) -> int:
    return sum(1 for method, query in received if method == "GET" and "list-type=2" in query)


def _flat(rank: int, step: int) -> dict[str, float]:
    return {"forward": 0.3, "backward": 0.6}


def _put(
    location: StoreLocation, table: str, job: str, day: str, node: str, ts: dt.datetime
) -> str:
    """One tiny segment straight into a partition (as a sink that buffered its rows would write it).
    """
    rows = validate(
        table,
        pa.table(
            {
                "ts": pa.array([ts], pa.timestamp("us", tz="UTC")),
                "job_id": pa.array([None if job == "_node" else job], pa.string()),
                "node": [node],
            }
        ),
    )
    return write_segment(location, partition_dir(location, table, job, day, node), rows)


def _store(location: StoreLocation) -> None:
    """The followed job `train` on node-00 and node-01 since 2026-11-30 00:30; the rest of the
    store: another job on node-02 .. node-09 and every node's GPU samples, on each of ten days."""
    with SegmentSink(location, flush_rows=10_000_000, flush_age_s=3600) as sink:
        sink.write("ranks", ranks_rows("train", 0, 8, 4, start=START))
        sink.write("steps", steps_rows("train", 0, 8, 4, range(30), start=START, sections=_flat))
    for day in DAYS:
        noon = dt.datetime.fromisoformat(day).replace(hour=12, tzinfo=dt.UTC)
        for n in range(10):
            _put(location, "gpu_samples", "_node", day, f"node-{n:02d}", noon)
            if n >= 2:
                _put(location, "steps", "other", day, f"node-{n:02d}", noon)
                _put(location, "heartbeats", "other", day, f"node-{n:02d}", noon)


def _follower(location: StoreLocation) -> Follower:
    # the partition listing (an object store's follower lists the landing log by default:
    # tests/test_follow_fleet.py); the segments here are put straight into their partitions
    return Follower(
        location,
        job="train",
        engine=Engine(catalog=load_xid_catalog()),
        clock=lambda: at(START + 60),
        landing=False,
    )


def _seen(follower: Follower, table: str) -> set[str]:
    return follower.tail.state.seen[table]


def _late_segments_are_seen(location: StoreLocation, follower: Follower) -> None:
    """`location`: where the writers write (on S3 another filesystem object than the follower's)."""
    # the window of steps starts an hour before its newest row (00:30 + 30 steps): 2026-11-29 23:31
    assert follower.tail.oldest_date("steps") == "2026-11-29"
    late = _put(
        location,
        "steps",
        "train",
        "2026-11-29",
        "node-01",
        dt.datetime(2026, 11, 29, 23, 50, tzinfo=dt.UTC),
    )
    too_old = _put(
        location,
        "steps",
        "train",
        "2026-11-25",
        "node-01",
        dt.datetime(2026, 11, 25, 9, tzinfo=dt.UTC),
    )
    own_node = _put(location, "gpu_events", "_node", "2026-11-30", "node-01", at(START + 30))
    other_node = _put(location, "gpu_events", "_node", "2026-11-30", "node-05", at(START + 30))
    other_job = _put(location, "steps", "other", "2026-11-30", "node-05", at(START + 30))
    # into a partition listed (and, on S3, cached by fsspec) before: read, not taken for a vanished
    # segment
    again = _put(location, "steps", "train", "2026-11-30", "node-00", at(START + 31))
    read_before = follower.stats.segments_read
    follower.poll_once()
    assert follower.stats.segments_read - read_before == 3  # late, own_node, again
    assert again in _seen(follower, "steps")
    # a late segment of an older date of the window: the next poll
    assert late in _seen(follower, "steps")
    assert own_node in _seen(follower, "gpu_events")  # a node-level segment of a node of the job
    # never listed: a date whose every row is older than the window (it would be dropped on
    # arrival), a node that is not the job's, another job
    assert too_old not in _seen(follower, "steps")
    assert other_node not in _seen(follower, "gpu_events")
    assert other_job not in _seen(follower, "steps")
    # node-02 joins the job (attempt 1): its node-level rows of the window's dates are read from
    # then on
    with SegmentSink(location, flush_rows=10_000_000, flush_age_s=3600) as sink:
        sink.write(
            "ranks",
            [{**row, "node": "node-02"} for row in ranks_rows("train", 1, 4, 4, start=START + 40)],
        )
    follower.poll_once()
    assert "node-02" in follower.tail.listing.nodes
    joined = {p for p in _seen(follower, "gpu_samples") if "/node=node-02/" in p}
    # the window of gpu_samples starts an hour before its newest row (noon of 2026-11-30): the last
    # day only
    assert joined and all("/date=2026-11-30/" in p for p in joined)


def test_job_follower_lists_fewer_prefixes_than_the_full_listing_on_s3(s3, monkeypatch) -> None:
    endpoint, received = s3
    # pages of 10 keys: this store of ~300 segments lists as one of ~30,000 does with S3's pages of
    # 1,000
    monkeypatch.setenv("MOTO_S3_DEFAULT_MAX_KEYS", "10")
    options = {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": "testing",
        "skip_instance_cache": True,
    }
    url = f"s3://telemetry/{uuid.uuid4().hex[:8]}"
    # the writers' filesystem object, not the follower's (as on a cluster)
    writer = resolve_store(url, **options)
    location = resolve_store(url, **options)
    assert writer.fs is not location.fs
    _store(writer)
    received.clear()
    follower = _follower(location)
    # opening lists none of the tailed tables whole (the tail lists what it needs), only the
    # incidents
    opened = [query for method, query in received if method == "GET" and "list-type=2" in query]
    assert not any(
        f"%2F{table}%2F" in query or f"/{table}/" in query
        for query in opened
        for table in TAILED_TABLES
    )
    try:
        follower.poll_once()  # the first poll reads the window
        assert follower.tail.listing.nodes == {"node-00", "node-01"}
        received.clear()
        assert follower.poll_once() == []
        per_poll = _list_requests(received)
        received.clear()
        # what a poll listed before: every tailed table whole (Store.refresh)
        for table in TAILED_TABLES:
            list_segments(location, table, jobs=["train", "_node"])
        full = _list_requests(received)
        # one ranged request per job= prefix of each table: the last day of gpu_samples is 10 keys,
        # one page
        assert per_poll == len(TAILED_TABLES) * 2
        assert per_poll < full
        assert full >= 2 * per_poll
        # fsspec's listings cache holds the job's steps partitions as they are now (anything sharing
        # the filesystem object may list them): the listing must replace what it lists there, or
        # s3fs takes a new segment in one of them for a missing file
        location.fs.find(location.join("steps", "job=train"))
        received.clear()
        _late_segments_are_seen(writer, follower)
        # and the new segments were opened from the listing's entries: no HEAD request for any of
        # them
        assert sum(1 for method, _ in received if method == "HEAD") == 0
    finally:
        follower.close()


def test_job_follower_on_a_local_store_lists_the_same_way(tmp_path: Path) -> None:
    location = resolve_store(str(tmp_path / "store"), create=True)
    _store(location)
    follower = _follower(location)
    try:
        follower.poll_once()
        assert follower.tail.listing.nodes == {"node-00", "node-01"}
        # the first poll lists every date of gpu_samples (its window was empty), and reads only the
        # job's nodes
        assert {p.split("/node=")[1].split("/")[0] for p in _seen(follower, "gpu_samples")} == {
            "node-00",
            "node-01",
        }
        assert not any("job=other" in p for p in _seen(follower, "steps"))
        _late_segments_are_seen(location, follower)
    finally:
        follower.close()
