"""The transport around a kernel-log message: /dev/kmsg records, `journalctl -k -o json` objects,
syslog, ISO timestamps, `dmesg -T` and plain dmesg prefixes stripped into the message, its time and
its host."""

from __future__ import annotations

import calendar
import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from faultlens.collectors.sources.kmsg.events import BadLine

KMSG_RE = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<us>\d+),(?P<flags>[^;]*);(?P<msg>.*)$")
ISO_RE = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}[T "
                    r"]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s+"
                    r"(?P<host>\S+)\s+(?P<msg>.*)$")
SYSLOG_RE = re.compile(
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\s+(?P<day>\d{1,2})\s+"
    r"(?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d+))?\s+(?P<host>\S+)\s+(?P<msg>.*)$"
)
DMESG_T_RE = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s+(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+"
    r"(?P<time>\d{2}:\d{2}:\d{2})\s+(?P<year>\d{4})\]\s?(?P<msg>.*)$"
)
DMESG_REL_RE = re.compile(r"^\[\s*(?P<rel>\d+\.\d+)\]\s?(?P<msg>.*)$")
KERNEL_TAG_RE = re.compile(r"^kernel:\s*(?:\[\s*\d+\.\d+\]\s*)?")
_MONTHS = {name: number for number, name in enumerate(calendar.month_abbr) if name}


@dataclass(frozen=True)
class Envelope:
    """A line's message with its transport stripped, the time the transport gave (ns; None: none)
    and its host.
    """

    message: str
    ts_ns: int | None
    host: str | None


def local_ns(
    year: int, month: int, day: int, hms: str, frac: str | None, tz: dt.tzinfo | None
) -> int:
    """A wall-clock time with no zone (syslog, dmesg -T) in `tz` (None: this machine's local zone),
    in ns.
    """
    hour, minute, second = (int(part) for part in hms.split(":"))
    moment = dt.datetime(year, month, day, hour, minute, second)
    moment = moment.replace(tzinfo=tz) if tz is not None else moment.astimezone()
    micro = int((frac or "0")[:6].ljust(6, "0"))
    return int(moment.timestamp()) * 1_000_000_000 + micro * 1000


def read_envelope(line: str, *, boot_time_ns: int | None, tz: dt.tzinfo | None,
                  now: Callable[[], float]) -> Envelope | None:
    """Strip the transport prefix; None for lines to ignore (kmsg continuation lines).
    `boot_time_ns` stamps /dev/kmsg records and plain dmesg lines (None: no time), `tz` is the zone
    of times that name none (None: local) and `now` picks the year of syslog lines."""
    if line.startswith("{"):
        return journal_envelope(line)
    if line.startswith((" ", "\t")) and "=" in line and ";" not in line:
        return None  # /dev/kmsg dictionary continuation (" SUBSYSTEM=pci")
    match = KMSG_RE.match(line)
    if match:
        ts_ns = None
        if boot_time_ns is not None:
            ts_ns = boot_time_ns + int(match.group("us")) * 1000
        return Envelope(match.group("msg"), ts_ns, None)
    match = ISO_RE.match(line)
    if match:
        try:
            moment = dt.datetime.fromisoformat(match.group("ts").replace(",", "."))
        except ValueError:
            moment = None
        ts_ns = None
        if moment is not None:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=tz) if tz is not None else moment.astimezone()
            ts_ns = int(moment.timestamp() * 1_000_000) * 1000
        return Envelope(KERNEL_TAG_RE.sub("", match.group("msg")), ts_ns, match.group("host"))
    match = SYSLOG_RE.match(line)
    if match:
        month = _MONTHS[match.group("mon")]
        day = int(match.group("day"))
        today = dt.datetime.fromtimestamp(now(), tz or dt.UTC)
        year = today.year if (month, day) <= (today.month, today.day) else today.year - 1
        try:
            ts_ns = local_ns(year, month, day, match.group("time"), match.group("frac"), tz)
        except ValueError:
            ts_ns = None
        return Envelope(KERNEL_TAG_RE.sub("", match.group("msg")), ts_ns, match.group("host"))
    match = DMESG_T_RE.match(line)
    if match and match.group("mon") in _MONTHS:
        try:
            ts_ns = local_ns(
                int(match.group("year")),
                _MONTHS[match.group("mon")],
                int(match.group("day")),
                match.group("time"),
                None,
                tz,
            )
        except ValueError:
            ts_ns = None
        return Envelope(match.group("msg"), ts_ns, None)
    match = DMESG_REL_RE.match(line)
    if match:
        ts_ns = None
        if boot_time_ns is not None:
            ts_ns = boot_time_ns + int(float(match.group("rel")) * 1e6) * 1000
        return Envelope(match.group("msg"), ts_ns, None)
    return Envelope(line, None, None)


def journal_envelope(line: str) -> Envelope:
    """One `journalctl -o json` object: MESSAGE (text, or the byte array journald writes for
    non-UTF-8), the realtime stamp (µs) and _HOSTNAME."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadLine(f"not a JSON object: {exc}") from None
    if not isinstance(record, dict):
        raise BadLine("not a JSON object")
    message = record.get("MESSAGE")
    if isinstance(message, list):  # journald encodes non-UTF-8 messages as byte arrays
        try:
            message = bytes(message).decode("utf-8", "replace")
        except (TypeError, ValueError):
            raise BadLine("MESSAGE is not text or bytes") from None
    if not isinstance(message, str):
        raise BadLine("journal record without a MESSAGE string")
    ts_ns = None
    realtime = record.get("__REALTIME_TIMESTAMP")
    if isinstance(realtime, (str, int)) and str(realtime).isdigit():
        ts_ns = int(realtime) * 1000
    host = record.get("_HOSTNAME")
    return Envelope(message, ts_ns, host if isinstance(host, str) else None)
