"""Heartbeats: a per-rank progress record the step timer keeps in shared memory, read into the
`heartbeats` table.

Progress must not be judged from how often step rows are flushed, so every rank's StepTimer also
keeps one small memory-mapped file, `<dir>/hb-<job>-a<attempt>-r<rank>.bin` (dir:
$FAULTLENS_HEARTBEAT_DIR, default /dev/shm/faultlens-heartbeats). The training thread updates it at
every step's begin and end with plain memory writes (no system call, no flush: ~1 us), so it is
exact at any flush interval and survives the process (a SIGKILL or SIGSEGV leaves the last completed
step in the page cache); the timer's writer thread stamps `alive_ns` about once a second. Layout
(little-endian): a 72-byte record under a sequence lock (odd while being written)

    magic "FLHB", version u32, seq u64, last_step i64 (-1: none), last_end_ns i64, steps u64,
    current_step i64 (-1: none), bad_loss_step i64 (-1: none), loss f64, flags u32 (1 in a step, 2
    closed, 4 loss known), phase u32 (of the step in progress: 0 unknown, 1 train, 2 eval, 3 warmup,
    4 checkpoint; written as 0 by writers before it existed)

then alive_ns i64 at 80, pid i64 at 88, and at 96 the rank's own work so far, stamped with alive_ns:
cpu_ns i64 (CPU time of the process and of the live child processes of the thread that runs the
steps, DataLoader workers, plus that thread's time in uninterruptible I/O), io_bytes i64 (bytes the
process read and wrote through system calls, less the writer's own reads of /proc), usage u32 (bit
1: cpu_ns known, bit 2: io_bytes known; 0 from writers before it existed); at 128 a u32 length and
the rank's identity as JSON (the identity columns of its rows). A rank blocked in a collective,
asleep or waiting on a lock or a read moves neither counter; one that saves, evaluates or loads does
(attribution/detectors/progress/together.py).

`read_heartbeat(path)` decodes one; HeartbeatSource (a collectors Source) lists a directory each
poll and emits a `heartbeats` row per rank whose record changed since the last row it emitted (at
most one per `min_interval_s`, except that closing and a first bad loss are emitted at once), and at
least every `keepalive_s` while `alive_ns` advances. A file whose process stopped stamping it more
than `max_age_s` ago when first seen is an old attempt's: skipped. A file that cannot be read is
counted and logged once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faultlens import environment
from faultlens.collectors.store.atomic import atomic_write

if TYPE_CHECKING:
    import pyarrow as pa

    from faultlens.collectors.sources.source import NodeIdentity

log = logging.getLogger(__name__)

ENV_DIR = environment.HEARTBEAT_DIR.name
MAGIC = b"FLHB"
VERSION = 1
SIZE = 1024
_RECORD = struct.Struct("<4sIQqqQqqdII")
_ALIVE = struct.Struct("<q")
_USAGE = struct.Struct("<qqI")
_ALIVE_AT, _PID_AT, _USAGE_AT, _IDENTITY_AT = 80, 88, 96, 128
CPU_KNOWN, IO_KNOWN = 1, 2
IN_STEP, CLOSED, HAS_LOSS = 1, 2, 4
#: the step timer's phases, as the record's phase field holds them (0: unknown, or a writer without
#: the field)
PHASE_CODES = {"train": 1, "eval": 2, "warmup": 3, "checkpoint": 4}
_PHASE_NAMES = {code: name for name, code in PHASE_CODES.items()}


def default_dir() -> Path:
    """$FAULTLENS_HEARTBEAT_DIR, else /dev/shm/faultlens-heartbeats (else under the temp directory).
    """
    configured = environment.HEARTBEAT_DIR.raw()
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / "faultlens-heartbeats"
    import tempfile

    return Path(tempfile.gettempdir()) / "faultlens-heartbeats"


def _part(value: Any) -> str:
    text = "_" if value is None else str(value)
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text)


def heartbeat_name(job_id: Any, attempt: Any, rank: Any) -> str:
    return f"hb-{_part(job_id)}-a{_part(attempt)}-r{_part(rank)}.bin"


class RankUsage:
    """The work a rank does, read from the writer thread (Linux /proc; None where unreadable): CPU
    time of the process (every thread: a save or an upload in a thread of its own counts) and of the
    live child processes of the thread that runs the steps (DataLoader workers), plus the time that
    thread spent in uninterruptible I/O (a slow disk works for it); and the bytes the process moved
    through read/write system calls, less what this reader read itself. A process blocked in a
    collective, asleep, or waiting on a lock, a pipe or a socket moves neither (measured: ~2 ms of
    CPU a second for faultlens' own threads). Never raises."""

    def __init__(self) -> None:
        self._ident: int | None = None
        self._native: int | None = None
        self._clock: int | None = None
        self._own_reads = 0
        self._blocked_ns = 0
        self._last_read_ns: int | None = None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def training_thread(self) -> None:
        """Called by the thread that begins a step (cheap when it is the same one as before)."""
        ident = threading.get_ident()
        if ident == self._ident:
            return
        self._ident = ident
        try:
            self._native = threading.get_native_id()
            self._clock = time.pthread_getcpuclockid(ident)
        except Exception:
            self._native, self._clock = None, None

    def _read(self, path: str) -> str:
        with open(path, "rb") as handle:
            data = handle.read(65536)
        self._own_reads += len(data)
        return data.decode("ascii", "replace")

    def _children_cpu_ns(self) -> int:
        if self._native is None:
            return 0
        total = 0
        try:
            children = self._read(f"/proc/self/task/{self._native}/children").split()
        except OSError:
            return 0
        for child in children[:64]:
            try:
                fields = self._read(f"/proc/{int(child)}/stat").rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) * 1_000_000_000 // self._tick
            except (OSError, ValueError, IndexError):
                continue
        return total

    def _blocked_on_io_ns(self) -> int:
        """Wall time the training thread spent in uninterruptible I/O (state D: the kernel works for
        it, a slow disk or filesystem), sampled at each read: the interval since the last one."""
        now = time.monotonic_ns()
        last, self._last_read_ns = self._last_read_ns, now
        if self._native is None or last is None:
            return self._blocked_ns
        try:
            state = self._read(f"/proc/self/task/{self._native}/stat").rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return self._blocked_ns
        if state == "D":
            self._blocked_ns += now - last
        return self._blocked_ns

    def read(self) -> tuple[int | None, int | None]:
        cpu: int | None = None
        if self._clock is not None:
            try:
                cpu = (time.process_time_ns() + self._children_cpu_ns()
                       + self._blocked_on_io_ns())
            except Exception:
                cpu = None
        io: int | None = None
        try:
            counters = dict(
                line.split(":", 1) for line in self._read("/proc/self/io").splitlines()
                if ":" in line
            )
            io = int(counters["rchar"]) + int(counters["wchar"]) - self._own_reads
        except Exception:
            io = None
        return cpu, io


