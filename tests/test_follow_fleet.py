"""The follower on an object store lists the landing log (collectors/store/landing.py,
attribution/reading/landed.py), on moto's real S3 HTTP server: a poll's requests follow what landed
since the last one (one GET per new segment, no HEAD, the same few list requests whatever the
store's history), the segments it remembers follow its listing, its memory does not grow with the
number of polls, and a crash that lands is attributed with its lag taken from the landing log.
bench/bench_fleet_follow.py measures the same at fleet size."""

from __future__ import annotations

import datetime as dt
import socket
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from faultlens.attribution.engine import Engine
from faultlens.attribution.follow import TAILED_TABLES, Follower
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.collectors.store.landing import KEY_LIMIT, landing_keys, parse_key
from faultlens.collectors.store.layout import StoreLocation, list_segments, resolve_store
from faultlens.collectors.store.schema import validate
from faultlens.collectors.store.sink import SegmentSink
from tests.engine_rows import at, event, ranks_rows

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

NODES = 3
PER_NODE = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """moto's S3 server on 127.0.0.1 and (method, path, query) of every request it receives."""
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    received: list[tuple[str, str, str]] = []
    app = server._server.app

    def counting(environ, start_response):
        received.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                         environ.get("QUERY_STRING", "")))
        return app(environ, start_response)

    server._server.app = counting
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1",
                 ).create_bucket(Bucket="fleet")
    yield endpoint, received
    server.stop()


def _kinds(received: list[tuple[str, str, str]]) -> dict[str, int]:
    out = {"list": 0, "get": 0, "head": 0, "put": 0}
    for method, _, query in received:
        kind = "list" if method == "GET" and "list-type=2" in query else method.lower()
        out[kind] = out.get(kind, 0) + 1
    return out


def _locations(endpoint: str) -> tuple[StoreLocation, StoreLocation]:
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
               "skip_instance_cache": True}
    url = f"s3://fleet/{uuid.uuid4().hex[:8]}"
    # the writers' filesystem object and the follower's (as on a cluster)
    return resolve_store(url, **options), resolve_store(url, **options)


def _rows(table: str, node: int, seconds: float) -> pa.Table:
    job = None if table == "gpu_samples" else "train"
    count = 1 if table == "gpu_samples" else PER_NODE
    return validate(table, pa.table({
        "ts": pa.array([at(seconds)] * count, pa.timestamp("us", tz="UTC")),
        "job_id": pa.array([job] * count, pa.string()),
        "node": [f"node-{node:02d}"] * count,
        **({"rank": pa.array([node * PER_NODE + i for i in range(count)], pa.int32())}
           if job else {}),
    }))


def _land_round(sinks: list[SegmentSink], seconds: float) -> int:
    """Every node's agent flushes its heartbeats and GPU samples, each node's ranks their steps:
    three segments and one landing-log key per node."""
    for node, sink in enumerate(sinks):
        for table in ("heartbeats", "gpu_samples", "steps"):
            sink.write(table, _rows(table, node, seconds))
        sink.flush()
    return 3 * len(sinks)


def _follower(location: StoreLocation, **thresholds: float) -> Follower:
    engine = Engine(catalog=load_xid_catalog())
    if thresholds:
        config = engine.thresholds.engine.model_copy(update=thresholds)
        engine.thresholds = engine.thresholds.model_copy(update={"engine": config})
    follower = Follower(location, job="train", engine=engine, clock=lambda: at(60))
    follower.tail.listing.grace_s = 0.3  # (the default covers a slow PUT or a skewed clock)
    return follower


