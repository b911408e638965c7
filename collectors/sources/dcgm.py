"""dcgm-exporter scrapes (Prometheus text, from a file or an HTTP URL) -> gpu_samples and gpu_events.

Metric names: both DCGM's old and new field names are accepted (DCGM 4.6 renamed XID_ERRORS -> XID_ERROR,
ROW_REMAP_FAILURE -> ROW_REMAP_FAILED, RETIRED_* -> PAGE_RETIRED_*, CLOCK_THROTTLE_REASONS -> CLOCKS_EVENT_REASONS).
Labels: `gpu` (index), `UUID` (or `uuid` in the old namespace), `pci_bus_id`, `modelName`, `hostname` or
`Hostname` (renamed in May 2026), MIG labels ignored for device fields. Values >= 9223372036854775792 are DCGM's
blank sentinels: no data (null). Events: XID_ERRORS (a gauge holding the last Xid: reported when it changes),
DCGM_EXP_XID_ERRORS_COUNT (per-Xid count in a window: reported when it rises), DCGM_EXP_GPU_HEALTH_STATUS (WARN/FAIL
with a DCGM_FR_* code mapped to a gpu_events kind), and changes between scrapes of the same GPU (gpu_deltas).

Lines are parsed with prometheus_client's parser; a scrape that does not parse as a whole is parsed line by line,
bad lines counted and skipped. Nothing raises into the agent.
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from faultlens.collectors.errors import FaultlensError
from faultlens.collectors.sources.gpu_deltas import DeltaThresholds, sample_changes
from faultlens.collectors.sources.pci import normalize_pci_bus_id
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch

log = logging.getLogger("faultlens.collectors.sources.dcgm")

DCGM_BLANK_MIN = 9223372036854775792  # DCGM_INT64_BLANK and the NOT_FOUND / NOT_SUPPORTED / ... sentinels above it
MIB = 1024 * 1024
MAX_SCRAPE_CHARS = 64 * MIB  # what fetch_scrape reads of a response; a real scrape is ~100 KB per node
MAX_LINE_CHARS = 4096  # a dcgm-exporter line is a few hundred characters (labels included)
_WHITESPACE_RUN = re.compile(r"\s+")

# metric name (without the DCGM_FI_DEV_ prefix) -> (gpu_samples column, scale)
SAMPLE_METRICS: dict[str, tuple[str, float]] = {
    "GPU_TEMP": ("temp_c", 1), "MEMORY_TEMP": ("hbm_temp_c", 1), "POWER_USAGE": ("power_w", 1),
    "TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1), "SM_CLOCK": ("sm_clock_mhz", 1),
    "MEM_CLOCK": ("mem_clock_mhz", 1), "GPU_UTIL": ("gpu_util_pct", 1), "MEM_COPY_UTIL": ("mem_util_pct", 1),
    "FB_USED": ("mem_used_bytes", MIB), "FB_TOTAL": ("mem_total_bytes", MIB),
    "CLOCK_THROTTLE_REASONS": ("clocks_event_reasons", 1), "CLOCKS_EVENT_REASONS": ("clocks_event_reasons", 1),
    "ECC_SBE_VOL_TOTAL": ("ecc_sbe_volatile", 1), "ECC_DBE_VOL_TOTAL": ("ecc_dbe_volatile", 1),
    "ECC_SBE_AGG_TOTAL": ("ecc_sbe_aggregate", 1), "ECC_DBE_AGG_TOTAL": ("ecc_dbe_aggregate", 1),
    "RETIRED_SBE": ("retired_pages_sbe", 1), "PAGE_RETIRED_SBE": ("retired_pages_sbe", 1),
    "RETIRED_DBE": ("retired_pages_dbe", 1), "PAGE_RETIRED_DBE": ("retired_pages_dbe", 1),
    "RETIRED_PENDING": ("retired_pages_pending", 1), "PAGE_RETIRED_PENDING": ("retired_pages_pending", 1),
    "CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", 1),
    "UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", 1),
    "ROW_REMAP_PENDING": ("remap_pending", 1), "ROW_REMAP_FAILURE": ("remap_failure", 1),
    "ROW_REMAP_FAILED": ("remap_failure", 1), "GET_GPU_RECOVERY_ACTION": ("recovery_action", 1),
    "PCIE_REPLAY_COUNTER": ("pcie_replay_count", 1),
    "NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("nvlink_replay_errors", 1),
    "NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("nvlink_recovery_errors", 1),
    "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("nvlink_crc_errors", 1),
    "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("nvlink_crc_errors", 1),  # added to the flit count
}
_ADDITIVE = {"nvlink_crc_errors"}
_BOOLEAN = {"retired_pages_pending", "remap_pending", "remap_failure"}
_INTEGER = {"energy_mj", "sm_clock_mhz", "mem_clock_mhz", "mem_used_bytes", "mem_total_bytes",
            "clocks_event_reasons", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
            "retired_pages_sbe", "retired_pages_dbe", "remapped_rows_correctable", "remapped_rows_uncorrectable",
            "recovery_action", "pcie_replay_count", "nvlink_replay_errors", "nvlink_recovery_errors",
            "nvlink_crc_errors"}
XID_LAST_METRICS = ("XID_ERRORS", "XID_ERROR")
XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"
HEALTH_METRIC = "DCGM_EXP_GPU_HEALTH_STATUS"

# DCGM_FR_* health error codes -> (gpu_events kind, code)
HEALTH_KINDS: dict[str, tuple[str, int | None]] = {
    "DCGM_FR_VOLATILE_DBE_DETECTED": ("ecc_dbe", None), "DCGM_FR_DBE_VIOLATION": ("ecc_dbe", None),
    "DCGM_FR_VOLATILE_SBE_DETECTED": ("ecc_sbe_storm", None),
    "DCGM_FR_PENDING_PAGE_RETIREMENTS": ("retired_page_pending", None),
    "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS": ("retired_page_pending", None),
    "DCGM_FR_PENDING_ROW_REMAP": ("remap_pending", None), "DCGM_FR_ROW_REMAP_FAILURE": ("remap_failure", None),
    "DCGM_FR_FALLEN_OFF_BUS": ("gpu_lost", None), "DCGM_FR_UNCONTAINED_ERROR": ("xid", 95),
    "DCGM_FR_XID_ERROR": ("xid", None), "DCGM_FR_SXID_ERROR": ("sxid", None),
    "DCGM_FR_NVLINK_ERROR_THRESHOLD": ("nvlink_error", None), "DCGM_FR_NVLINK_ERROR_CRITICAL": ("nvlink_error", None),
    "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD": ("nvlink_error", None), "DCGM_FR_NVLINK_DOWN": ("nvlink_error", None),
    "DCGM_FR_PCI_REPLAY_RATE": ("pcie_replay", None),
    "DCGM_FR_CLOCK_THROTTLE_THERMAL": ("thermal_slowdown_start", None),
    "DCGM_FR_CLOCKS_EVENT_THERMAL": ("thermal_slowdown_start", None),
    "DCGM_FR_CLOCK_THROTTLE_POWER": ("power_slowdown_start", None),
    "DCGM_FR_CLOCKS_EVENT_POWER": ("power_slowdown_start", None),
    "DCGM_FR_GPU_RECOVERY_RESET": ("recovery_action", 1), "DCGM_FR_GPU_RECOVERY_REBOOT": ("recovery_action", 2),
    "DCGM_FR_GPU_RECOVERY_DRAIN_P2P": ("recovery_action", 3),
    "DCGM_FR_GPU_RECOVERY_DRAIN_RESET": ("recovery_action", 4),
}
HEALTH_WORDS = {10: "WARN", 20: "FAIL"}
_INT32_COLUMNS = {"sm_clock_mhz", "mem_clock_mhz", "recovery_action"}
_INT32_MAX, _INT64_MAX, _FLOAT32_MAX = 2**31 - 1, 2**63 - 1, 3.4e38
_MAX_TS_NS = 2**63 - 1


class _BadValue(ValueError, FaultlensError):
    """A sample value its column cannot hold (3e9 MHz in an int32, -1e303 MiB): the sample is left out."""


def _column_value(column: str, value: float | int) -> Any:
    """`value` (already scaled) as `column` stores it, or _BadValue."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if column in _BOOLEAN:
            return bool(value)
        limit = _INT32_MAX if column in _INT32_COLUMNS else _INT64_MAX
        if column in _INTEGER and not -limit <= value <= limit:
            raise _BadValue(f"{column}: {value} is out of range")
        if column not in _INTEGER and abs(value) > _FLOAT32_MAX:
            raise _BadValue(f"{column}: {value} is out of range")
        return value if column in _INTEGER else float(value)
    if not math.isfinite(value):
        raise _BadValue(f"{column}: {value} is not a finite number")
    if column in _BOOLEAN:
        return bool(value)
    if column in _INTEGER:
        limit = _INT32_MAX if column in _INT32_COLUMNS else _INT64_MAX
        if not -limit <= value <= limit:
            raise _BadValue(f"{column}: {value:g} is out of range")
        return int(value)
    if abs(value) > _FLOAT32_MAX:
        raise _BadValue(f"{column}: {value:g} is out of range")
    return float(value)


