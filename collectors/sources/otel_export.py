"""OpenTelemetry export of GPU telemetry: gpu_samples as OTel metrics (gauges with attributes node,
gpu.index, gpu.uuid, gpu.pci_bus_id), gpu_events as OTel log records (body = message; attributes
kind, code, source, ...).

The exporter follows the standard OTEL_* environment variables:
  OTEL_SDK_DISABLED=true                          -> nothing is exported
  OTEL_METRICS_EXPORTER / OTEL_LOGS_EXPORTER      -> "otlp", "console" or "none" (per signal)
  otherwise                                       -> OTLP when OTEL_EXPORTER_OTLP_ENDPOINT (or the
  per-signal
                                                     OTEL_EXPORTER_OTLP_{METRICS,LOGS}_ENDPOINT) is
                                                     set, else none
  OTEL_EXPORTER_OTLP_PROTOCOL                     -> http/protobuf (the installed exporter); grpc is
  refused
Endpoint, headers, timeout, compression, OTEL_METRIC_EXPORT_INTERVAL, OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES are read by the SDK and the exporter themselves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from faultlens.errors import FaultlensError

log = logging.getLogger("faultlens.collectors.otel")

SCOPE = "faultlens.collectors.gpu"

# gpu_samples column -> (metric name, unit, description)
GPU_METRICS: dict[str, tuple[str, str, str]] = {
    "temp_c": ("gpu.temperature", "Cel", "GPU temperature"),
    "hbm_temp_c": ("gpu.memory.temperature", "Cel", "HBM temperature"),
    "power_w": ("gpu.power", "W", "power draw"),
    "energy_mj": ("gpu.energy", "mJ", "energy since driver load"),
    "sm_clock_mhz": ("gpu.clock.sm", "MHz", "SM clock"),
    "mem_clock_mhz": ("gpu.clock.memory", "MHz", "memory clock"),
    "gpu_util_pct": ("gpu.utilization", "%", "GPU utilisation"),
    "mem_util_pct": ("gpu.memory.utilization", "%", "memory utilisation"),
    "mem_used_bytes": ("gpu.memory.used", "By", "framebuffer used"),
    "mem_total_bytes": ("gpu.memory.total", "By", "framebuffer total"),
    "clocks_event_reasons": ("gpu.clocks_event_reasons", "1", "clocks-event reason bits"),
    "ecc_sbe_volatile": ("gpu.ecc.sbe.volatile", "{error}", "single-bit ECC errors since reset"),
    "ecc_dbe_volatile": ("gpu.ecc.dbe.volatile", "{error}", "double-bit ECC errors since reset"),
    "ecc_sbe_aggregate": ("gpu.ecc.sbe.aggregate", "{error}", "single-bit ECC errors, lifetime"),
    "ecc_dbe_aggregate": ("gpu.ecc.dbe.aggregate", "{error}", "double-bit ECC errors, lifetime"),
    "ecc_dram_corrected": ("gpu.ecc.dram.corrected", "{error}", "corrected DRAM ECC errors"),
    "ecc_sram_corrected": ("gpu.ecc.sram.corrected", "{error}", "corrected SRAM ECC errors"),
    "ecc_dram_uncorrected": ("gpu.ecc.dram.uncorrected", "{error}", "uncorrected DRAM ECC errors"),
    "ecc_sram_uncorrected": ("gpu.ecc.sram.uncorrected", "{error}", "uncorrected SRAM ECC errors"),
    "retired_pages_sbe": ("gpu.retired_pages.sbe", "{page}", "pages retired for single-bit errors"),
    "retired_pages_dbe": ("gpu.retired_pages.dbe", "{page}", "pages retired for double-bit errors"),
    "retired_pages_pending": ("gpu.retired_pages.pending", "1", "page retirement pending (0/1)"),
    "remapped_rows_correctable": ("gpu.remapped_rows.correctable", "{row}", "rows remapped, "
                                                                            "correctable"),
    "remapped_rows_uncorrectable": ("gpu.remapped_rows.uncorrectable", "{row}", "rows remapped, "
                                                                                "uncorrectable"),
    "remap_pending": ("gpu.remap.pending", "1", "row remap pending (0/1)"),
    "remap_failure": ("gpu.remap.failure", "1", "row remap failure (0/1)"),
    "recovery_action": ("gpu.recovery_action", "1", "NVML GPU recovery action"),
    "pcie_replay_count": ("gpu.pcie.replays", "{replay}", "PCIe replays"),
    "nvlink_replay_errors": ("gpu.nvlink.replay_errors", "{error}", "NVLink replay errors"),
    "nvlink_recovery_errors": ("gpu.nvlink.recovery_errors", "{error}", "NVLink recovery errors"),
    "nvlink_crc_errors": ("gpu.nvlink.crc_errors", "{error}", "NVLink CRC errors"),
}

_SEVERITY = {
    "gpu_lost": SeverityNumber.FATAL,
    "remap_failure": SeverityNumber.ERROR,
    "ecc_dbe": SeverityNumber.ERROR,
    "xid": SeverityNumber.ERROR,
    "sxid": SeverityNumber.ERROR,
    "recovery_action": SeverityNumber.ERROR,
    "nvlink_error": SeverityNumber.WARN,
    "remap_pending": SeverityNumber.WARN,
    "retired_page_pending": SeverityNumber.WARN,
    "ecc_sbe_storm": SeverityNumber.WARN,
    "thermal_slowdown_start": SeverityNumber.WARN,
    "power_slowdown_start": SeverityNumber.WARN,
    "pcie_replay": SeverityNumber.WARN,
}


class OtelConfigError(ValueError, FaultlensError):
    """The OTEL_* environment asks for something this build cannot do (named in the message)."""


@dataclass(frozen=True)
class ExporterChoice:
    metrics: str  # otlp, console, none
    logs: str


def choose_exporters(env: Mapping[str, str] | None = None) -> ExporterChoice:
    """Which exporter each signal gets under the OTEL_* variables (see the module doc)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ExporterChoice("none", "none")

    def pick(signal: str) -> str:
        explicit = env.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
        if explicit:
            first = explicit.split(",")[0].strip()
            if first not in ("otlp", "console", "none"):
                raise OtelConfigError(f"OTEL_{signal}_EXPORTER={explicit!r}: expected otlp, "
                                      "console or none")
            return first
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"
        )
        return "otlp" if endpoint else "none"

    choice = ExporterChoice(pick("METRICS"), pick("LOGS"))
    if "otlp" in (choice.metrics, choice.logs):
        for signal in ("METRICS", "LOGS"):
            protocol = (
                (
                    env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
                    or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                    or "http/protobuf"
                )
                .strip()
                .lower()
            )
            if protocol != "http/protobuf":
                raise OtelConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: this build "
                                      "exports OTLP over "
                                      "http/protobuf only (opentelemetry-exporter-otlp-proto-http)")
    return choice


