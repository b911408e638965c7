"""The object-store path against moto's real S3 HTTP server on 127.0.0.1: write, list, query,
compact.
"""

import datetime as dt
import socket

import pyarrow as pa
import pytest

from faultlens.attribution.reading.maintenance import compact
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import list_segments, resolve_store
from faultlens.collectors.store.schema import TABLES
from faultlens.collectors.store.sink import SegmentSink

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    client.create_bucket(Bucket="telemetry")
    yield endpoint
    server.stop()


@pytest.fixture
def s3_options(s3_endpoint):
    return {
        "endpoint_url": s3_endpoint,
        "key": "testing",
        "secret": "testing",
        "skip_instance_cache": True,
    }


def test_write_list_query_compact_on_s3(s3_options):
    url = "s3://telemetry/faultlens"
    base = dt.datetime(2026, 11, 30, 8, tzinfo=dt.UTC)
    ts_type = TABLES["gpu_events"].field("ts").type
    sink = SegmentSink(url, flush_rows=3, storage_options=s3_options)
    for i in range(12):
        sink.write("gpu_events", pa.table({
            "ts": pa.array([base + dt.timedelta(seconds=i)], ts_type), "node": [f"node-{i % 2}"],
            "kind": ["xid"], "code": pa.array([79 if i == 7 else 13], pa.int32()),
            "pci_bus_id": ["00000000:9B:00.0"]}))
    sink.close()
    location = resolve_store(url, **s3_options)
    segments = list_segments(location, "gpu_events")
    assert len(segments) == 8 and all(
        s.startswith("telemetry/faultlens/gpu_events/job=_node/date=2026-11-30/") for s in segments
    )
    with Store(url, storage_options=s3_options) as store:
        got = store.query("SELECT node, count(*) AS n, max(code) AS worst FROM gpu_events GROUP BY "
                          "node "
                          "ORDER BY node").to_pylist()
        assert got == [
            {"node": "node-0", "n": 6, "worst": 13},
            {"node": "node-1", "n": 6, "worst": 79},
        ]
        results = compact(location, ["gpu_events"])
        assert sorted(r.segments_in for r in results) == [4, 4]
        store.refresh()
        assert len(store.segments("gpu_events")) == 2
        assert store.query("SELECT count(*) AS n FROM gpu_events").to_pylist() == [{"n": 12}]
    with Store(url, storage_options=s3_options, nodes=["node-1"]) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_events").to_pylist() == [{"n": 6}]
