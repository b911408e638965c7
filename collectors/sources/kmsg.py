"""Kernel-log GPU events: the parser (NVIDIA driver Xid lines, NVSwitch SXid lines, "GPU has fallen off the bus",
row-remapper messages) and the source that reads /dev/kmsg, a log file, or `journalctl -k -o json` output.

Line shapes accepted (each may carry any of the prefixes below):
    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error ...
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.
    NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149
    NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=..., name=..., ...      (MIG)
    NVRM: Xid (0000:01:00): 31, Ch 00000001, ...                                  (very old drivers, no "PCI:")
    NVRM: Xid (PCI:0018:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (...)
    nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV error (First)
    NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.                           (no Xid line)
    NVRM: The NVIDIA GPU 0000:18:00.0 / ... has fallen off the bus and is not responding to commands. (multi-line)
    NVRM: GPU at PCI:0000:2b:00: GPU-6a6d...                                      (remembered: PCI -> UUID)
Prefixes: /dev/kmsg records (`6,1234,5678901234,-;msg`), `journalctl -k -o json` objects, syslog
(`Nov 30 12:00:00 host kernel: [ 12.345] msg`), ISO timestamps (`2026-11-30T12:00:00.123+00:00 host kernel: msg`),
`dmesg -T` (`[Mon Nov 30 12:00:00 2026] msg`) and plain dmesg (`[  12.345678] msg`, relative to boot).

An Xid line is one `xid` event; the Xids that state a GPU condition also give the kind the engine keys on (the same
raw line): 48 -> ecc_dbe, 63 with "Row Remapper" -> remap_pending (without: retired_page_pending), 64 with
"Row Remapper" -> remap_failure, 79 -> gpu_lost, 154 -> recovery_action (code = the new action). A line that looks
like a GPU line but cannot be parsed is counted as bad and skipped; other lines are ignored. Nothing raises.
"""

from __future__ import annotations

import calendar
import contextlib
import datetime as dt
import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from faultlens.collectors.errors import FaultlensError
from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.pci import normalize_pci_bus_id
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch

log = logging.getLogger("faultlens.collectors.sources.kmsg")

_PCI = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>" + _PCI + r")(?:\s+GPU-I:(?P<gi>\d{1,4}))?(?:\s+GPU-CI:(?P<ci>\d{1,4}))?\):\s*"
    r"(?P<code>\d{1,6})\s*(?:,\s*(?P<rest>.*))?$"
)
SXID_RE = re.compile(
    r"(?P<dev>nvidia-nvswitch\d+): SXid \((?:PCI:)?(?P<pci>" + _PCI + r")\):\s*(?P<code>\d{1,6})\s*"
    r"(?:,\s*(?P<rest>.*))?$"
)
# Every pattern below runs in time linear in the line's length: no two adjacent quantifiers can share characters
# unboundedly (the old `name=[^,]*?\s*` and `\d+\s*\.?\s*$` forms backtracked quadratically: 169 s for a 64 KB
# line), and the parts that repeat inside a message (`recovery action changed ...`) have bounded quantifiers.
PID_RE = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|'?\d{1,24}'?)[ \t]*(?:,[ \t]*|$)")
CAUSED_BY_RE = re.compile(r"caused by previous Xid (?P<code>\d{1,10})\Z")
RECOVERY_RE = re.compile(r"recovery action changed from (?P<from>0x[0-9A-Fa-f]{1,16}|\d{1,10})"
                         r"(?:[ \t]{0,8}\((?P<from_name>[^)]{0,120})\))?"
                         r"[ \t]{1,8}to[ \t]{1,8}(?P<to>0x[0-9A-Fa-f]{1,16}|\d{1,10})"
                         r"(?:[ \t]{0,8}\((?P<to_name>[^)]{0,120})\))?")
UUID_RE = re.compile(r"NVRM: GPU at PCI:(?P<pci>" + _PCI + r"):\s*(?P<uuid>GPU-[0-9A-Fa-f-]+)")
FALLEN_RE = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>" + _PCI + r"):?\s*GPU has fallen off the bus")
THE_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (?:at )?(?:PCI:)?(?P<pci>" + _PCI + r")")
ANY_PCI_RE = re.compile(r"(?<![0-9A-Fa-f:])(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")

