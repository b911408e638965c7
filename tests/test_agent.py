"""The node agent over the recorded backend and the kernel log, for a few seconds of real time; the
store is then queried through DuckDB. Plus: `faultlens collect` on this GPU-less machine, and an
agent that never raises."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.agent import NodeAgent
from faultlens.collectors.sources.kmsg import KmsgSource
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.recorded_backend import RecordedBackend
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.sink import SegmentSink
from tests.conftest import DATA_DIR, REPO_ROOT

TIMELINE = DATA_DIR / "gpu" / "timeline-8gpu.yaml"


def test_agent_with_recorded_gpus_and_kernel_log(store_dir, tmp_path):
    identity = NodeIdentity("gpu-node-07", cluster="c1")
    kern = tmp_path / "kern.log"
    shutil.copy(DATA_DIR / "gpu" / "node-kern.log", kern)
    nvml = NvmlSource(RecordedBackend(TIMELINE), identity)
    kmsg = KmsgSource(identity, kern, from_start=True)
    kmsg.set_devices(nvml.devices())
    agent = NodeAgent([nvml, kmsg], SegmentSink(store_dir, flush_age_s=0.5), interval_s=0.25)
    stats = agent.run(duration_s=2.5)
    assert stats.source_errors == 0 and stats.sink_errors == 0

    store = Store(store_dir)
    per_gpu = {row["gpu_index"]: row for row in store.query(
        "SELECT gpu_index, count(*) AS n, max(ts) AS last, max(temp_c) AS hottest, "
        "min(sm_clock_mhz) AS slowest "
        "FROM gpu_samples WHERE source = 'recorded' GROUP BY gpu_index").to_pylist()}
    assert sorted(per_gpu) == list(range(8))
    assert all(per_gpu[i]["n"] >= 8 for i in per_gpu if i != 3)
    # GPU 3 stops being sampled when it falls off the bus
    assert 4 <= per_gpu[3]["n"] < per_gpu[0]["n"]
    assert per_gpu[3]["last"] < per_gpu[0]["last"]
    assert (per_gpu[6]["hottest"], per_gpu[6]["slowest"]) == (91.0, 1275)

    events = store.query("SELECT source, kind, code, gpu_index, pci_bus_id, gpu_uuid FROM "
                         "gpu_events "
                         "ORDER BY ts, source, kind").to_pylist()
    recorded = [(e["gpu_index"], e["kind"], e["code"]) for e in events if e["source"] == "recorded"]
    assert sorted(recorded) == sorted(
        [
            (6, "thermal_slowdown_start", None),
            (5, "xid", 48),
            (5, "ecc_dbe", None),
            (5, "xid", 63),
            (5, "remap_pending", None),
            (5, "xid", 154),
            (5, "recovery_action", 1),
            (3, "xid", 79),
            (3, "gpu_lost", None),
        ]
    )
    lost = next(e for e in events if e["kind"] == "gpu_lost" and e["source"] == "recorded")
    assert (lost["pci_bus_id"], lost["gpu_uuid"]) == (
        "00000000:5D:00.0",
        "GPU-19ab5f62-e3c7-4d08-a54b-6f2c8e0d7b04",
    )
    from_kernel = [(e["gpu_index"], e["kind"], e["code"]) for e in events if e["source"] == "kmsg"]
    assert sorted(from_kernel, key=str) == sorted(
        [
            (5, "xid", 48),
            (5, "ecc_dbe", None),
            (5, "xid", 63),
            (5, "remap_pending", None),
            (5, "xid", 154),
            (5, "recovery_action", 1),
            (3, "xid", 79),
            (3, "gpu_lost", None),
        ],
        key=str,
    )
    # the kernel's and NVML's view of the lost GPU join on the bus id
    joined = store.query("SELECT count(*) AS n FROM gpu_events e JOIN gpu_samples s USING "
                         "(pci_bus_id) "
                         "WHERE e.source = 'kmsg' AND e.code = 79").to_pylist()[0]["n"]
    assert joined == per_gpu[3]["n"]


class _Broken:
    name = "broken"

    def __init__(self) -> None:
        self.polls = 0

    def poll(self):
        self.polls += 1
        raise RuntimeError("boom")

    def close(self):
        raise OSError("cannot close")


class _BadRows:
    name = "bad-rows"

    def poll(self):
        return {
            "gpu_events": pa.record_batch(
                {"ts": pa.array([1], pa.int64()), "nonsense": pa.array([1])}
            )
        }

    def close(self):
        pass


def test_agent_never_raises_and_other_sources_go_on(store_dir, caplog):
    broken, bad = _Broken(), _BadRows()
    nvml = NvmlSource(RecordedBackend(TIMELINE), NodeIdentity("n1"), events=False)
    agent = NodeAgent([broken, bad, nvml], SegmentSink(store_dir), interval_s=0.05)
    stats = agent.run(duration_s=0.3)
    assert broken.polls >= 3
    assert stats.source_errors == broken.polls
    assert stats.sink_errors >= 3
    assert stats.rows["gpu_samples"] >= 8 * 3
    assert sum("source broken failed" in r.getMessage() for r in caplog.records) == 1
    assert Store(store_dir).query("SELECT count(*) AS n FROM gpu_samples").to_pylist()[0]["n"] == \
        stats.rows["gpu_samples"]


def test_agent_stop_from_another_thread(store_dir):
    import threading

    agent = NodeAgent([], SegmentSink(store_dir), interval_s=10)
    threading.Timer(0.2, agent.stop).start()
    stats = agent.run()
    assert stats.ticks == 1


def _collect(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", "collect", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )


def test_cli_collect_without_gpu_goes_on_with_the_other_sources(store_dir, tmp_path):
    kern = tmp_path / "kern.log"
    shutil.copy(DATA_DIR / "gpu" / "node-kern.log", kern)
    result = _collect(
        "--store",
        str(store_dir),
        "--node",
        "cpu-box",
        "--sources",
        "nvml,kmsg",
        "--interval",
        "200ms",
        "--duration",
        "1s",
        "--kmsg-path",
        str(kern),
        "--kmsg-from-start",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("NVML unavailable: ") == 1
    assert "faultlens collect: NVML unavailable: NVML Shared Library Not Found" in result.stderr
    rows = (
        Store(store_dir)
        .query("SELECT node, source, count(*) AS n FROM gpu_events GROUP BY ALL")
        .to_pylist()
    )
    assert rows == [{"node": "cpu-box", "source": "kmsg", "n": 8}]


def test_cli_collect_with_recorded_timeline(store_dir):
    result = _collect(
        "--store",
        str(store_dir),
        "--node",
        "gpu-node-07",
        "--sources",
        "nvml",
        "--interval",
        "250ms",
        "--duration",
        "2s",
        "--nvml-timeline",
        str(TIMELINE),
        "--job",
        "job-9",
    )
    assert result.returncode == 0, result.stderr
    assert "NVML unavailable" not in result.stderr
    store = Store(store_dir, jobs=["job-9"])
    kinds = {row["kind"] for row in store.query("SELECT DISTINCT kind FROM gpu_events").to_pylist()}
    assert {"gpu_lost", "xid", "ecc_dbe", "thermal_slowdown_start"} <= kinds


@pytest.mark.parametrize(("args", "message"), [
    (["--nvml-timeline", "{tmp}/absent.yaml"], "absent.yaml: cannot read"),
    (["--sources", "nvml,gpu-magic"], "unknown source 'gpu-magic'"),
    (["--interval", "fast"], "expected a duration like 500ms"),
])
def test_cli_collect_bad_arguments(store_dir, tmp_path, args, message):
    args = [a.format(tmp=tmp_path) for a in args]
    result = _collect("--store", str(store_dir), "--duration", "1s", *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_cli_collect_refuses_grpc_otlp(store_dir):
    result = _collect("--store", str(store_dir), "--duration", "1s", "--sources", "kmsg",
                      env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert result.returncode == 2
    assert "http/protobuf only" in result.stderr
