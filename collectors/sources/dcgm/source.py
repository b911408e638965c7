"""DcgmSource: the node agent's Source of gpu_samples and gpu_events from a dcgm-exporter endpoint
(or a file); fetch failures logged once, bad samples at most once a minute; never raises."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import pyarrow as pa

from faultlens.collectors.sources.dcgm.fetch import DcgmFetchError, fetch_scrape
from faultlens.collectors.sources.dcgm.parser import DcgmParser
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch

log = logging.getLogger("faultlens.collectors.sources.dcgm")


class DcgmSource:
    """Source of gpu_samples/gpu_events from a dcgm-exporter endpoint (or a file rewritten by
    something else).
    """

    name = "dcgm"

    def __init__(self, identity: NodeIdentity, location: str = "http://127.0.0.1:9400/metrics", *,
                 timeout_s: float = 2.0, clock_ns: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], float] = time.monotonic, host_from_labels: bool = False,
                 logger: logging.Logger | None = None) -> None:
        self.identity = identity
        self.location = location
        self.parser = DcgmParser()
        self._timeout = timeout_s
        self._clock_ns = clock_ns
        self._monotonic = monotonic
        self._host_from_labels = host_from_labels
        self._log = logger or log
        self._failing: str | None = None
        self._bad_reported = 0
        self._bad_logged_at: float | None = None
        self.bad_log_interval_s = 60.0

    def poll(self) -> Mapping[str, pa.RecordBatch]:
        try:
            try:
                text = fetch_scrape(self.location, timeout_s=self._timeout)
            except DcgmFetchError as exc:
                if self._failing != str(exc):
                    self._log.warning("%s", exc)
                self._failing = str(exc)
                return {}
            if self._failing is not None:
                self._log.info("dcgm %s: reachable again", self.location)
                self._failing = None
            samples, events = self.parser.parse(
                text,
                self.identity,
                ts_ns=self._clock_ns(),
                monotonic=self._monotonic(),
                host_from_labels=self._host_from_labels,
            )
            result: dict[str, pa.RecordBatch] = {}
            for table, rows in (("gpu_samples", samples), ("gpu_events", events)):
                batch, rejected = guarded_batch(table, rows)
                for row in rejected:
                    self.parser.count_bad(0, f"{table} row refused: {row.reason}")
                if batch is not None:
                    result[table] = batch
            bad = self.parser.stats.bad_lines - self._bad_reported
            if bad > 0:
                now = self._monotonic()
                if (
                    self._bad_logged_at is None
                    or now - self._bad_logged_at >= self.bad_log_interval_s
                ):
                    line_no, reason = (
                        self.parser.stats.bad_examples[-1]
                        if self.parser.stats.bad_examples
                        else (0, "")
                    )
                    self._log.warning(
                        "dcgm %s: skipped %d bad sample(s) (%d in all), e.g. line %s: %s",
                        self.location,
                        bad,
                        self.parser.stats.bad_lines,
                        line_no,
                        reason,
                    )
                    self._bad_reported = self.parser.stats.bad_lines
                    self._bad_logged_at = now
            return result
        except Exception as exc:  # never raise into the agent
            self._log.warning("dcgm source: %s: %s", type(exc).__name__, exc)
            return {}

    def close(self) -> None:
        return None
