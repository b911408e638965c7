"""OpenTelemetry export: the SDK's in-memory reader/exporter, the OTEL_* exporter choice, and real
OTLP/HTTP to a local server on 127.0.0.1 decoded with opentelemetry-proto."""

from __future__ import annotations

import http.server
import threading

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from faultlens.collectors.sources.gpu_backend import SAMPLE_COLUMNS
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.otel_export import (
    GPU_METRICS,
    ExporterChoice,
    GpuOtelExporter,
    OtelConfigError,
    choose_exporters,
)
from faultlens.collectors.sources.recorded_backend import RecordedBackend
from faultlens.collectors.sources.source import NodeIdentity
from tests.conftest import DATA_DIR

TIMELINE = DATA_DIR / "gpu" / "timeline-8gpu.yaml"


def recorded_batches():
    clock = [0.0]
    source = NvmlSource(
        RecordedBackend(TIMELINE, clock=lambda: clock[0]),
        NodeIdentity("gpu-node-07"),
        monotonic=lambda: clock[0],
        events=False,
    )
    first = source.poll()
    clock[0] = 2.0
    later = source.poll()
    source.close()
    return first, later


def test_samples_as_metrics_and_events_as_log_records():
    reader = InMemoryMetricReader()
    logs = InMemoryLogRecordExporter()
    exporter = GpuOtelExporter.with_readers([reader], [SimpleLogRecordProcessor(logs)])
    first, later = recorded_batches()
    points = exporter.export("gpu_samples", first["gpu_samples"])
    assert set(GPU_METRICS) == set(SAMPLE_COLUMNS)  # every metric column of gpu_samples is exported
    # retired-page columns are null on the timeline's H100s
    assert points == 8 * (len(SAMPLE_COLUMNS) - 3)
    exporter.export("gpu_samples", later["gpu_samples"])
    emitted = exporter.export("gpu_events", later["gpu_events"])
    assert emitted == later["gpu_events"].num_rows == 5

    data = reader.get_metrics_data()
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    temps = {p.attributes["gpu.index"]: p for p in metrics["gpu.temperature"].data.data_points}
    assert sorted(temps) == list(range(8))
    assert temps[6].value == 91  # the last value set (the thermally throttled GPU at 2 s)
    assert temps[3].value == 60  # GPU 3 lost at 1.5 s: its last point is from the first poll
    assert dict(temps[5].attributes) == {
        "node": "gpu-node-07",
        "gpu.index": 5,
        "gpu.uuid": "GPU-a65c1b07-94de-4f32-b8a0-3c7e2d6f1906",
        "gpu.pci_bus_id": "00000000:AB:00.0",
        "gpu.name": "NVIDIA H100 80GB HBM3",
    }
    assert metrics["gpu.temperature"].unit == "Cel"
    assert {
        p.value
        for p in metrics["gpu.remap.pending"].data.data_points
        if p.attributes["gpu.index"] == 5
    } == {1}
    event_counts = {(p.attributes["gpu.index"], p.attributes["gpu.event.kind"]): p.value
                    for p in metrics["gpu.events"].data.data_points}
    assert event_counts[(3, "gpu_lost")] == 1

    records = [r.log_record for r in logs.get_finished_logs()]
    lost = next(r for r in records if r.attributes["gpu.event.kind"] == "gpu_lost")
    assert lost.severity_text == "FATAL"
    assert "fallen off the bus" in lost.body
    assert lost.attributes["gpu.pci_bus_id"] == "00000000:5D:00.0"
    assert lost.attributes["gpu.event.source"] == "recorded"
    recovery = next(r for r in records if r.attributes["gpu.event.kind"] == "recovery_action")
    assert recovery.attributes["gpu.event.code"] == 1
    assert recovery.timestamp is not None
    exporter.shutdown()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ExporterChoice("none", "none")),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ExporterChoice("otlp", "otlp")),
        (
            {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:4318/v1/logs"},
            ExporterChoice("none", "otlp"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_LOGS_EXPORTER": "none"},
            ExporterChoice("otlp", "none"),
        ),
        ({"OTEL_METRICS_EXPORTER": "console"}, ExporterChoice("console", "none")),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"},
            ExporterChoice("none", "none"),
        ),
    ],
)
def test_exporter_choice_follows_otel_env(env, expected):
    assert choose_exporters(env) == expected
    exporter = GpuOtelExporter.from_env(env)
    assert (exporter is None) == (expected == ExporterChoice("none", "none"))
    if exporter is not None:
        exporter.shutdown()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "http/protobuf only",
        ),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "expected otlp, console or none"),
    ],
)
def test_unsupported_otel_env_is_refused(env, message):
    with pytest.raises(OtelConfigError, match=message):
        choose_exporters(env)


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers.get("Content-Type"), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_real_otlp_http_export_to_a_local_collector(monkeypatch):
    received: list = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(
            "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}"
        )
        exporter = GpuOtelExporter.from_env(node="gpu-node-07")
        first, later = recorded_batches()
        exporter.export("gpu_samples", first["gpu_samples"])
        exporter.export("gpu_events", later["gpu_events"])
        exporter.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    paths = {path for path, _, _ in received}
    assert paths == {"/v1/metrics", "/v1/logs"}
    assert {ctype for _, ctype, _ in received} == {"application/x-protobuf"}
    logs = ExportLogsServiceRequest()
    bodies = []
    for path, _, body in received:
        if path == "/v1/logs":
            logs.ParseFromString(body)
            bodies += [r.body.string_value for rl in logs.resource_logs for sl in rl.scope_logs
                       for r in sl.log_records]
            resource = {
                a.key: a.value.string_value for a in logs.resource_logs[0].resource.attributes
            }
            assert resource["host.name"] == "gpu-node-07"
    assert any("fallen off the bus" in body for body in bodies)
    metric_names = set()
    for path, _, body in received:
        if path == "/v1/metrics":
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            metric_names |= {
                m.name
                for rm in request.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            }
    assert {"gpu.temperature", "gpu.power", "gpu.ecc.dbe.volatile"} <= metric_names
