"""The node agent: polls every source each interval, writes what they return through a SegmentSink
(Parquet segments in the store), optionally exports GPU telemetry over OpenTelemetry, and flushes
aged buffers. The sources come built, in the order they are polled (`faultlens collect` builds them
through the source registry, registry.py); the agent knows nothing of any one source.

It never raises: a source that fails is logged once per kind of failure and the others go on; a sink
write that fails keeps its rows buffered in the sink (nothing already stored is lost) and is retried
at the next flush.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from faultlens.collectors.sources.source import Source
from faultlens.collectors.store.sink import SegmentSink

log = logging.getLogger("faultlens.collectors.sources.agent")


@dataclass
class AgentStats:
    ticks: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    source_errors: int = 0
    sink_errors: int = 0
    export_errors: int = 0


class NodeAgent:
    """Runs sources on one node. `exporter` is an optional GpuOtelExporter (anything with
    export(table, batch)).
    """

    def __init__(self, sources: Sequence[Source], sink: SegmentSink, *, interval_s: float = 1.0,
                 exporter: object | None = None, monotonic: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None) -> None:
        self.sources = list(sources)
        self.sink = sink
        self.interval_s = max(0.01, float(interval_s))
        self.exporter = exporter
        self._monotonic = monotonic
        self._log = logger or log
        self.stats = AgentStats()
        self.stop_event = threading.Event()
        self._said: set[str] = set()

    def _once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            self._log.warning(message, *args)

    def stop(self) -> None:
        self.stop_event.set()

    def tick(self) -> None:
        """Poll every source once and hand the rows to the sink (and the exporter)."""
        self.stats.ticks += 1
        for source in self.sources:
            name = getattr(source, "name", type(source).__name__)
            try:
                batches = source.poll() or {}
            except Exception as exc:
                self.stats.source_errors += 1
                self._once(f"poll:{name}:{type(exc).__name__}", "source %s failed: %s: %s", name,
                           type(exc).__name__, exc)
                continue
            for table, batch in batches.items():
                if batch is None or batch.num_rows == 0:
                    continue
                try:
                    self.sink.write(table, batch)
                    self.stats.rows[table] = self.stats.rows.get(table, 0) + batch.num_rows
                except Exception as exc:
                    self.stats.sink_errors += 1
                    self._once(f"sink:{table}:{type(exc).__name__}", "cannot store %s rows from "
                                                                     "%s: %s: %s",
                               table, name, type(exc).__name__, exc)
                if self.exporter is not None:
                    try:
                        self.exporter.export(table, batch)
                    except Exception as exc:
                        self.stats.export_errors += 1
                        self._once(f"otel:{type(exc).__name__}", "OpenTelemetry export failed: %s: "
                                                                 "%s",
                                   type(exc).__name__, exc)
        try:
            self.sink.flush_aged()
        except Exception as exc:
            self.stats.sink_errors += 1
            self._once(
                f"flush:{type(exc).__name__}",
                "cannot flush segments: %s: %s",
                type(exc).__name__,
                exc,
            )

    def run(self, duration_s: float | None = None) -> AgentStats:
        """Tick every interval until stop() or `duration_s` has passed; then close the sources and
        flush.
        """
        started = self._monotonic()
        next_tick = started
        try:
            while not self.stop_event.is_set():
                self.tick()
                if duration_s is not None and self._monotonic() - started >= duration_s:
                    break
                next_tick += self.interval_s
                delay = next_tick - self._monotonic()
                if delay < 0:  # a slow tick: do not try to catch up with a burst
                    next_tick = self._monotonic()
                    delay = 0
                if duration_s is not None:
                    delay = min(delay, max(0.0, started + duration_s - self._monotonic()))
                self.stop_event.wait(delay)
        # KeyboardInterrupt included: stop cleanly, keep what was collected
        except BaseException as exc:
            self._log.warning("agent stopping: %s", type(exc).__name__)
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:
                self._once(f"close:{getattr(source, 'name', '?')}", "closing source %s: %s",
                           getattr(source, "name", "?"), exc)
        try:
            self.sink.flush()
        except Exception as exc:
            self.stats.sink_errors += 1
            self._log.warning("final flush failed: %s: %s", type(exc).__name__, exc)
        if self.exporter is not None:
            try:
                self.exporter.shutdown()
            except Exception as exc:
                self._log.warning("OpenTelemetry shutdown: %s: %s", type(exc).__name__, exc)
