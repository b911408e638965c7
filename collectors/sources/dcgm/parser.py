"""DcgmParser: scrapes into gpu_samples and gpu_events rows, keeping per GPU what it saw between
scrapes so that Xids, health changes and sample deltas are reported once. Never raises."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from faultlens.collectors.sources.dcgm.metrics import (
    ADDITIVE_COLUMNS,
    HEALTH_KINDS,
    HEALTH_METRIC,
    HEALTH_WORDS,
    INT32_MAX,
    INT64_MAX,
    MAX_SCRAPE_CHARS,
    MAX_TS_NS,
    MIB,
    SAMPLE_METRICS,
    XID_COUNT_METRIC,
    XID_LAST_METRICS,
    BadValue,
    column_value,
    no_data,
    short_name,
)
from faultlens.collectors.sources.dcgm.samples import DcgmStats, Sample, read_samples, sample_line
from faultlens.collectors.sources.gpu_deltas import DeltaThresholds, sample_changes
from faultlens.collectors.sources.pci import normalize_pci_bus_id
from faultlens.collectors.sources.source import NodeIdentity


class DcgmParser:
    """Parses scrapes; keeps what it saw per GPU between scrapes to report changes only once."""

    def __init__(self, *, thresholds: DeltaThresholds | None = None) -> None:
        self.stats = DcgmStats()
        self._thresholds = thresholds or DeltaThresholds()
        self._previous: dict[tuple[str | None, str | None], tuple[dict[str, Any], float]] = {}
        self._last_xid: dict[tuple[str | None, str | None], tuple[Any, ...]] = {}
        self._xid_counts: dict[tuple[Any, ...], float] = {}
        self._health: dict[tuple[Any, ...], float] = {}
        # the scrape's lines, split only when a bad sample needs its number
        self._lines: list[str] | None = None
        self._cursor = 0

    def count_bad(self, line_no: int, reason: str) -> None:
        """Count a sample or line left out (line number, 0 when unknown, and why); the first 10 are
        kept.
        """
        self.stats.bad_lines += 1
        if len(self.stats.bad_examples) < 10:
            self.stats.bad_examples.append((line_no, reason))

    def parse(
        self,
        text: str,
        identity: NodeIdentity,
        *,
        ts_ns: int | None = None,
        monotonic: float | None = None,
        host_from_labels: bool = True,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(gpu_samples rows, gpu_events rows) of one scrape. Never raises: a sample that cannot be
        used is counted in stats.bad_lines (with its line number) and left out; the rest of the
        scrape is kept."""
        try:
            return self._parse(
                text, identity, ts_ns=ts_ns, monotonic=monotonic, host_from_labels=host_from_labels
            )
        except Exception as exc:  # a parser bug must not cost the agent its loop
            self.count_bad(0, f"{type(exc).__name__}: {str(exc)[:120]}")
            return [], []

    def _example_line(self, text: str, sample: Sample) -> int:
        """The line number of a bad sample where it is kept as an example (the first 10), else 0:
        only examples keep line numbers, and a lookup that finds nothing reads the whole scrape (a 4
        MB scrape of thousands of bad samples spent its time here)."""
        return self._line_of(text, sample) if len(self.stats.bad_examples) < 10 else 0

    def _line_of(self, text: str, sample: Sample) -> int:
        """The line number of a sample (looked up only for bad ones): the next line, from where the
        last lookup stopped (samples come in text order, so all lookups of a scrape together read it
        about once), that holds its name, labels and value."""
        if self._lines is None:
            self._lines = text.splitlines()
        number, self._cursor = sample_line(self._lines, self._cursor, sample)
        return number

    def _parse(
        self,
        text: str,
        identity: NodeIdentity,
        *,
        ts_ns: int | None,
        monotonic: float | None,
        host_from_labels: bool,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if not isinstance(text, str):
            raise TypeError(f"expected the scrape's text, got {type(text).__name__}")
        self.stats.scrapes += 1
        self._lines = None
        self._cursor = 0
        if len(text) > MAX_SCRAPE_CHARS:
            self.count_bad(0, f"scrape larger than {MAX_SCRAPE_CHARS // MIB} MiB: not read")
            return [], []
        now_ns = ts_ns if ts_ns is not None else time.time_ns()
        now_mono = monotonic if monotonic is not None else time.monotonic()
        try:
            samples = read_samples(text, self.stats, self.count_bad)
        except Exception as exc:
            self.count_bad(0, f"{type(exc).__name__}: {exc}")
            return [], []
        gpus: dict[tuple[str | None, str | None], dict[str, Any]] = {}
        events: list[dict[str, Any]] = []
        for sample in samples:
            self.stats.samples_read += 1
            try:
                self._one(sample, gpus, events, identity, now_ns, host_from_labels)
            except BadValue as exc:
                self.count_bad(self._example_line(text, sample), f"{sample.name}: {exc}")
            except Exception as exc:
                self.count_bad(self._example_line(text, sample),
                               f"{sample.name}: {type(exc).__name__}: {str(exc)[:120]}")
        rows = []
        for key, row in gpus.items():
            values = row.pop("_values")
            free, reserved = row.pop("_fb_free", None), row.pop("_fb_reserved", None)
            if (
                values.get("mem_total_bytes") is None
                and free is not None
                and values.get("mem_used_bytes") is not None
            ):
                total = values["mem_used_bytes"] + free * MIB + (reserved or 0) * MIB
                try:
                    values["mem_total_bytes"] = column_value("mem_total_bytes", total)
                except BadValue as exc:
                    self.count_bad(0, f"FB_USED + FB_FREE + FB_RESERVED: {exc}")
            row.update(values)
            rows.append(row)
            previous = self._previous.get(key)
            elapsed = now_mono - previous[1] if previous else None
            for change in sample_changes(
                previous[0] if previous else None, values, elapsed, self._thresholds
            ):
                events.append(self._event(row, change.kind, change.code, change.message, row["ts"]))
            self._previous[key] = (dict(values), now_mono)
        return rows, events

    def _identity(self, labels: Mapping[str, str], identity: NodeIdentity, ts_ns: int,
                  host_from_labels: bool) -> dict[str, Any]:
        columns = identity.columns()
        host = labels.get("hostname") or labels.get("Hostname")
        if host_from_labels and host:
            columns["node"] = host
        index = labels.get("gpu")
        gpu_index = int(index) if index and index.isdigit() and len(index) <= 6 else None
        return {"ts": ts_ns, **columns, "gpu_index": gpu_index,
                "gpu_uuid": labels.get("UUID") or labels.get("uuid") or None,
                "pci_bus_id": normalize_pci_bus_id(labels.get("pci_bus_id"))}

    @staticmethod
    def _event(base: Mapping[str, Any], kind: str, code: int | None, message: str, ts_ns: int,
               raw: str | None = None) -> dict[str, Any]:
        keys = ("cluster", "node", "job_id", "attempt", "gpu_index", "gpu_uuid", "pci_bus_id")
        return {
            "ts": ts_ns,
            **{k: base.get(k) for k in keys},
            "source": "dcgm",
            "kind": kind,
            "code": code,
            "message": message,
            "raw": raw,
        }

    def _one(self, sample: Sample, gpus: dict[Any, dict[str, Any]], events: list[dict[str, Any]],
             identity: NodeIdentity, now_ns: int, host_from_labels: bool) -> None:
        labels = sample.labels
        for name, value in labels.items():
            if not (name + value).isascii():
                try:
                    (name + value).encode("utf-8")
                except UnicodeEncodeError:
                    raise BadValue(f"label {name[:40]!r} is not valid text") from None
        ts = now_ns
        if sample.timestamp:
            stamp = float(sample.timestamp) * 1e9
            if not (math.isfinite(stamp) and 0 <= stamp <= MAX_TS_NS):
                raise BadValue(f"timestamp {sample.timestamp} is out of range")
            ts = int(stamp)
        base = self._identity(labels, identity, ts, host_from_labels)
        key = (
            base["gpu_uuid"]
            or base["pci_bus_id"]
            or (str(base["gpu_index"]) if base["gpu_index"] is not None else None),
            base["node"],
        )
        raw = f"{sample.name}{dict(labels)} {sample.value}"
        if sample.name == XID_COUNT_METRIC:
            self._xid_count(sample, base, key, events, ts, raw)
            return
        if sample.name == HEALTH_METRIC:
            self._health_status(sample, base, key, events, ts, raw)
            return
        short = short_name(sample.name)
        if short in XID_LAST_METRICS:
            self._xid_last(sample, base, key, events, ts, raw)
            return
        if short in ("FB_FREE", "FB_RESERVED"):
            if not no_data(sample.value):
                value = float(sample.value)
                if not (math.isfinite(value) and abs(value) * MIB <= INT64_MAX):
                    raise BadValue(f"{short}: {value:g} MiB is out of range")
                row = self._row(gpus, key, base, labels)
                row["_fb_free" if short == "FB_FREE" else "_fb_reserved"] = value
            return
        mapped = SAMPLE_METRICS.get(short)
        if mapped is None:
            self.stats.unmapped += 1
            return
        column, scale = mapped
        values = self._row(gpus, key, base, labels)["_values"]
        if no_data(sample.value):
            self.stats.blank_values += 1
            values.setdefault(column, None)
            return
        value: Any = column_value(column, sample.value * scale)
        if column in ADDITIVE_COLUMNS and values.get(column) is not None:
            value = column_value(column, value + values[column])
        self._row(gpus, key, base, labels)["_values"][column] = value

    def _row(self, gpus: dict[Any, dict[str, Any]], key: Any, base: Mapping[str, Any],
             labels: Mapping[str, str]) -> dict[str, Any]:
        row = gpus.get(key)
        if row is None:
            row = {
                **base,
                "source": "dcgm",
                "gpu_name": labels.get("modelName") or None,
                "_values": {},
            }
            gpus[key] = row
        return row

    def _xid_last(
        self,
        sample: Sample,
        base: Mapping[str, Any],
        key: Any,
        events: list[dict[str, Any]],
        ts: int,
        raw: str,
    ) -> None:
        if no_data(sample.value) or sample.value <= 0:
            return
        code_text = sample.labels.get("err_code")
        code = int(code_text) if code_text and code_text.isdigit() and len(code_text) <= 9 else None
        if code is None:
            if code_text or not (math.isfinite(sample.value) and sample.value <= INT32_MAX):
                raise BadValue(f"Xid {code_text or sample.value!r} is not an Xid number")
            code = int(sample.value)
        state = (code, sample.labels.get("err_msg"), sample.timestamp)
        if self._last_xid.get(key) == state:
            return
        self._last_xid[key] = state
        message = sample.labels.get("err_msg") or "last Xid reported by DCGM"
        events.append(self._event(base, "xid", code, message, ts, raw))

    def _xid_count(
        self,
        sample: Sample,
        base: Mapping[str, Any],
        key: Any,
        events: list[dict[str, Any]],
        ts: int,
        raw: str,
    ) -> None:
        xid = sample.labels.get("xid")
        if no_data(sample.value) or not xid or not xid.isdigit():
            return
        if len(xid) > 9:
            raise BadValue(f"xid label {xid[:20]!r} is not an Xid number")
        # -Inf, then any count: int(inf) in the message
        if not (math.isfinite(sample.value) and sample.value >= 0):
            raise BadValue(f"Xid {xid} count {sample.value!r} is not a count")
        count_key = (key, xid, sample.labels.get("window_size_in_ms"))
        before = self._xid_counts.get(count_key, 0.0)
        self._xid_counts[count_key] = sample.value
        if sample.value > before:
            window = sample.labels.get("window_size_in_ms")
            events.append(self._event(base, "xid", int(xid),
                                      f"{int(sample.value - before)} Xid {xid} in the last "
                                      f"{window} ms (DCGM count)",
                                      ts, raw))

    def _health_status(
        self,
        sample: Sample,
        base: Mapping[str, Any],
        key: Any,
        events: list[dict[str, Any]],
        ts: int,
        raw: str,
    ) -> None:
        if no_data(sample.value):
            return
        error = sample.labels.get("health_error_code") or ""
        watch = sample.labels.get("health_watch") or "?"
        health_key = (key, watch, error)
        before = self._health.get(health_key, 0.0)
        self._health[health_key] = sample.value
        if sample.value <= 0 or sample.value == before:
            return
        mapped = HEALTH_KINDS.get(error)
        if mapped is None:
            self.stats.unmapped += 1
            return
        kind, code = mapped
        word = HEALTH_WORDS.get(int(sample.value), str(sample.value))
        events.append(
            self._event(base, kind, code, f"DCGM health {watch} {word}: {error}", ts, raw)
        )
