"""One-shot import of a whole kernel-log file (`faultlens ingest kmsg`): its rows and parse counts,
or an error naming the file."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.kmsg.events import ParseStats
from faultlens.collectors.sources.kmsg.parser import KernelLogParser
from faultlens.collectors.sources.kmsg.rows import device_directory, events_to_rows
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch
from faultlens.errors import FaultlensError


class KernelLogFileError(ValueError, FaultlensError):
    """A kernel-log file given for a one-shot import cannot be used: the message names the file."""


@dataclass(frozen=True)
class KernelLogImport:
    rows: list[dict[str, Any]]
    stats: ParseStats


def read_kernel_log(path: str | Path, identity: NodeIdentity, *, host_from_line: bool = True,
                    boot_time: int | None = None, tz: dt.tzinfo | None = None,
                    devices: Iterable[GpuDevice] = ()) -> KernelLogImport:
    """Parse a whole kernel-log file (text, /dev/kmsg records or journalctl -k -o json). Raises
    KernelLogFileError when the file cannot be read, is binary, or holds bad lines and no good one.
    """
    file = Path(path)
    try:
        data = file.read_bytes()
    except IsADirectoryError:
        raise KernelLogFileError(f"kmsg {file}: is a directory, expected a log file") from None
    except OSError as exc:
        raise KernelLogFileError(f"kmsg {file}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in data[:65536]:
        raise KernelLogFileError(f"kmsg {file}: binary data (NUL bytes), expected a text or JSON "
                                 "kernel log")
    parser = KernelLogParser(boot_time_ns=boot_time, tz=tz)
    events = parser.feed_lines(data.splitlines())
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
    return KernelLogImport(rows=rows, stats=stats)