KMSG_RE = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<us>\d+),(?P<flags>[^;]*);(?P<msg>.*)$")
ISO_RE = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+"
                    r"(?P<host>\S+)\s+(?P<msg>.*)$")
SYSLOG_RE = re.compile(r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\s+(?P<day>\d{1,2})\s+"
                       r"(?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d+))?\s+(?P<host>\S+)\s+(?P<msg>.*)$")
DMESG_T_RE = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s+(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+"
                        r"(?P<time>\d{2}:\d{2}:\d{2})\s+(?P<year>\d{4})\]\s?(?P<msg>.*)$")
DMESG_REL_RE = re.compile(r"^\[\s*(?P<rel>\d+\.\d+)\]\s?(?P<msg>.*)$")
KERNEL_TAG_RE = re.compile(r"^kernel:\s*(?:\[\s*\d+\.\d+\]\s*)?")
_MONTHS = {name: number for number, name in enumerate(calendar.month_abbr) if name}
_MULTILINE_WINDOW = 4  # lines after "The NVIDIA GPU <pci>" in which "fallen off the bus" belongs to it
_MAX_LINE = 64 * 1024
_MAX_PID = 2**31 - 1  # Linux pids are at most 2^22 (PID_MAX_LIMIT); anything past int32 is not a pid
_MIN_TS_NS, _MAX_TS_NS = 0, 2**63 - 1  # what the store's timestamp[ns] column holds (1970 .. 2262)


@dataclass(frozen=True)
class KernelGpuEvent:
    """One GPU event read from the kernel log (a gpu_events row before identity is added)."""

    kind: str  # xid, sxid, gpu_lost, ecc_dbe, remap_pending, remap_failure, retired_page_pending, recovery_action
    code: int | None
    pci_bus_id: str | None  # NVML form 00000000:BB:DD.F
    message: str
    raw: str
    pid: int | None = None
    process_name: str | None = None
    ts_ns: int | None = None
    host: str | None = None
    gpu_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    caused_by_xid: int | None = None
    device: str | None = None  # nvidia-nvswitchN for SXid
    line_no: int | None = None


@dataclass
class ParseStats:
    lines: int = 0
    events: int = 0
    bad_lines: int = 0
    ignored: int = 0
    bad_examples: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason), first 10


@dataclass(frozen=True)
class _Envelope:
    message: str
    ts_ns: int | None
    host: str | None


class _BadLine(ValueError, FaultlensError):
    pass


def _split_name(rest: str) -> tuple[str | None, str]:
    """`name=<process>, <message>` -> (process name or None, message): the name runs to the first comma."""
    body = rest[len("name="):]
    comma = body.find(",")
    name, after = (body, "") if comma < 0 else (body[:comma], body[comma + 1:])
    name = name.strip()
    return (None if not name or name == "<unknown>" else name), after.lstrip()


def _caused_by(message: str) -> int | None:
    """The Xid of a trailing `caused by previous Xid <n>` (optionally followed by one '.')."""
    tail = message.rstrip()
    if tail.endswith("."):
        tail = tail[:-1].rstrip()
    match = CAUSED_BY_RE.search(tail[-48:])
    return int(match.group("code")) if match else None


def _check_text(what: str, value: str | None) -> None:
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _BadLine(f"{what} is not valid text ({exc.reason} at character {exc.start})") from None


def _check_event(event: KernelGpuEvent) -> None:
    """Refuse an event the store cannot hold (so that one bad line never fails the whole poll's batch)."""
    if event.ts_ns is not None and not _MIN_TS_NS <= event.ts_ns <= _MAX_TS_NS:
        raise _BadLine("time out of range (the store holds 1970..2262)")
    if event.pid is not None and not 0 <= event.pid <= _MAX_PID:
        raise _BadLine(f"pid out of range: {event.pid}")
    for what in ("message", "raw", "process_name", "host", "gpu_uuid", "device"):
        _check_text(what, getattr(event, what))


def _interesting(text: str) -> bool:
    return "NVRM" in text or "SXid" in text or "fallen off the bus" in text


