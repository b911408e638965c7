"""Step and section timing for training loops: one `steps` row per step, one `ranks` row at start.

    timer = StepTimer.from_env(store="s3://bucket/faultlens")      # identity from torchrun's environment
    for n, batch in enumerate(loader):
        with timer.step(n) as step:
            with timer.section("data"):
                batch = move(batch)
            with timer.section("forward"):
                with timer.section("attention"):      # nested: recorded as "forward/attention"
                    ...
            step.loss = loss.item()

Section durations are wall-clock seconds on the training thread, keyed by the nesting path; a name entered twice in
a step adds up. Rows are buffered in a bounded queue and written off the training thread by a daemon writer
through a SegmentSink; when the store is slow or gone the oldest rows are dropped and counted (`stats.dropped`),
so memory stays bounded. Nothing here raises into the training loop: errors are logged and counted.

Progress is also published at every step's begin and end in a shared-memory heartbeat record
(collectors/training/heartbeat.py;
`heartbeat_dir=`, else $FAULTLENS_HEARTBEAT_DIR, else /dev/shm/faultlens-heartbeats; an empty
FAULTLENS_HEARTBEAT_DIR or `heartbeat=False` turns it off; only for a process with a rank), independently of
how often rows are flushed: attribution judges progress from it.

With `cuda_events=True` and torch with CUDA, every section also records a pair of CUDA events; the writer thread
resolves them (never the training thread) and adds `cuda/<path>` entries (GPU seconds) to the row's sections.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Protocol

from faultlens.collectors import environment

log = logging.getLogger(__name__)

Clock = Callable[[], int]


class Phase(StrEnum):
    TRAIN = "train"
    EVAL = "eval"
    WARMUP = "warmup"
    CHECKPOINT = "checkpoint"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, value: str | Phase) -> Phase:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class RowSink(Protocol):
    """What the timer writes through: faultlens.collectors.store.sink.SegmentSink, or any object with these methods."""

    def write(self, table: str, data: Any) -> None: ...

    def flush(self, table: str | None = None) -> Any: ...

    def pending_rows(self, table: str | None = None) -> int: ...


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None


@dataclass(frozen=True)
class RankIdentity:
    """Who this training process is, as torchrun's environment tells it."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node: str | None = None
    hostname: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    cluster: str | None = None
    pid: int | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RankIdentity:
        """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID (or FAULTLENS_JOB_ID),
        FAULTLENS_ATTEMPT (a supervisor that restarts torchrun itself) or TORCHELASTIC_RESTART_COUNT, node from
        FAULTLENS_NODE or the hostname, FAULTLENS_CLUSTER."""
        env = os.environ if environ is None else environ
        hostname = socket.gethostname()
        values: dict[str, Any] = {
            "rank": _env_int(env, "RANK"),
            "local_rank": _env_int(env, "LOCAL_RANK"),
            "world_size": _env_int(env, "WORLD_SIZE"),
            "local_world_size": _env_int(env, "LOCAL_WORLD_SIZE"),
            "node": environment.NODE.get(env) or hostname,
            "hostname": hostname,
            "job_id": environment.JOB_ID.get(env) or env.get("TORCHELASTIC_RUN_ID") or None,
            "attempt": _env_int(env, environment.ATTEMPT.name) if environment.ATTEMPT.get(env) else _env_int(
                env, "TORCHELASTIC_RESTART_COUNT"),
            "cluster": environment.CLUSTER.get(env),
            "pid": os.getpid(),
        }
        values.update(overrides)
        return cls(**values)

    def columns(self) -> dict[str, Any]:
        """The identity columns every row carries."""
        return {
            "cluster": self.cluster, "node": self.node, "job_id": self.job_id, "attempt": self.attempt,
            "rank": self.rank, "local_rank": self.local_rank, "gpu_index": self.gpu_index,
            "gpu_uuid": self.gpu_uuid, "pci_bus_id": self.pci_bus_id,
        }


@dataclass(frozen=True)
class ParallelCoords:
    """This rank's place in the parallel layout, when the training code declares it (straggler analysis uses it to
    tell one slow worker from a slow pipeline stage)."""

    dp_rank: int | None = None
    pp_rank: int | None = None
    tp_rank: int | None = None
    cp_rank: int | None = None
    ep_rank: int | None = None
    pp_size: int | None = None


