"""One-shot import of a whole kernel-log file (`faultlens ingest kmsg`): its rows and parse counts,
or an error naming the file.

The file is read as a stream in blocks, never whole, so what it costs is bounded whatever it holds
(a multi-GB dmesg took ~25x the file in memory): a line longer than the parser accepts (64 KiB) is
skipped as it is read, never kept, and counted as a bad line; lines with NUL bytes or bytes that are
not UTF-8 are parsed as text (a crash leaves NUL blocks in syslog files) and counted; a file larger
than `max_bytes` is read from its last `max_bytes` (the newest lines); at most `max_events` GPU
events are imported. Each of these is a note in the import (KernelLogImport.notes), one line naming
the file, so nothing is skipped silently. Only regular files are read (a FIFO or /dev/kmsg would
block or never end: the node agent's kmsg source follows those).
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.kmsg.events import KernelGpuEvent, ParseStats
from faultlens.collectors.sources.kmsg.parser import KernelLogParser
from faultlens.collectors.sources.kmsg.rows import device_directory, events_to_rows
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch
from faultlens.errors import FaultlensError

#: bytes of a file read (its last ones, where it holds more)
MAX_BYTES = 2 << 30
#: GPU events imported from one file (a real log holds dozens to thousands)
MAX_EVENTS = 200_000
#: the longest line kept (the parser refuses longer ones as bad lines)
MAX_LINE = 64 * 1024
_BLOCK = 4 << 20


class KernelLogFileError(ValueError, FaultlensError):
    """A kernel-log file given for a one-shot import cannot be used: the message names the file."""


@dataclass(frozen=True)
class KernelLogImport:
    rows: list[dict[str, Any]]
    stats: ParseStats
    # one line each, naming the file: what was read differently or skipped (long lines, NUL bytes,
    # bytes that are not UTF-8, the part of the file before max_bytes, events beyond max_events)
    notes: tuple[str, ...] = ()


@dataclass
class _Counts:
    long_lines: int = 0
    long_first: int | None = None
    nul_lines: int = 0
    nul_first: int | None = None
    not_utf8: int = 0
    not_utf8_first: int | None = None
    events_dropped: int = 0
    head_skipped: int = 0
    notes: list[str] = field(default_factory=list)


def _lines(handle: BinaryIO, max_line: int) -> Iterator[bytes]:
    """The file's lines (without the newline), each at most max_line + 1 bytes: a longer line is
    cut there as it is read (the parser then counts it bad), the rest of it skipped unread into
    memory."""
    partial = b""
    overlong = False  # inside a line already cut
    while True:
        block = handle.read(_BLOCK)
        if not block:
            break
        start = 0
        while True:
            end = block.find(b"\n", start)
            if end < 0:
                if not overlong:
                    partial += block[start:]
                    if len(partial) > max_line:
                        yield partial[:max_line + 1]
                        partial, overlong = b"", True
                break
            if overlong:
                overlong = False
            else:
                line = partial + block[start:end] if partial else block[start:end]
                partial = b""
                yield line if len(line) <= max_line else line[:max_line + 1]
            start = end + 1
    if partial and not overlong:
        yield partial


def _note_line(line: bytes, number: int, counts: _Counts, max_line: int) -> None:
    if len(line) > max_line:
        counts.long_lines += 1
        counts.long_first = counts.long_first or number
    if b"\x00" in line:
        counts.nul_lines += 1
        counts.nul_first = counts.nul_first or number
    elif not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            counts.not_utf8 += 1
            counts.not_utf8_first = counts.not_utf8_first or number


def _open(file: Path, max_bytes: int) -> tuple[BinaryIO, int, int]:
    """The file opened (never blocking), its size, and the offset reading starts at."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise KernelLogFileError(f"kmsg {file}: is a directory, expected a log file") from None
    except OSError as exc:
        raise KernelLogFileError(f"kmsg {file}: cannot read: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        os.close(fd)
        raise KernelLogFileError(f"kmsg {file}: is a directory, expected a log file")
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise KernelLogFileError(f"kmsg {file}: not a regular file (a FIFO or device such as "
                                 "/dev/kmsg is followed by the node agent, `faultlens agent`)")
    handle = open(fd, "rb")  # noqa: SIM115 - closed by the caller
    start = 0
    if info.st_size > max_bytes:
        start = info.st_size - max_bytes
        handle.seek(start)
        handle.readline(MAX_LINE)  # to the start of a line (a cut first line is skipped)
        start = handle.tell()
    return handle, info.st_size, start


def _notes(file: Path, counts: _Counts, size: int, max_events: int) -> list[str]:
    notes = []
    if counts.head_skipped:
        notes.append(f"kmsg {file}: {size} bytes: read only the last {size - counts.head_skipped} "
                     f"(the first {counts.head_skipped} bytes skipped; limit max_bytes)")
    if counts.long_lines:
        notes.append(f"kmsg {file}: {counts.long_lines} line(s) longer than {MAX_LINE} bytes "
                     f"skipped, first at line {counts.long_first}")
    if counts.nul_lines:
        notes.append(f"kmsg {file}: {counts.nul_lines} line(s) with NUL bytes (binary data) read "
                     f"as text, first at line {counts.nul_first}")
    if counts.not_utf8:
        notes.append(f"kmsg {file}: {counts.not_utf8} line(s) not valid UTF-8 read with "
                     f"replacement characters, first at line {counts.not_utf8_first}")
    if counts.events_dropped:
        notes.append(f"kmsg {file}: {counts.events_dropped} GPU event(s) beyond the first "
                     f"{max_events} not imported (limit max_events)")
    return notes


def read_kernel_log(path: str | Path, identity: NodeIdentity, *, host_from_line: bool = True,
                    boot_time: int | None = None, tz: dt.tzinfo | None = None,
                    devices: Iterable[GpuDevice] = (), max_bytes: int = MAX_BYTES,
                    max_events: int = MAX_EVENTS) -> KernelLogImport:
    """Parse a kernel-log file (text, /dev/kmsg records or journalctl -k -o json) as a stream.
    Raises KernelLogFileError when the file cannot be read, is not a regular file, is binary (NUL
    bytes at its start and no GPU event), or holds bad lines and no good one. What was skipped or
    read differently is in the result's notes (module docstring)."""
    file = Path(path)
    handle, size, start = _open(file, max_bytes)
    counts = _Counts(head_skipped=start)
    parser = KernelLogParser(boot_time_ns=boot_time, tz=tz)
    events: list[KernelGpuEvent] = []
    head_binary = False
    offset = 0  # bytes of lines read so far (the first 64 KiB tell a binary file)
    try:
        with handle:
            for number, line in enumerate(_lines(handle, MAX_LINE), start=1):
                if offset < 65536 and b"\x00" in line:
                    head_binary = True
                offset += len(line) + 1
                _note_line(line, number, counts, MAX_LINE)
                found = parser.feed(line, number)
                if found:
                    room = max_events - len(events)
                    events.extend(found[:room])
                    counts.events_dropped += max(0, len(found) - room)
    except OSError as exc:
        raise KernelLogFileError(f"kmsg {file}: cannot read: {exc.strerror or exc}") from None
    if head_binary and not events:
        raise KernelLogFileError(f"kmsg {file}: binary data (NUL bytes), expected a text or JSON "
                                 "kernel log")
    rows = events_to_rows(
        events, identity, devices=device_directory(devices), host_from_line=host_from_line
    )
    _, rejected = guarded_batch("gpu_events", rows, [event.line_no for event in events])
    if rejected:
        for row in rejected:
            parser.reject(events[row.index], row.reason)
        refused = {row.index for row in rejected}
        rows = [row for index, row in enumerate(rows) if index not in refused]
    stats = parser.stats
    if stats.bad_lines and not rows:
        line_no, reason = stats.bad_examples[0]
        raise KernelLogFileError(f"kmsg {file}: no GPU event could be read: {stats.bad_lines} bad "
                                 "line(s), "
                                 f"first at line {line_no}: {reason}")
    return KernelLogImport(rows=rows, stats=stats,
                           notes=tuple(_notes(file, counts, size, max_events)))