class KernelLogParser:
    """Stateful line parser (it remembers PCI -> UUID lines and multi-line "fallen off the bus" messages).

    `boot_time_ns`: wall-clock time of boot, for /dev/kmsg records and plain dmesg lines (None: those lines get no
    time and the source stamps them when read). `tz`: the zone of syslog / dmesg -T times (default: local).
    `now`: the clock used to pick the year of syslog lines (which carry none).
    """

    def __init__(self, *, boot_time_ns: int | None = None, tz: dt.tzinfo | None = None,
                 now: Callable[[], float] = time.time) -> None:
        self.boot_time_ns = boot_time_ns
        self.tz = tz
        self._now = now
        self.stats = ParseStats()
        self.uuids: dict[str, str] = {}
        self._pending_pci: str | None = None
        self._pending_left = 0
        self._lost_reported: dict[str, int] = {}
        self._line_no: int | None = None

    # -- envelope (prefixes) -------------------------------------------------------------------------------------
    def _local(self, year: int, month: int, day: int, hms: str, frac: str | None) -> int:
        hour, minute, second = (int(part) for part in hms.split(":"))
        moment = dt.datetime(year, month, day, hour, minute, second)
        moment = moment.replace(tzinfo=self.tz) if self.tz is not None else moment.astimezone()
        micro = int((frac or "0")[:6].ljust(6, "0"))
        return int(moment.timestamp()) * 1_000_000_000 + micro * 1000

    def _envelope(self, line: str) -> _Envelope | None:
        """Strip the transport prefix; None for lines to ignore (kmsg continuation lines)."""
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise _BadLine(f"not a JSON object: {exc}") from None
            if not isinstance(record, dict):
                raise _BadLine("not a JSON object")
            message = record.get("MESSAGE")
            if isinstance(message, list):  # journald encodes non-UTF-8 messages as byte arrays
                try:
                    message = bytes(message).decode("utf-8", "replace")
                except (TypeError, ValueError):
                    raise _BadLine("MESSAGE is not text or bytes") from None
            if not isinstance(message, str):
                raise _BadLine("journal record without a MESSAGE string")
            ts_ns = None
            realtime = record.get("__REALTIME_TIMESTAMP")
            if isinstance(realtime, (str, int)) and str(realtime).isdigit():
                ts_ns = int(realtime) * 1000
            host = record.get("_HOSTNAME")
            return _Envelope(message, ts_ns, host if isinstance(host, str) else None)
        if line.startswith((" ", "\t")) and "=" in line and ";" not in line:
            return None  # /dev/kmsg dictionary continuation (" SUBSYSTEM=pci")
        match = KMSG_RE.match(line)
        if match:
            ts_ns = None
            if self.boot_time_ns is not None:
                ts_ns = self.boot_time_ns + int(match.group("us")) * 1000
            return _Envelope(match.group("msg"), ts_ns, None)
        match = ISO_RE.match(line)
        if match:
            try:
                moment = dt.datetime.fromisoformat(match.group("ts").replace(",", "."))
            except ValueError:
                moment = None
            ts_ns = None
            if moment is not None:
                if moment.tzinfo is None:
                    moment = moment.replace(tzinfo=self.tz) if self.tz is not None else moment.astimezone()
                ts_ns = int(moment.timestamp() * 1_000_000) * 1000
            return _Envelope(KERNEL_TAG_RE.sub("", match.group("msg")), ts_ns, match.group("host"))
        match = SYSLOG_RE.match(line)
        if match:
            month = _MONTHS[match.group("mon")]
            day = int(match.group("day"))
            today = dt.datetime.fromtimestamp(self._now(), self.tz or dt.UTC)
            year = today.year if (month, day) <= (today.month, today.day) else today.year - 1
            try:
                ts_ns = self._local(year, month, day, match.group("time"), match.group("frac"))
            except ValueError:
                ts_ns = None
            return _Envelope(KERNEL_TAG_RE.sub("", match.group("msg")), ts_ns, match.group("host"))
        match = DMESG_T_RE.match(line)
        if match and match.group("mon") in _MONTHS:
            try:
                ts_ns = self._local(int(match.group("year")), _MONTHS[match.group("mon")], int(match.group("day")),
                                    match.group("time"), None)
            except ValueError:
                ts_ns = None
            return _Envelope(match.group("msg"), ts_ns, None)
        match = DMESG_REL_RE.match(line)
        if match:
            ts_ns = None
            if self.boot_time_ns is not None:
                ts_ns = self.boot_time_ns + int(float(match.group("rel")) * 1e6) * 1000
            return _Envelope(match.group("msg"), ts_ns, None)
        return _Envelope(line, None, None)

    # -- messages ------------------------------------------------------------------------------------------------
    def _xid(self, match: re.Match[str], env: _Envelope, raw: str) -> list[KernelGpuEvent]:
        pci = normalize_pci_bus_id(match.group("pci"))
        if pci is None:
            raise _BadLine(f"Xid line with a PCI address that is not one: {match.group('pci')!r}")
        code = int(match.group("code"))
        rest = (match.group("rest") or "").strip()
        pid: int | None = None
        name: str | None = None
        pid_match = PID_RE.match(rest)
        if pid_match:
            value = pid_match.group("pid").strip("'")
            pid = int(value) if value.isdigit() else None
            if pid is not None and pid > _MAX_PID:
                raise _BadLine(f"Xid line with a pid out of range: {value[:24]}")
            rest = rest[pid_match.end():]
            if rest.startswith("name="):
                name, rest = _split_name(rest)
        elif rest.startswith("pid="):
            raise _BadLine("Xid line with an unreadable pid")
        message = rest.strip()
        caused = _caused_by(message)
        event = KernelGpuEvent(
            kind="xid", code=code, pci_bus_id=pci, message=message, raw=raw, pid=pid, process_name=name,
            ts_ns=env.ts_ns, host=env.host, gpu_uuid=self.uuids.get(pci), line_no=self._line_no,
            gpu_instance_id=int(match.group("gi")) if match.group("gi") else None,
            compute_instance_id=int(match.group("ci")) if match.group("ci") else None,
            caused_by_xid=caused,
        )
        return [event, *self._derived(event)]

    def _derived(self, event: KernelGpuEvent) -> list[KernelGpuEvent]:
        code, text = event.code, event.message
        kind: str | None = None
        derived_code: int | None = None
        if code == 48:
            kind = "ecc_dbe"
        elif code == 63:
            kind = "remap_pending" if "Row Remapper" in text else "retired_page_pending"
        elif code == 64 and "Row Remapper" in text:
            kind = "remap_failure"
        elif code == 79:
            kind = "gpu_lost"
            if event.pci_bus_id is not None:
                self._lost_reported[event.pci_bus_id] = self.stats.lines
        elif code == 154:
            recovery = RECOVERY_RE.search(text)
            if recovery is None:
                return []
            kind = "recovery_action"
            target = recovery.group("to")
            derived_code = int(target, 16) if target[:2] in ("0x", "0X") else int(target)  # "01" is 1, not an error
            if derived_code > _MAX_PID:  # an int32 column; the driver's actions are 0..4
                raise _BadLine(f"recovery action out of range: {recovery.group('to')}")
        if kind is None:
            return []
        return [replace(event, kind=kind, code=derived_code, message=f"Xid {code}: {text}")]

    def _sxid(self, match: re.Match[str], env: _Envelope, raw: str) -> list[KernelGpuEvent]:
        pci = normalize_pci_bus_id(match.group("pci"))
        if pci is None:
            raise _BadLine(f"SXid line with a PCI address that is not one: {match.group('pci')!r}")
        rest = (match.group("rest") or "").strip()
        if rest.startswith(("Severity ", "Data {", "Data{")):
            return []  # continuation lines of the SXid just reported
        return [KernelGpuEvent(kind="sxid", code=int(match.group("code")), pci_bus_id=pci, message=rest, raw=raw,
                               ts_ns=env.ts_ns, host=env.host, device=match.group("dev"), line_no=self._line_no)]

    def _fallen(self, pci: str | None, env: _Envelope, raw: str, message: str) -> list[KernelGpuEvent]:
        if pci is not None:
            last = self._lost_reported.get(pci)
            if last is not None and self.stats.lines - last <= _MULTILINE_WINDOW:
                return []  # same incident as a line just reported (Xid 79 or the multi-line form)
            self._lost_reported[pci] = self.stats.lines
        text = message.split("NVRM:", 1)[-1].strip()
        return [KernelGpuEvent(kind="gpu_lost", code=None, pci_bus_id=pci, message=text, raw=raw, ts_ns=env.ts_ns,
                               host=env.host, gpu_uuid=self.uuids.get(pci) if pci else None, line_no=self._line_no)]

    def _message(self, env: _Envelope, raw: str) -> list[KernelGpuEvent] | None:
        """Events of one message; None when the message is not a GPU line."""
        text = env.message
        if "Xid" in text:
            match = SXID_RE.search(text)
            if match:
                return self._sxid(match, env, raw)
            match = XID_RE.search(text)
            if match:
                return self._xid(match, env, raw)
            if "NVRM: Xid" in text or "SXid (" in text:
                raise _BadLine("Xid line that does not match the driver's format")
        match = UUID_RE.search(text)
        if match:
            pci = normalize_pci_bus_id(match.group("pci"))
            if pci is not None:
                self.uuids[pci] = match.group("uuid")
            return []
        match = THE_GPU_RE.search(text)
        if match:
            self._pending_pci = normalize_pci_bus_id(match.group("pci"))
            self._pending_left = _MULTILINE_WINDOW
        if "fallen off the bus" in text:
            match = FALLEN_RE.search(text)
            pci = normalize_pci_bus_id(match.group("pci")) if match else None
            if pci is None:
                any_pci = ANY_PCI_RE.search(text)
                pci = normalize_pci_bus_id(any_pci.group("pci")) if any_pci else None
            if pci is None and self._pending_left > 0:
                pci = self._pending_pci
            if pci is None and "NVRM" not in text:
                return None
            return self._fallen(pci, env, raw, text)
        if self._pending_left > 0:
            self._pending_left -= 1
        return None

    # -- public --------------------------------------------------------------------------------------------------
    def feed(self, line: str | bytes, line_no: int | None = None) -> list[KernelGpuEvent]:
        """Parse one line; returns its events ([] for most lines). Never raises."""
        self.stats.lines += 1
        self._line_no = line_no
        try:
            if isinstance(line, bytes):
                line = line.decode("utf-8", "replace")
            line = line.rstrip("\r\n")
            if len(line) > _MAX_LINE:
                raise _BadLine(f"line longer than {_MAX_LINE} characters")
            if not _interesting(line) and not line.startswith("{"):
                self.stats.ignored += 1
                return []
            if line.startswith("{") and not _interesting(line) and '"MESSAGE":[' not in line.replace(" ", ""):
                self.stats.ignored += 1
                return []
            env = self._envelope(line)
            if env is None:
                self.stats.ignored += 1
                return []
            events = self._message(env, line)
            for event in events or ():
                _check_event(event)
        except _BadLine as exc:
            self._bad(line_no, str(exc))
            return []
        except Exception as exc:  # a parser bug must not stop the collector
            self._bad(line_no, f"{type(exc).__name__}: {exc}")
            return []
        if events is None:
            self.stats.ignored += 1
            return []
        self.stats.events += len(events)
        return events

    def reject(self, event: KernelGpuEvent, reason: str) -> None:
        """Count an event the store refused as a bad line (its line number and why)."""
        self.stats.events -= 1
        self._bad(event.line_no, reason)

    def _bad(self, line_no: int | None, reason: str) -> None:
        self.stats.bad_lines += 1
        if len(self.stats.bad_examples) < 10:
            self.stats.bad_examples.append((line_no if line_no is not None else self.stats.lines, reason))

    def feed_lines(self, lines: Iterable[str | bytes]) -> list[KernelGpuEvent]:
        events: list[KernelGpuEvent] = []
        for number, line in enumerate(lines, start=1):
            events.extend(self.feed(line, number))
        return events