class DcgmFetchError(OSError, FaultlensError):
    """A scrape cannot be fetched or read: the message names the file or URL."""


@dataclass
class DcgmStats:
    scrapes: int = 0
    lines: int = 0
    samples_read: int = 0
    bad_lines: int = 0
    blank_values: int = 0
    unmapped: int = 0
    bad_examples: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None


def _no_data(value: Any) -> bool:
    if value is None:
        return True
    try:
        if isinstance(value, float) and math.isnan(value):
            return True
        return value >= DCGM_BLANK_MIN
    except TypeError:
        return True


def _short(name: str) -> str:
    if name.endswith("_total"):  # prometheus_client adds _total to the samples of a counter family
        name = name[: -len("_total")]
    for prefix in ("DCGM_FI_DEV_", "DCGM_FI_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


class DcgmParser:
    """Parses scrapes; keeps what it saw per GPU between scrapes to report changes only once."""

    def __init__(self, *, thresholds: DeltaThresholds | None = None) -> None:
        self.stats = DcgmStats()
        self._thresholds = thresholds or DeltaThresholds()
        self._previous: dict[tuple[str | None, str | None], tuple[dict[str, Any], float]] = {}
        self._last_xid: dict[tuple[str | None, str | None], tuple[Any, ...]] = {}
        self._xid_counts: dict[tuple[Any, ...], float] = {}
        self._health: dict[tuple[Any, ...], float] = {}
        self._lines: list[str] | None = None  # the scrape's lines, split only when a bad sample needs its number
        self._cursor = 0

    def _bad(self, line_no: int, reason: str) -> None:
        self.stats.bad_lines += 1
        if len(self.stats.bad_examples) < 10:
            self.stats.bad_examples.append((line_no, reason))

    def _samples(self, text: str) -> list[_Sample]:
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        self.stats.lines += len(lines)
        # prometheus_client's text parser is quadratic in the whitespace-separated tokens of a line: a 30 KB comment
        # line of tabs takes seconds. Lines longer than a real exporter writes are bad lines; comment lines keep one
        # space between words. Everything after this is linear in the scrape.
        cleaned = False
        for index, line in enumerate(lines):
            if len(line) > MAX_LINE_CHARS:
                self._bad(index + 1, f"line longer than {MAX_LINE_CHARS} characters")
                lines[index] = ""
                cleaned = True
            elif line.startswith("#") and ("  " in line or "\t" in line):
                lines[index] = _WHITESPACE_RUN.sub(" ", line)
                cleaned = True
        if cleaned:
            text = "\n".join(lines) + "\n"
        try:
            return [_Sample(s.name, s.labels, s.value, s.timestamp)
                    for family in text_string_to_metric_families(text) for s in family.samples]
        except Exception:
            pass
        samples = []
        for number, line in enumerate(lines, start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            try:
                for family in text_string_to_metric_families(stripped + "\n"):
                    samples.extend(_Sample(s.name, s.labels, s.value, s.timestamp) for s in family.samples)
            except Exception as exc:
                self._bad(number, f"{type(exc).__name__}: {str(exc)[:120]}")
        return samples

    def parse(self, text: str, identity: NodeIdentity, *, ts_ns: int | None = None, monotonic: float | None = None,
              host_from_labels: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(gpu_samples rows, gpu_events rows) of one scrape. Never raises: a sample that cannot be used is counted
        in stats.bad_lines (with its line number) and left out; the rest of the scrape is kept."""
        try:
            return self._parse(text, identity, ts_ns=ts_ns, monotonic=monotonic, host_from_labels=host_from_labels)
        except Exception as exc:  # a parser bug must not cost the agent its loop
            self._bad(0, f"{type(exc).__name__}: {str(exc)[:120]}")
            return [], []

    def _example_line(self, text: str, sample: _Sample) -> int:
        """The line number of a bad sample where it is kept as an example (the first 10), else 0: only examples keep
        line numbers, and a lookup that finds nothing reads the whole scrape (a 4 MB scrape of thousands of bad
        samples spent its time here)."""
        return self._line_of(text, sample) if len(self.stats.bad_examples) < 10 else 0

    def _line_of(self, text: str, sample: _Sample) -> int:
        """The line number of a sample (looked up only for bad ones): the next line, from where the last lookup
        stopped (samples come in text order, so all lookups of a scrape together read it about once), that holds
        its name, labels and value."""
        if self._lines is None:
            self._lines = text.splitlines()
        lines = self._lines
        values = [f'"{value}"' for value in sample.labels.values()]
        order = list(range(self._cursor, len(lines))) + list(range(0, min(self._cursor, len(lines))))
        for index in order:
            line = lines[index]
            number = index + 1
            if not (line.startswith(sample.name) and all(value in line for value in values)):
                continue
            try:
                parsed = [s for family in text_string_to_metric_families(line + "\n") for s in family.samples]
            except Exception:
                continue
            same = [s for s in parsed if s.labels == sample.labels and s.timestamp == sample.timestamp
                    and (s.value == sample.value or (s.value != s.value and sample.value != sample.value))]
            if same:
                self._cursor = index + 1
                return number
        return 0

    def _parse(self, text: str, identity: NodeIdentity, *, ts_ns: int | None, monotonic: float | None,
               host_from_labels: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if not isinstance(text, str):
            raise TypeError(f"expected the scrape's text, got {type(text).__name__}")
        self.stats.scrapes += 1
        self._lines = None
        self._cursor = 0
        if len(text) > MAX_SCRAPE_CHARS:
            self._bad(0, f"scrape larger than {MAX_SCRAPE_CHARS // MIB} MiB: not read")
            return [], []
        now_ns = ts_ns if ts_ns is not None else time.time_ns()
        now_mono = monotonic if monotonic is not None else time.monotonic()
        try:
            samples = self._samples(text)
        except Exception as exc:
            self._bad(0, f"{type(exc).__name__}: {exc}")
            return [], []
        gpus: dict[tuple[str | None, str | None], dict[str, Any]] = {}
        events: list[dict[str, Any]] = []
        for sample in samples:
            self.stats.samples_read += 1
            try:
                self._one(sample, gpus, events, identity, now_ns, host_from_labels)
            except _BadValue as exc:
                self._bad(self._example_line(text, sample), f"{sample.name}: {exc}")
            except Exception as exc:
                self._bad(self._example_line(text, sample), f"{sample.name}: {type(exc).__name__}: {str(exc)[:120]}")
        rows = []
        for key, row in gpus.items():
            values = row.pop("_values")
            free, reserved = row.pop("_fb_free", None), row.pop("_fb_reserved", None)
            if values.get("mem_total_bytes") is None and free is not None and values.get("mem_used_bytes") is not None:
                total = values["mem_used_bytes"] + free * MIB + (reserved or 0) * MIB
                try:
                    values["mem_total_bytes"] = _column_value("mem_total_bytes", total)
                except _BadValue as exc:
                    self._bad(0, f"FB_USED + FB_FREE + FB_RESERVED: {exc}")
            row.update(values)
            rows.append(row)
            previous = self._previous.get(key)
            elapsed = now_mono - previous[1] if previous else None
            for change in sample_changes(previous[0] if previous else None, values, elapsed, self._thresholds):
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
        return {"ts": ts_ns, **{k: base.get(k) for k in keys}, "source": "dcgm", "kind": kind, "code": code,
                "message": message, "raw": raw}

    def _one(self, sample: _Sample, gpus: dict[Any, dict[str, Any]], events: list[dict[str, Any]],
             identity: NodeIdentity, now_ns: int, host_from_labels: bool) -> None:
        labels = sample.labels
        for name, value in labels.items():
            if not (name + value).isascii():
                try:
                    (name + value).encode("utf-8")
                except UnicodeEncodeError:
                    raise _BadValue(f"label {name[:40]!r} is not valid text") from None
        ts = now_ns
        if sample.timestamp:
            stamp = float(sample.timestamp) * 1e9
            if not (math.isfinite(stamp) and 0 <= stamp <= _MAX_TS_NS):
                raise _BadValue(f"timestamp {sample.timestamp} is out of range")
            ts = int(stamp)
        base = self._identity(labels, identity, ts, host_from_labels)
        key = (base["gpu_uuid"] or base["pci_bus_id"] or (str(base["gpu_index"]) if base["gpu_index"] is not None
                                                            else None), base["node"])
        raw = f"{sample.name}{dict(labels)} {sample.value}"
        if sample.name == XID_COUNT_METRIC:
            self._xid_count(sample, base, key, events, ts, raw)
            return
        if sample.name == HEALTH_METRIC:
            self._health_status(sample, base, key, events, ts, raw)
            return
        short = _short(sample.name)
        if short in XID_LAST_METRICS:
            self._xid_last(sample, base, key, events, ts, raw)
            return
        if short in ("FB_FREE", "FB_RESERVED"):
            if not _no_data(sample.value):
                value = float(sample.value)
                if not (math.isfinite(value) and abs(value) * MIB <= _INT64_MAX):
                    raise _BadValue(f"{short}: {value:g} MiB is out of range")
                row = self._row(gpus, key, base, labels)
                row["_fb_free" if short == "FB_FREE" else "_fb_reserved"] = value
            return
        mapped = SAMPLE_METRICS.get(short)
        if mapped is None:
            self.stats.unmapped += 1
            return
        column, scale = mapped
        values = self._row(gpus, key, base, labels)["_values"]
        if _no_data(sample.value):
            self.stats.blank_values += 1
            values.setdefault(column, None)
            return
        value: Any = _column_value(column, sample.value * scale)
        if column in _ADDITIVE and values.get(column) is not None:
            value = _column_value(column, value + values[column])
        self._row(gpus, key, base, labels)["_values"][column] = value

    def _row(self, gpus: dict[Any, dict[str, Any]], key: Any, base: Mapping[str, Any],
             labels: Mapping[str, str]) -> dict[str, Any]:
        row = gpus.get(key)
        if row is None:
            row = {**base, "source": "dcgm", "gpu_name": labels.get("modelName") or None, "_values": {}}
            gpus[key] = row
        return row

    def _xid_last(self, sample: _Sample, base: Mapping[str, Any], key: Any, events: list[dict[str, Any]], ts: int,
                  raw: str) -> None:
        if _no_data(sample.value) or sample.value <= 0:
            return
        code_text = sample.labels.get("err_code")
        code = int(code_text) if code_text and code_text.isdigit() and len(code_text) <= 9 else None
        if code is None:
            if code_text or not (math.isfinite(sample.value) and sample.value <= _INT32_MAX):
                raise _BadValue(f"Xid {code_text or sample.value!r} is not an Xid number")
            code = int(sample.value)
        state = (code, sample.labels.get("err_msg"), sample.timestamp)
        if self._last_xid.get(key) == state:
            return
        self._last_xid[key] = state
        message = sample.labels.get("err_msg") or "last Xid reported by DCGM"
        events.append(self._event(base, "xid", code, message, ts, raw))

    def _xid_count(self, sample: _Sample, base: Mapping[str, Any], key: Any, events: list[dict[str, Any]], ts: int,
                   raw: str) -> None:
        xid = sample.labels.get("xid")
        if _no_data(sample.value) or not xid or not xid.isdigit():
            return
        if len(xid) > 9:
            raise _BadValue(f"xid label {xid[:20]!r} is not an Xid number")
        if not (math.isfinite(sample.value) and sample.value >= 0):  # -Inf, then any count: int(inf) in the message
            raise _BadValue(f"Xid {xid} count {sample.value!r} is not a count")
        count_key = (key, xid, sample.labels.get("window_size_in_ms"))
        before = self._xid_counts.get(count_key, 0.0)
        self._xid_counts[count_key] = sample.value
        if sample.value > before:
            window = sample.labels.get("window_size_in_ms")
            events.append(self._event(base, "xid", int(xid),
                                      f"{int(sample.value - before)} Xid {xid} in the last {window} ms (DCGM count)",
                                      ts, raw))

    def _health_status(self, sample: _Sample, base: Mapping[str, Any], key: Any, events: list[dict[str, Any]],
                       ts: int, raw: str) -> None:
        if _no_data(sample.value):
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
        events.append(self._event(base, kind, code, f"DCGM health {watch} {word}: {error}", ts, raw))


def fetch_scrape(location: str, *, timeout_s: float = 5.0) -> str:
    """The text of a scrape: an http(s) URL is fetched, anything else is read as a file. Raises DcgmFetchError."""
    if location.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(location, timeout=timeout_s) as response:
                body = response.read(MAX_SCRAPE_CHARS)
                charset = response.headers.get_content_charset() or "utf-8"
        except urllib.error.HTTPError as exc:
            raise DcgmFetchError(f"dcgm {location}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DcgmFetchError(f"dcgm {location}: cannot fetch: {reason}") from None
        try:
            return body.decode(charset, "strict")
        except (UnicodeDecodeError, LookupError):
            raise DcgmFetchError(f"dcgm {location}: the response is not {charset} text") from None
    file = Path(location)
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_SCRAPE_CHARS + 1)
    except IsADirectoryError:
        raise DcgmFetchError(f"dcgm {file}: is a directory, expected a scrape file") from None
    except OSError as exc:
        raise DcgmFetchError(f"dcgm {file}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_SCRAPE_CHARS:
        raise DcgmFetchError(f"dcgm {file}: larger than {MAX_SCRAPE_CHARS // MIB} MiB, not a scrape")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DcgmFetchError(f"dcgm {file}: not UTF-8 text (byte {exc.start})") from None


class DcgmSource:
    """Source of gpu_samples/gpu_events from a dcgm-exporter endpoint (or a file rewritten by something else)."""

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
            samples, events = self.parser.parse(text, self.identity, ts_ns=self._clock_ns(),
                                                monotonic=self._monotonic(), host_from_labels=self._host_from_labels)
            result: dict[str, pa.RecordBatch] = {}
            for table, rows in (("gpu_samples", samples), ("gpu_events", events)):
                batch, rejected = guarded_batch(table, rows)
                for row in rejected:
                    self.parser._bad(0, f"{table} row refused: {row.reason}")
                if batch is not None:
                    result[table] = batch
            bad = self.parser.stats.bad_lines - self._bad_reported
            if bad > 0:
                now = self._monotonic()
                if self._bad_logged_at is None or now - self._bad_logged_at >= self.bad_log_interval_s:
                    line_no, reason = self.parser.stats.bad_examples[-1] if self.parser.stats.bad_examples else (0, "")
                    self._log.warning("dcgm %s: skipped %d bad sample(s) (%d in all), e.g. line %s: %s",
                                      self.location, bad, self.parser.stats.bad_lines, line_no, reason)
                    self._bad_reported = self.parser.stats.bad_lines
                    self._bad_logged_at = now
            return result
        except Exception as exc:  # never raise into the agent
            self._log.warning("dcgm source: %s: %s", type(exc).__name__, exc)
            return {}

    def close(self) -> None:
        return None


def read_scrape(location: str, identity: NodeIdentity, *, host_from_labels: bool = True,
                timeout_s: float = 5.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]], DcgmStats]:
    """One-shot import of a scrape. Raises DcgmFetchError when it cannot be read or holds no dcgm metric."""
    text = fetch_scrape(location, timeout_s=timeout_s)
    parser = DcgmParser()
    samples, events = parser.parse(text, identity, host_from_labels=host_from_labels)
    kept = {}
    for table, rows in (("gpu_samples", samples), ("gpu_events", events)):
        _, rejected = guarded_batch(table, rows)
        for row in rejected:
            parser._bad(0, f"{table} row refused: {row.reason}")
        refused = {row.index for row in rejected}
        kept[table] = [row for index, row in enumerate(rows) if index not in refused]
    samples, events = kept["gpu_samples"], kept["gpu_events"]
    if not samples and not events:
        stats = parser.stats
        detail = (f"{stats.bad_lines} bad line(s), first at line {stats.bad_examples[0][0]}: "
                  f"{stats.bad_examples[0][1]}") if stats.bad_examples else "no DCGM_FI_* / DCGM_EXP_* GPU metric"
        raise DcgmFetchError(f"dcgm {location}: not a dcgm-exporter scrape: {detail}")
    return samples, events, parser.stats