class GpuOtelExporter:
    """Feeds gpu_samples / gpu_events batches into an OTel MeterProvider and LoggerProvider."""

    def __init__(self, meter_provider: MeterProvider, logger_provider: LoggerProvider) -> None:
        self.meter_provider = meter_provider
        self.logger_provider = logger_provider
        meter = meter_provider.get_meter(SCOPE)
        self._gauges = {column: meter.create_gauge(name, unit=unit, description=description)
                        for column, (name, unit, description) in GPU_METRICS.items()}
        self._event_counter = meter.create_counter(
            "gpu.events", unit="{event}", description="GPU health events"
        )
        self._logger = logger_provider.get_logger(SCOPE)

    @classmethod
    def with_readers(cls, metric_readers: list[MetricReader], log_processors: list[Any],
                     resource: Resource | None = None) -> GpuOtelExporter:
        resource = resource or Resource.create({"service.name": "faultlens-collect"})
        meters = MeterProvider(metric_readers=metric_readers, resource=resource)
        loggers = LoggerProvider(resource=resource)
        for processor in log_processors:
            loggers.add_log_record_processor(processor)
        return cls(meters, loggers)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, node: str | None = None
    ) -> GpuOtelExporter | None:
        """The exporter the OTEL_* environment asks for; None when it asks for none. Raises
        OtelConfigError.
        """
        choice = choose_exporters(env)
        if choice.metrics == "none" and choice.logs == "none":
            return None
        attributes = {"service.name": "faultlens-collect"}
        if node:
            attributes["host.name"] = node
        resource = Resource.create(attributes)
        readers: list[MetricReader] = []
        processors: list[Any] = []
        if choice.metrics == "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        elif choice.metrics == "console":
            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
        if choice.logs == "otlp":
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

            processors.append(BatchLogRecordProcessor(OTLPLogExporter()))
        elif choice.logs == "console":
            processors.append(BatchLogRecordProcessor(ConsoleLogRecordExporter()))
        return cls.with_readers(readers, processors, resource)

    @staticmethod
    def _attributes(row: Mapping[str, Any]) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        for column, key in (
            ("node", "node"),
            ("cluster", "cluster"),
            ("job_id", "job.id"),
            ("gpu_index", "gpu.index"),
            ("gpu_uuid", "gpu.uuid"),
            ("pci_bus_id", "gpu.pci_bus_id"),
            ("gpu_name", "gpu.name"),
        ):
            value = row.get(column)
            if value is not None:
                attributes[key] = value
        return attributes

    def export_samples(self, batch: pa.RecordBatch | pa.Table) -> int:
        """Record one gauge point per non-null metric of every sample row; returns the points
        recorded.
        """
        points = 0
        for row in batch.to_pylist():
            attributes = self._attributes(row)
            for column, gauge in self._gauges.items():
                value = row.get(column)
                if value is None:
                    continue
                gauge.set(int(value) if isinstance(value, bool) else value, attributes)
                points += 1
        return points

    def export_events(self, batch: pa.RecordBatch | pa.Table) -> int:
        """Emit one log record per event row; returns the records emitted."""
        count = 0
        for row in batch.to_pylist():
            attributes = self._attributes(row)
            attributes["gpu.event.kind"] = row.get("kind") or "unknown"
            attributes["gpu.event.source"] = row.get("source") or "unknown"
            if row.get("code") is not None:
                attributes["gpu.event.code"] = int(row["code"])
            if row.get("pid") is not None:
                attributes["process.pid"] = int(row["pid"])
            if row.get("process_name"):
                attributes["process.executable.name"] = row["process_name"]
            ts = row.get("ts")
            timestamp = int(ts.timestamp() * 1e9) if hasattr(ts, "timestamp") else None
            severity = _SEVERITY.get(row.get("kind") or "", SeverityNumber.INFO)
            self._logger.emit(
                timestamp=timestamp,
                severity_number=severity,
                severity_text=severity.name,
                body=row.get("message") or row.get("kind") or "",
                attributes=attributes,
                event_name="faultlens.gpu_event",
            )
            self._event_counter.add(1, {k: v for k, v in attributes.items()
                                        if k in ("node", "gpu.index", "gpu.event.kind")})
            count += 1
        return count

    def export(self, table: str, batch: pa.RecordBatch | pa.Table) -> int:
        if table == "gpu_samples":
            return self.export_samples(batch)
        if table == "gpu_events":
            return self.export_events(batch)
        return 0

    def force_flush(self, timeout_ms: int = 5000) -> None:
        self.meter_provider.force_flush(timeout_ms)
        self.logger_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        try:
            self.force_flush()
        finally:
            self.meter_provider.shutdown()
            self.logger_provider.shutdown()