class HeartbeatWriter:
    """One rank's heartbeat record (the StepTimer owns one). Never raises: a failure is counted in
    `failures`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        identity: Mapping[str, Any],
        pid: int | None = None,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.path = Path(path)
        self.failures = 0
        self.last_error: str | None = None
        self._wall = wall_clock
        self._map: mmap.mmap | None = None
        self._seq = 0
        self.usage = RankUsage()
        # last_step, last_end_ns, steps, current, bad_loss, loss, flags, phase of the current step
        self._state = [-1, 0, 0, -1, -1, 0.0, 0, 0]
        try:
            blob = json.dumps({k: v for k, v in identity.items() if v is not None}).encode()[
                : SIZE - 132
            ]
            content = bytearray(SIZE)
            _RECORD.pack_into(content, 0, MAGIC, VERSION, 0, -1, 0, 0, -1, -1, 0.0, 0, 0)
            _ALIVE.pack_into(content, _ALIVE_AT, self._wall())
            _ALIVE.pack_into(content, _PID_AT, pid if pid is not None else os.getpid())
            struct.pack_into("<I", content, _IDENTITY_AT, len(blob))
            content[_IDENTITY_AT + 4: _IDENTITY_AT + 4 + len(blob)] = blob
            atomic_write(self.path, bytes(content), fsync=False)
            with open(self.path, "r+b") as handle:
                self._map = mmap.mmap(handle.fileno(), SIZE)
        except Exception as exc:
            self._fail(exc)

    @property
    def active(self) -> bool:
        return self._map is not None

    def _fail(self, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.failures <= 3:
            log.warning("heartbeat %s: %s", self.path, self.last_error)

    def _publish(self) -> None:
        view = self._map
        if view is None:
            return
        try:
            self._seq += 1  # odd: being written
            struct.pack_into("<Q", view, 8, self._seq)
            last, end_ns, steps, current, bad, loss, flags, phase = self._state
            _RECORD.pack_into(
                view,
                0,
                MAGIC,
                VERSION,
                self._seq,
                last,
                end_ns,
                steps,
                current,
                bad,
                loss,
                flags,
                phase,
            )
            self._seq += 1
            struct.pack_into("<Q", view, 8, self._seq)
        except Exception as exc:
            self._fail(exc)

    def begin(self, step: int, phase: str | None = None) -> None:
        self.usage.training_thread()
        state = self._state
        state[3] = int(step)
        state[6] |= IN_STEP
        state[7] = PHASE_CODES.get(phase, 0) if phase is not None else 0
        self._publish()

    def end(self, step: int, end_ns: int, loss: float | None, completed: bool = True) -> None:
        state = self._state
        state[6] &= ~IN_STEP
        state[3] = -1
        state[7] = 0
        if completed:
            state[0], state[1] = int(step), int(end_ns)
            state[2] += 1
            if loss is not None:
                state[5] = float(loss)
                state[6] |= HAS_LOSS
                if not math.isfinite(loss) and state[4] < 0:
                    state[4] = int(step)
        self._publish()

    def alive(self) -> None:
        view = self._map
        if view is not None:
            try:
                cpu_ns, io_bytes = self.usage.read()
                known = (CPU_KNOWN if cpu_ns is not None else 0) | (
                    IO_KNOWN if io_bytes is not None else 0)
                _USAGE.pack_into(view, _USAGE_AT, cpu_ns or 0, io_bytes or 0, known)
                _ALIVE.pack_into(view, _ALIVE_AT, self._wall())
            except Exception as exc:
                self._fail(exc)

    def close(self) -> None:
        """Mark this rank closed (it steps no more) and release the mapping; the file stays for the
        readers.
        """
        if self._map is None:
            return
        self._state[6] |= CLOSED
        self._state[6] &= ~IN_STEP
        self._publish()
        self.alive()
        with contextlib.suppress(Exception):
            self._map.close()
        self._map = None


@dataclass(frozen=True)
class Heartbeat:
    """One decoded heartbeat record."""

    identity: dict[str, Any]
    pid: int | None
    last_step: int | None
    last_end_ns: int | None
    steps: int
    current_step: int | None
    bad_loss_step: int | None
    loss: float | None
    in_step: bool
    closed: bool
    alive_ns: int
    seq: int
    phase: str | None = None  # of the step in progress (None: between steps, or not said)
    cpu_ns: int | None = None  # the rank's own CPU so far (RankUsage; None: not known)
    io_bytes: int | None = None  # bytes the process read and wrote so far (None: not known)


def read_heartbeat(path: str | os.PathLike[str], tries: int = 5) -> Heartbeat:
    """Decode one heartbeat file (ValueError when it is not one; retried while a writer holds the
    lock).
    """
    with open(path, "rb") as handle:
        data = handle.read(SIZE)
    for _ in range(tries):
        if len(data) < _IDENTITY_AT + 4:
            raise ValueError(f"{path}: {len(data)} bytes, not a heartbeat record")
        magic, version, seq, last, end_ns, steps, current, bad, loss, flags, phase = (
            _RECORD.unpack_from(data, 0)
        )
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{path}: not a faultlens heartbeat (magic {magic!r}, version "
                             f"{version})")
        if seq % 2 == 0:
            break
        time.sleep(0.001)
        with open(path, "rb") as handle:
            data = handle.read(SIZE)
    else:
        raise ValueError(f"{path}: record still being written after {tries} reads")
    (length,) = struct.unpack_from("<I", data, _IDENTITY_AT)
    identity = json.loads(data[_IDENTITY_AT + 4: _IDENTITY_AT + 4 + length].decode() or "{}")
    if not isinstance(identity, dict):
        raise ValueError(f"{path}: identity is not a JSON object")
    (alive,) = _ALIVE.unpack_from(data, _ALIVE_AT)
    (pid,) = _ALIVE.unpack_from(data, _PID_AT)
    cpu_ns, io_bytes, known = _USAGE.unpack_from(data, _USAGE_AT)
    return Heartbeat(
        identity=identity,
        pid=pid or None,
        last_step=last if last >= 0 else None,
        last_end_ns=end_ns or None,
        steps=steps,
        current_step=current if current >= 0 else None,
        bad_loss_step=bad if bad >= 0 else None,
        loss=loss if flags & HAS_LOSS else None,
        in_step=bool(flags & IN_STEP),
        closed=bool(flags & CLOSED),
        alive_ns=alive,
        seq=seq,
        phase=_PHASE_NAMES.get(phase) if flags & IN_STEP else None,
        cpu_ns=cpu_ns if known & CPU_KNOWN else None,
        io_bytes=io_bytes if known & IO_KNOWN else None,
    )


@dataclass
class HeartbeatStats:
    files: int = 0
    rows: int = 0
    unreadable: int = 0
    skipped_stale: int = 0


class HeartbeatSource:
    """Reads the heartbeat files of one directory (their identity comes from the files; `identity`
    fills what a file leaves out)."""

    name = "heartbeats"

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        identity: NodeIdentity | None = None,
        *,
        min_interval_s: float = 1.0,
        keepalive_s: float = 2.0,
        max_age_s: float = 600.0,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()
        self.identity = identity
        self.keepalive_s = keepalive_s
        self.min_interval_s = min_interval_s
        self.max_age_s = max_age_s
        self._wall = wall_clock
        self.stats = HeartbeatStats()
        # file -> (state, alive_ns, when) emitted
        self._emitted: dict[str, tuple[tuple[Any, ...], int, int]] = {}
        self._ignored: set[str] = set()
        self._said: set[str] = set()

    def poll(self) -> Mapping[str, pa.RecordBatch]:
        try:
            entries = [
                e
                for e in os.scandir(self.directory)
                if e.name.startswith("hb-") and e.name.endswith(".bin")
            ]
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._once("list", "heartbeats: cannot list %s: %s", self.directory, exc)
            return {}
        now = self._wall()
        rows = []
        for entry in entries:
            name = entry.name
            if name in self._ignored:
                continue
            try:
                beat = read_heartbeat(entry.path)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                self.stats.unreadable += 1
                self._ignored.add(name)
                self._once(
                    f"read:{name}",
                    "heartbeats: %s: unreadable (%s); counted and skipped",
                    entry.path,
                    exc,
                )
                continue
            previous = self._emitted.get(name)
            if previous is None and (now - beat.alive_ns) / 1e9 > self.max_age_s:
                self.stats.skipped_stale += 1
                self._ignored.add(name)
                continue
            state = (
                beat.last_step,
                beat.steps,
                beat.current_step,
                beat.in_step,
                beat.closed,
                beat.bad_loss_step,
                beat.phase,
            )
            if previous is not None:
                old, alive, emitted_at = previous
                if old == state and (
                    beat.alive_ns <= alive or (beat.alive_ns - alive) / 1e9 < self.keepalive_s
                ):
                    continue
                urgent = beat.closed != old[4] or beat.bad_loss_step != old[5]
                if not urgent and (now - emitted_at) / 1e9 < self.min_interval_s:
                    continue
            self._emitted[name] = (state, beat.alive_ns, now)
            rows.append(self._row(beat))
        self.stats.files = len(entries)
        if not rows:
            return {}
        try:
            from faultlens.collectors.store.schema import (
                rows_to_table,  # here: the rank-side writer must not pull in pyarrow
            )

            table = rows_to_table("heartbeats", rows)
        except Exception as exc:
            self.stats.unreadable += len(rows)
            self._once("schema", "heartbeats: rows do not fit the table: %s", exc)
            return {}
        self.stats.rows += table.num_rows
        return {"heartbeats": table.combine_chunks().to_batches()[0]}

    def _row(self, beat: Heartbeat) -> dict[str, Any]:
        own = self.identity.columns() if self.identity is not None else {}
        row: dict[str, Any] = {}
        for column in (
            "cluster",
            "node",
            "job_id",
            "attempt",
            "rank",
            "local_rank",
            "gpu_index",
            "gpu_uuid",
            "pci_bus_id",
        ):
            value = beat.identity.get(column)
            row[column] = value if value is not None else own.get(column)
        loss = beat.loss
        row.update(ts=max(beat.alive_ns, beat.last_end_ns or 0), pid=beat.pid, step=beat.last_step,
                   step_ts=beat.last_end_ns, steps=beat.steps, current_step=beat.current_step,
                   in_step=beat.in_step, phase=beat.phase,
                   loss=loss if loss is not None and math.isfinite(loss) else None,
                   bad_loss_step=beat.bad_loss_step, closed=beat.closed,
                   cpu_s=beat.cpu_ns / 1e9 if beat.cpu_ns is not None else None,
                   io_bytes=beat.io_bytes)
        return row

    def _once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)

    def close(self) -> None:
        pass


__all__ = [
    "ENV_DIR",
    "PHASE_CODES",
    "Heartbeat",
    "HeartbeatSource",
    "HeartbeatStats",
    "HeartbeatWriter",
    "RankUsage",
    "default_dir",
    "heartbeat_name",
    "read_heartbeat",
]
