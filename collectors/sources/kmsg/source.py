"""KmsgSource: the node agent's Source of gpu_events from /dev/kmsg or a followed log file (rotation
and truncation reopen it; bad lines reported at most once a minute; never raises)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from faultlens.collectors.sources.gpu_backend import GpuDevice
from faultlens.collectors.sources.kmsg.parser import KernelLogParser
from faultlens.collectors.sources.kmsg.rows import device_directory, events_to_rows
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.row_guard import guarded_batch

log = logging.getLogger("faultlens.collectors.sources.kmsg")
_MAX_LINE = 64 * 1024  # the longest line the parser accepts


def boot_time_ns() -> int:
    """Wall-clock time of this machine's boot (printk stamps count from it, like CLOCK_MONOTONIC).
    """
    return time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class KmsgSource:
    """Source of gpu_events from the kernel log: /dev/kmsg (a character device: one record per read)
    or a text / JSON log file followed like `tail -F` (rotation and truncation reopen it).

    `from_start`: read what is already there (default: only what is logged from now on).
    """

    name = "kmsg"

    def __init__(
        self,
        identity: NodeIdentity,
        path: str | Path = "/dev/kmsg",
        *,
        from_start: bool = False,
        boot_time: int | None = None,
        tz: dt.tzinfo | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        devices: Iterable[GpuDevice] = (),
        max_lines_per_poll: int = 100_000,
        logger: logging.Logger | None = None,
    ) -> None:
        self.identity = identity
        self.path = str(path)
        self.from_start = from_start
        self._clock_ns = clock_ns
        self._log = logger or log
        self._max_lines = max_lines_per_poll
        self.parser = KernelLogParser(
            boot_time_ns=boot_time if boot_time is not None else boot_time_ns(), tz=tz
        )
        self._devices = device_directory(devices)
        self._fd: int | None = None
        self._file: Any = None
        self._inode: int | None = None
        self._partial = b""
        self._overlong = False  # inside a line longer than _MAX_LINE, already cut
        self._is_device = False
        self._unavailable: str | None = None
        self._opened_once = False
        # lines read since the file (or device) was opened: the line number of bad-line reports
        self._line_no = 0
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
            # rotated or truncated: finish nothing more from the old file, start the new one from
            # its beginning
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
        if self._overlong and lines:  # the rest of a line already cut: dropped
            lines.pop(0)
            self._overlong = False
        if len(self._partial) > _MAX_LINE:
            # a line longer than the parser keeps: never held whole (a line of hundreds of MB
            # grew the agent's memory with it); cut here, the parser counts it as one bad line
            if not self._overlong:
                lines.append(self._partial[:_MAX_LINE + 1])
            self._partial, self._overlong = b"", True
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
                rows = events_to_rows(
                    events, self.identity, devices=self._devices, default_ts_ns=self._clock_ns()
                )
                batch, rejected = guarded_batch(
                    "gpu_events", rows, [event.line_no for event in events]
                )
                for row in rejected:
                    self.parser.reject(events[row.index], row.reason)
            self._report_bad()
            return {"gpu_events": batch} if batch is not None else {}
        except Exception as exc:  # never raise into the agent
            self._log.warning("kmsg source: %s: %s", type(exc).__name__, exc)
            return {}

    def _report_bad(self) -> None:
        """Log skipped lines: at most once per bad_log_interval_s, with how many since the last
        report.
        """
        stats = self.parser.stats
        new = stats.bad_lines - self._bad_reported
        if new <= 0:
            return
        now = time.monotonic()
        if self._bad_logged_at is not None and now - self._bad_logged_at < self.bad_log_interval_s:
            return
        line_no, reason = stats.bad_examples[-1] if stats.bad_examples else (None, "?")
        self._log.warning(
            "kernel log %s: skipped %d bad line(s) (%d in all), e.g. line %s: %s",
            self.path,
            new,
            stats.bad_lines,
            line_no,
            reason,
        )
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
        self._overlong = False

    def close(self) -> None:
        self._close_handles()