def boot_time_ns() -> int:
    """Wall-clock time of this machine's boot (printk stamps count from it, like CLOCK_MONOTONIC)."""
    return time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def device_directory(devices: Iterable[GpuDevice]) -> dict[str, GpuDevice]:
    return {device.pci_bus_id: device for device in devices if device.pci_bus_id}


def events_to_rows(events: Iterable[KernelGpuEvent], identity: NodeIdentity, *,
                   devices: Mapping[str, GpuDevice] | None = None, default_ts_ns: int | None = None,
                   host_from_line: bool = False) -> list[dict[str, Any]]:
    """gpu_events rows (source kmsg). `devices` maps NVML bus ids to GPUs so rows carry gpu_index and uuid;
    `host_from_line` takes the node from the line's hostname (syslog, journal) when it has one."""
    rows = []
    now = default_ts_ns if default_ts_ns is not None else time.time_ns()
    for event in events:
        device = devices.get(event.pci_bus_id) if devices and event.pci_bus_id else None
        columns = identity.columns()
        if host_from_line and event.host:
            columns["node"] = event.host
        rows.append({
            "ts": event.ts_ns if event.ts_ns is not None else now, **columns,
            "gpu_index": device.index if device else None,
            "gpu_uuid": (device.uuid if device else None) or event.gpu_uuid,
            "pci_bus_id": event.pci_bus_id, "source": "kmsg", "kind": event.kind, "code": event.code,
            "message": event.message, "pid": event.pid, "process_name": event.process_name, "raw": event.raw,
        })
    return rows