@dataclass
class TimerStats:
    """What the timer did. Every completed step is written or counted: once close() has returned,
    steps == rows_written + dropped; dropped is the sum of the dropped_* counts and lost_at_close."""

    steps: int = 0
    rows_written: int = 0
    dropped: int = 0
    write_failures: int = 0
    errors: int = 0
    sections_outside_step: int = 0
    unknown_phases: int = 0
    heartbeat_failures: int = 0
    last_error: str | None = None
    dropped_queue_full: int = 0  # the oldest queued rows pushed out by new ones while the store was slow
    dropped_refused: int = 0  # rows the sink refused (never buffered)
    dropped_no_store: int = 0  # rows of a timer without a store
    lost_at_close: int = 0  # rows still queued or in the sink's buffer when close() gave up (store slow or failing)
    ranks_dropped: int = 0  # ranks rows (one per start) not written


class _Step:
    """The context of one step; `loss`, `tokens`, `samples` may be set inside the block."""

    __slots__ = ("_timer", "loss", "number", "phase", "samples", "tokens")

    def __init__(self, timer: StepTimer, number: int, phase: Phase, tokens: int | None, samples: int | None):
        self._timer = timer
        self.number = number
        self.phase = phase
        self.tokens = tokens
        self.samples = samples
        self.loss: float | None = None

    def __enter__(self) -> _Step:
        self._timer._begin_step(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        self._timer._end_step(self, failed=exc_type is not None)
        return False


class _Section:
    """Reusable per name; the timing state lives on the timer's stack, so nesting and reuse are safe."""

    __slots__ = ("_name", "_timer")

    def __init__(self, timer: StepTimer, name: str) -> None:
        self._timer = timer
        self._name = name

    def __enter__(self) -> _Section:
        timer = self._timer
        stack = timer._stack
        stack.append((f"{stack[-1][0]}/{self._name}" if stack else self._name, timer._clock()))
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        timer = self._timer
        end = timer._clock()
        try:
            path, start = timer._stack.pop()
            if timer._step is None:
                timer.stats.sections_outside_step += 1
                return False
            sections = timer._sections
            sections[path] = sections.get(path, 0) + (end - start)
        except Exception as exc:  # an unbalanced stack (a section exited twice): count it, never raise
            timer._error("section", exc)
        return False


class _CudaSection(_Section):
    """A section that also records CUDA events around the block (resolved later by the writer thread)."""

    __slots__ = ()

    def __enter__(self) -> _CudaSection:
        super().__enter__()
        try:
            self._timer._cuda_open.append(self._timer._new_event())
        except Exception as exc:
            self._timer._cuda_open.append(None)
            self._timer._error("cuda event", exc)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        timer = self._timer
        path = timer._stack[-1][0] if timer._stack else self._name
        try:
            start_event = timer._cuda_open.pop()
            if start_event is not None and timer._step is not None:
                end_event = timer._new_event()
                timer._cuda_pairs.append((path, start_event, end_event))
        except Exception as exc:
            timer._error("cuda event", exc)
        return super().__exit__(exc_type, exc, tb)


def _torch_cuda_event_factory() -> Callable[[], Any] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def new_event() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    return new_event


class StepTimer:
    """Times steps and named sections of one training thread and writes them to the store off that thread."""

    def __init__(self, sink: RowSink | None, *, identity: RankIdentity | None = None,
                 parallel: ParallelCoords | None = None, max_buffered_rows: int = 4096,
                 flush_interval_s: float = 2.0, cuda_events: bool = False,
                 clock: Clock = time.perf_counter_ns, wall_clock: Clock = time.time_ns,
                 cuda_event_factory: Callable[[], Any] | None = None, start: bool = True,
                 heartbeat: bool = True, heartbeat_dir: str | os.PathLike[str] | None = None,
                 total_steps: int | None = None) -> None:
        self.sink = sink
        # the job's declared length (its ranks row), else $FAULTLENS_TOTAL_STEPS; None: not declared
        self.total_steps = total_steps if total_steps is not None else environment.TOTAL_STEPS.get_int()
        if self.total_steps is not None and self.total_steps <= 0:
            self.total_steps = None
        self.identity = identity or RankIdentity.from_env()
        self.parallel = parallel or ParallelCoords()
        self.max_buffered_rows = max(1, int(max_buffered_rows))
        self.flush_interval_s = flush_interval_s
        self.stats = TimerStats()
        self._clock = clock
        self._wall_clock = wall_clock
        self._identity_columns = self.identity.columns()
        self._queue: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.max_buffered_rows)
        self._pending_ranks: list[dict[str, Any]] = []
        self._section_cache: dict[str, _Section] = {}
        self._stack: list[tuple[str, int]] = []
        self._sections: dict[str, int] = {}
        self._step: _Step | None = None
        self._step_start = 0
        self._step_wall_start = 0
        self._new_event = cuda_event_factory or (_torch_cuda_event_factory() if cuda_events else None)
        self._section_class: type[_Section] = _CudaSection if self._new_event is not None else _Section
        self._cuda_open: list[Any] = []
        self._cuda_pairs: list[tuple[str, Any, Any]] = []
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._writer: threading.Thread | None = None
        self._write_lock = threading.Lock()
        self._closed = False
        self._account = threading.Lock()  # the writer's and close()'s bookkeeping of rows taken from the queue
        self._handed = 0  # step rows taken from the queue, not yet confirmed written (or counted as dropped)
        self._gave_up = False  # close() counted the handed rows as lost; a later confirmation takes them back
        self._late = 0  # of those, rows the writer had handed to the sink (it may still write them)
        self._drops_reported = 0
        self._drops_logged_at: float | None = None
        self.drop_log_interval_s = 30.0  # at most one "rows not written" warning per this many seconds
        self.heartbeat = _heartbeat_writer(self.identity, heartbeat, heartbeat_dir, wall_clock)
        if start:
            self.start()

    @classmethod
    def from_env(cls, store: str | None = None, *, flush_rows: int = 10_000, **kwargs: Any) -> StepTimer:
        """A timer writing to `store` (else $FAULTLENS_STORE; no store: rows are counted and dropped). A store
        that cannot be opened is logged, never raised."""
        url = store or environment.STORE.raw()
        sink = None
        if url:
            try:
                from faultlens.collectors.store.sink import SegmentSink

                sink = SegmentSink(url, flush_rows=flush_rows, flush_age_s=3600.0)
            except Exception as exc:
                log.warning("step_timer: store %r cannot be opened (%s); steps will be counted, not stored", url, exc)
        return cls(sink, **kwargs)

    @property
    def cuda_events(self) -> bool:
        return self._new_event is not None

    # -- the training-thread API ----------------------------------------------------------------------------
    def step(self, number: int, phase: str | Phase = Phase.TRAIN, *, tokens: int | None = None,
             samples: int | None = None) -> _Step:
        """Context manager timing step `number` (phase train, eval, warmup or checkpoint)."""
        parsed = phase if isinstance(phase, Phase) else Phase.parse(phase)
        if parsed is Phase.UNKNOWN and phase != Phase.UNKNOWN:
            self.stats.unknown_phases += 1
        return _Step(self, number, parsed, tokens, samples)

    def section(self, name: str) -> _Section:
        """Context manager timing a named section of the current step (nesting gives 'outer/inner')."""
        section = self._section_cache.get(name)
        if section is None:
            section = self._section_cache[name] = self._section_class(self, str(name))
        return section

    def _begin_step(self, step: _Step) -> None:
        if self._step is not None:  # a step inside a step: close the outer one's sections into it first
            self.stats.errors += 1
        self._step = step
        self._sections = {}
        self._cuda_pairs = []
        self._step_wall_start = self._wall_clock()
        if self.heartbeat is not None:
            self.heartbeat.begin(step.number, step.phase.value)
        self._step_start = self._clock()

    def _end_step(self, step: _Step, failed: bool) -> None:
        end = self._clock()
        try:
            if self._step is not step:
                return
            self._step = None
            if failed:
                if self.heartbeat is not None:
                    self.heartbeat.end(step.number, 0, None, completed=False)
                return  # an exception left the step: it did not complete, there is no duration to report
            duration_ns = end - self._step_start
            start_wall = self._step_wall_start
            row = dict(self._identity_columns)
            row.update(
                ts=start_wall + duration_ns, step=step.number, phase=step.phase.value, start_ts=start_wall,
                end_ts=start_wall + duration_ns, duration_s=duration_ns / 1e9,
                sections={path: ns / 1e9 for path, ns in self._sections.items()},
                tokens=step.tokens, samples=step.samples, loss=_float_or_none(step.loss),
            )
            if self._cuda_pairs:
                row["_cuda"] = self._cuda_pairs
                self._cuda_pairs = []
            queue = self._queue
            if self._closed:  # after close() nothing writes the queue any more
                self.stats.steps += 1
                self.stats.dropped += 1
                self.stats.lost_at_close += 1
                return
            if len(queue) == self.max_buffered_rows:
                self.stats.dropped += 1
                self.stats.dropped_queue_full += 1
            queue.append(row)
            self.stats.steps += 1
            if self.heartbeat is not None:
                self.heartbeat.end(step.number, row["end_ts"], row["loss"])
        except Exception as exc:
            self._error("step", exc)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Queue the ranks row and start the writer thread."""
        if self._writer is not None:
            return
        try:
            row = dict(self._identity_columns)
            row.update(ts=self._wall_clock(), pid=self.identity.pid, world_size=self.identity.world_size,
                       local_world_size=self.identity.local_world_size, hostname=self.identity.hostname,
                       **asdict(self.parallel))
            if self.total_steps is not None:
                row["total_steps"] = int(self.total_steps)
            self._pending_ranks.append(row)
            self._writer = threading.Thread(target=self._writer_loop, name="faultlens-step-timer", daemon=True)
            self._writer.start()
            atexit.register(_close_if_alive, weakref.ref(self))
        except Exception as exc:
            self._error("start", exc)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Write what is queued now (from the calling thread); False if the store refused it."""
        acquired = self._write_lock.acquire(timeout=-1 if timeout_s is None else timeout_s)
        if not acquired:
            return False
        try:
            return self._drain()
        finally:
            self._write_lock.release()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the writer after a last flush (bounded by timeout_s when the store hangs). Rows it could not
        write by then (still queued, or in the sink's buffer) are counted in stats.lost_at_close and logged."""
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        self._wake.set()
        writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join(timeout_s)
        try:
            self._count_unwritten_at_close()
        except Exception as exc:  # never raise into training (close runs at exit too)
            self._error("close", exc)

    def _count_unwritten_at_close(self) -> None:
        with self._account:
            queued = len(self._queue)
            self._queue.clear()
            lost = queued + self._handed
            self._late = self._handed  # the stuck writer may still get these into the store
            self._handed = 0
            self._gave_up = True
            ranks = len(self._pending_ranks)
            self._pending_ranks.clear()
            self.stats.lost_at_close += lost
            self.stats.dropped += lost
            self.stats.ranks_dropped += ranks
        self._report_drops(force=True)

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writer thread ----------------------------------------------------------------------------------
    def _writer_loop(self) -> None:
        # never the thread a process-directed SIGUSR1/SIGTERM lands on: the flight-recorder trigger waits for them
        # in its own thread, and a thread started before the trigger's install() would not have them blocked
        with contextlib.suppress(Exception):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            beat = self.heartbeat
            wait = next_flush - time.monotonic()
            woken = self._wake.wait(max(0.0, min(wait, 1.0) if beat is not None else wait))
            self._wake.clear()
            stopping = self._stopped.is_set()
            if beat is not None:
                beat.alive()  # the process lives (its step may still not advance)
            if woken or stopping or time.monotonic() >= next_flush:
                with self._write_lock:
                    self._drain()
                next_flush = time.monotonic() + self.flush_interval_s
            with contextlib.suppress(Exception):
                self._report_drops()
            if stopping:
                if beat is not None:
                    beat.close()
                    self.stats.heartbeat_failures = beat.failures
                return

    def _report_drops(self, force: bool = False) -> None:
        """One warning for the rows not written since the last one, at most every drop_log_interval_s."""
        stats = self.stats
        new = stats.dropped - self._drops_reported
        if new <= 0 and not (force and stats.ranks_dropped):
            return
        now = time.monotonic()
        if not force and self._drops_logged_at is not None and now - self._drops_logged_at < self.drop_log_interval_s:
            return
        log.warning("step_timer: %d step row(s) not written since the last report (%d of %d in all: %d pushed out "
                    "of the full queue, %d refused by the store, %d without a store, %d left at close)%s", new,
                    stats.dropped, stats.steps, stats.dropped_queue_full, stats.dropped_refused,
                    stats.dropped_no_store, stats.lost_at_close,
                    f"; {stats.ranks_dropped} ranks row(s) not written" if stats.ranks_dropped else "")
        self._drops_reported = stats.dropped
        self._drops_logged_at = now

    def _drain(self) -> bool:
        """Move queued rows into the sink and flush it. Bounded: rows stay queued (oldest dropped) while the
        sink still holds a failed batch of max_buffered_rows."""
        sink = self.sink
        if sink is None:
            with self._account:
                dropped = len(self._queue)
                ranks = len(self._pending_ranks)
                self._queue.clear()
                self._pending_ranks.clear()
                self.stats.dropped += dropped
                self.stats.dropped_no_store += dropped
                self.stats.ranks_dropped += ranks
            return dropped + ranks == 0
        try:
            if self._pending_ranks:
                sink.write("ranks", list(self._pending_ranks))
                self._pending_ranks.clear()
            if sink.pending_rows("steps") < self.max_buffered_rows:
                rows = self._take_rows()
                if rows:
                    before = _pending(sink)
                    try:
                        sink.write("steps", rows)
                    except Exception:
                        after = _pending(sink)
                        if before is None or after is None or after - before < len(rows):
                            self._forget(len(rows), refused=True)  # refused before buffering: these rows are gone
                        raise  # (else the sink kept them buffered: a later flush writes them)
            sink.flush()
            self._confirm()
            return True
        except Exception as exc:
            self.stats.write_failures += 1
            self._error("write", exc)
            return False

    def _take_rows(self) -> list[dict[str, Any]]:
        rows = []
        queue = self._queue
        with self._account:  # taken rows are counted as handed at once, so close() never misses them
            while queue:
                try:
                    rows.append(queue.popleft())
                except IndexError:
                    break
            self._handed += len(rows)
        for row in rows:
            pairs = row.pop("_cuda", None)
            if pairs:
                row["sections"] = {**row["sections"], **_resolve_cuda(pairs, self)}
        return rows

    def _forget(self, count: int, *, refused: bool) -> None:
        """`count` handed rows are gone (the sink refused them)."""
        with self._account:
            if self._gave_up:  # close() has counted them as lost already
                self._late = max(0, self._late - count)
                return
            self._handed -= count
            self.stats.dropped += count
            if refused:
                self.stats.dropped_refused += count

    def _confirm(self) -> None:
        """The sink flushed: every handed row is written."""
        with self._account:
            if self._gave_up:  # close() counted the handed rows as lost; they made it after all
                late = min(self._late, self.stats.lost_at_close)
                self.stats.lost_at_close -= late
                self.stats.dropped -= late
                self.stats.rows_written += late
                self._late = 0
                return
            self.stats.rows_written += self._handed
            self._handed = 0

    def _error(self, what: str, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{what}: {type(exc).__name__}: {exc}"
        if self.stats.errors <= 10 or self.stats.errors % 1000 == 0:
            log.warning("step_timer: %s (%d errors so far)", self.stats.last_error, self.stats.errors)


def _pending(sink: Any) -> int | None:
    try:
        return int(sink.pending_rows("steps"))
    except Exception:
        return None


def _resolve_cuda(pairs: list[tuple[str, Any, Any]], timer: StepTimer) -> dict[str, float]:
    """GPU seconds per section path from recorded CUDA event pairs (waits for the events on the writer thread)."""
    seconds: dict[str, float] = {}
    for path, start_event, end_event in pairs:
        try:
            end_event.synchronize()
            key = f"cuda/{path}"
            seconds[key] = seconds.get(key, 0.0) + start_event.elapsed_time(end_event) / 1e3
        except Exception as exc:
            timer._error("cuda timing", exc)
    return seconds


def _heartbeat_writer(identity: RankIdentity, enabled: bool, directory: str | os.PathLike[str] | None,
                      wall_clock: Clock) -> Any:
    """The heartbeat record of a rank process (None: off, no rank, or it could not be created; logged)."""
    if not enabled or identity.rank is None or (directory is None and environment.HEARTBEAT_DIR.raw() == ""):
        return None
    try:
        from pathlib import Path

        from faultlens.collectors.training.heartbeat import HeartbeatWriter, default_dir, heartbeat_name

        path = Path(directory if directory is not None else default_dir()) / heartbeat_name(
            identity.job_id, identity.attempt, identity.rank)
        writer = HeartbeatWriter(path, {**identity.columns(), "hostname": identity.hostname}, identity.pid,
                                 wall_clock)
        return writer if writer.active else None
    except Exception as exc:
        log.warning("step_timer: no heartbeat (%s: %s)", type(exc).__name__, exc)
        return None


def _float_or_none(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _close_if_alive(ref: weakref.ref[StepTimer]) -> None:
    timer = ref()
    if timer is not None:
        timer.close()


__all__ = ["ParallelCoords", "Phase", "RankIdentity", "RowSink", "StepTimer", "TimerStats"]