def test_landing_keys_round_trip_and_stay_under_the_key_limit(tmp_path) -> None:
    location = resolve_store(str(tmp_path / "s"), create=True)
    paths = [location.join("steps", "job=a%2Fb", "date=2026-11-30", f"node=n{i:03d}",
                           f"{i:020d}-{i:012x}.parquet") for i in range(40)]
    keys = landing_keys(location, [*paths, location.join("steps", "stray.parquet")], 123 * 10**9)
    assert len(keys) > 1 and all(len(key) <= KEY_LIMIT for key in keys)
    assert all("/_landed/t=120/" in key for key in keys)
    parsed = [entry for key in keys for entry in parse_key(location, key)]
    assert [entry.path for entry in parsed] == paths  # the stray path named by no key
    assert {(e.table, e.job, e.date, e.landed_at) for e in parsed} == {
        ("steps", "a%2Fb", "2026-11-30", 123.0)}


def test_requests_per_poll_follow_what_landed_not_history(s3) -> None:
    endpoint, received = s3
    writer, location = _locations(endpoint)
    sinks = [SegmentSink(writer, flush_rows=10**9, flush_age_s=3600) for _ in range(NODES)]
    with SegmentSink(writer, flush_rows=10**9, flush_age_s=3600) as sink:
        sink.write("ranks", ranks_rows("train", 0, NODES * PER_NODE, PER_NODE))
    _land_round(sinks, 1.0)
    follower = _follower(location)
    try:
        follower.poll_once()  # the catch-up: the partitions, listed once
        assert follower.tail.listing.nodes == {f"node-{n:02d}" for n in range(NODES)}
        per_poll = []
        for round_ in range(2, 6):
            time.sleep(0.35)  # past the grace: the next poll lists this round's keys only
            landed = _land_round(sinks, round_)
            received.clear()
            read_before = follower.stats.segments_read
            follower.poll_once()
            kinds = _kinds(received)
            assert follower.stats.segments_read - read_before == landed
            segment_gets = sum(1 for method, path, query in received
                               if method == "GET" and path.endswith(".parquet") and not query)
            assert segment_gets == landed and kinds["head"] == 0  # one GET a segment, no HEAD
            per_poll.append(kinds["list"])
            remembered = sum(len(follower.tail.state.seen[t]) for t in TAILED_TABLES)
            assert remembered <= 2 * landed  # this round's and at most the last one's
        # one list request per time bucket (two when a poll spans a minute's end), whatever the
        # history; listing the same tables' partitions grows with it
        assert max(per_poll) <= 2, per_poll
        received.clear()
        for table in ("heartbeats", "gpu_samples", "steps"):
            assert len(list_segments(location, table)) >= 5 * NODES
        assert _kinds(received)["list"] > max(per_poll)
    finally:
        follower.close()
        for sink in sinks:
            sink.close()


def test_a_crash_that_lands_is_attributed_with_its_landing_time(s3) -> None:
    endpoint, _ = s3
    writer, location = _locations(endpoint)
    with SegmentSink(writer, flush_rows=10**9, flush_age_s=3600) as sink:
        sink.write("ranks", ranks_rows("train", 0, NODES * PER_NODE, PER_NODE))
    follower = Follower(location, job="train", engine=Engine(catalog=load_xid_catalog()),
                        clock=lambda: at(60))
    try:
        follower.poll_once()
        with SegmentSink(writer, flush_rows=10**9, flush_age_s=3600,
                         write_through=("process_events",)) as sink:
            sink.write("process_events", [event("exit", 3, 30.0, job="train", per_node=PER_NODE,
                                                exit_code=-9, signal="SIGKILL",
                                                source="supervisor")])
            landed = time.time()
        deadline = time.monotonic() + 30
        written = []
        while not written and time.monotonic() < deadline:
            written = follower.poll_once()
            time.sleep(0.05)
        assert [i.incident_class.value for i in written] == ["crash"]
        record = follower.stats.lag[0]
        assert record.segment is not None and "/process_events/" in record.segment
        # the writer's clock after its PUT: before the sink returned, not an mtime in seconds
        assert record.landed_at is not None and landed - 5 < record.landed_at <= landed
        assert dt.datetime.now(dt.UTC).timestamp() >= record.written_at >= record.landed_at
    finally:
        follower.close()