class KmsgSource:
    """Source of gpu_events from the kernel log: /dev/kmsg (a character device: one record per read) or a text /
    JSON log file followed like `tail -F` (rotation and truncation reopen it).

    `from_start`: read what is already there (default: only what is logged from now on).
    """

    name = "kmsg"

    def __init__(self, identity: NodeIdentity, path: str | Path = "/dev/kmsg", *, from_start: bool = False,
                 boot_time: int | None = None, tz: dt.tzinfo | None = None,
                 clock_ns: Callable[[], int] = time.time_ns, devices: Iterable[GpuDevice] = (),
                 max_lines_per_poll: int = 100_000, logger: logging.Logger | None = None) -> None:
        self.identity = identity
        self.path = str(path)
        self.from_start = from_start
        self._clock_ns = clock_ns
        self._log = logger or log
        self._max_lines = max_lines_per_poll
        self.parser = KernelLogParser(boot_time_ns=boot_time if boot_time is not None else boot_time_ns(), tz=tz)
        self._devices = device_directory(devices)
        self._fd: int | None = None
        self._file: Any = None
        self._inode: int | None = None
        self._partial = b""
        self._is_device = False
        self._unavailable: str | None = None
        self._opened_once = False
        self._line_no = 0  # lines read since the file (or device) was opened: the line number of bad-line reports
        self._bad_reported = 0
        self._bad_logged_at: float | None = None
        self.bad_log_interval_s = 60.0

    def set_devices(self, devices: Iterable[GpuDevice]) -> None:
        """GPUs of this node (from NVML), so kernel-log rows carry gpu_index and uuid."""
        self._devices = device_directory(devices)

    def _open(self) -> bool:
        if self._fd is not None or self._file is not None:
            return True
        try:
            info = os.stat(self.path)
            self._is_device = stat.S_ISCHR(info.st_mode)
            if self._is_device:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
                if not self.from_start and not self._opened_once:
                    os.lseek(fd, 0, os.SEEK_END)
                self._fd = fd
            else:
                handle = open(self.path, "rb")  # noqa: SIM115 - kept open between polls
                if not self.from_start and not self._opened_once:
                    handle.seek(0, os.SEEK_END)
                self._file = handle
                self._inode = info.st_ino
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if self._unavailable != reason:
                self._log.warning("kernel log %s unavailable: %s", self.path, reason)
            self._unavailable = reason
            return False
        self._opened_once = True
        self._unavailable = None
        return True

    def _read_device(self) -> list[bytes]:
        records: list[bytes] = []
        if self._fd is None:
            return records
        while len(records) < self._max_lines:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # EPIPE: records were overwritten before we read them; go on
                continue
            except OSError as exc:
                self._log.warning("reading %s: %s", self.path, exc.strerror or exc)
                self._close_handles()
                break
            if not record:
                break
            records.append(record)
        return records

    def _read_file(self) -> list[bytes]:
        try:
            info = os.stat(self.path)
        except OSError:
            info = None
        handle = self._file
        if info is not None and (info.st_ino != self._inode or info.st_size < handle.tell()):
            # rotated or truncated: finish nothing more from the old file, start the new one from its beginning
            self._close_handles()
            self.from_start = True
            self._line_no = 0
            if not self._open():
                return []
            handle = self._file
        data = handle.read(8 * 1024 * 1024)
        if not data:
            return []
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return lines

    def poll(self) -> Mapping[str, pa.RecordBatch]:
        try:
            if not self._open():
                return {}
            raw_lines = self._read_device() if self._is_device else self._read_file()
            if not raw_lines:
                return {}
            events = []
            for raw in raw_lines:
                self._line_no += 1
                events.extend(self.parser.feed(raw, self._line_no))
            batch = None
            if events:
                rows = events_to_rows(events, self.identity, devices=self._devices, default_ts_ns=self._clock_ns())
                batch, rejected = guarded_batch("gpu_events", rows, [event.line_no for event in events])
                for row in rejected:
                    self.parser.reject(events[row.index], row.reason)
            self._report_bad()
            return {"gpu_events": batch} if batch is not None else {}
        except Exception as exc:  # never raise into the agent
            self._log.warning("kmsg source: %s: %s", type(exc).__name__, exc)
            return {}

    def _report_bad(self) -> None:
        """Log skipped lines: at most once per bad_log_interval_s, with how many since the last report."""
        stats = self.parser.stats
        new = stats.bad_lines - self._bad_reported
        if new <= 0:
            return
        now = time.monotonic()
        if self._bad_logged_at is not None and now - self._bad_logged_at < self.bad_log_interval_s:
            return
        line_no, reason = stats.bad_examples[-1] if stats.bad_examples else (None, "?")
        self._log.warning("kernel log %s: skipped %d bad line(s) (%d in all), e.g. line %s: %s", self.path, new,
                          stats.bad_lines, line_no, reason)
        self._bad_reported = stats.bad_lines
        self._bad_logged_at = now

    def _close_handles(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        self._partial = b""

    def close(self) -> None:
        self._close_handles()


class KernelLogFileError(ValueError, FaultlensError):
    """A kernel-log file given for a one-shot import cannot be used: the message names the file."""


@dataclass(frozen=True)
class KernelLogImport:
    rows: list[dict[str, Any]]
    stats: ParseStats


def read_kernel_log(path: str | Path, identity: NodeIdentity, *, host_from_line: bool = True,
                    boot_time: int | None = None, tz: dt.tzinfo | None = None,
                    devices: Iterable[GpuDevice] = ()) -> KernelLogImport:
    """Parse a whole kernel-log file (text, /dev/kmsg records or journalctl -k -o json). Raises KernelLogFileError
    when the file cannot be read, is binary, or holds bad lines and no good one."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except IsADirectoryError:
        raise KernelLogFileError(f"kmsg {file}: is a directory, expected a log file") from None
    except OSError as exc:
        raise KernelLogFileError(f"kmsg {file}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in data[:65536]:
        raise KernelLogFileError(f"kmsg {file}: binary data (NUL bytes), expected a text or JSON kernel log")
    parser = KernelLogParser(boot_time_ns=boot_time, tz=tz)
    events = parser.feed_lines(data.splitlines())
    rows = events_to_rows(events, identity, devices=device_directory(devices), host_from_line=host_from_line)
    _, rejected = guarded_batch("gpu_events", rows, [event.line_no for event in events])
    if rejected:
        for row in rejected:
            parser.reject(events[row.index], row.reason)
        refused = {row.index for row in rejected}
        rows = [row for index, row in enumerate(rows) if index not in refused]
    stats = parser.stats
    if stats.bad_lines and not rows:
        line_no, reason = stats.bad_examples[0]
        raise KernelLogFileError(f"kmsg {file}: no GPU event could be read: {stats.bad_lines} bad line(s), "
                                 f"first at line {line_no}: {reason}")
    return KernelLogImport(rows=rows, stats=stats)
