"""Step and section timing for training loops: one `steps` row per step, one `ranks` row at start.

    # identity from torchrun's environment
    timer = StepTimer.from_env(store="s3://bucket/faultlens")
    for n, batch in enumerate(loader):
        with timer.step(n) as step:
            with timer.section("data"):
                batch = move(batch)
            with timer.section("forward"):
                with timer.section("attention"):      # nested: recorded as "forward/attention"
                    ...
            step.loss = loss.item()

Section durations are wall-clock seconds on the training thread, keyed by the nesting path; a name
entered twice in a step adds up. Rows are buffered in a bounded queue and written off the training
thread by a daemon writer through a SegmentSink; when the store is slow or gone the oldest rows are
dropped and counted (`stats.dropped`), so memory stays bounded. Nothing here raises into the
training loop: errors are logged and counted.

Progress is also published at every step's begin and end in a shared-memory heartbeat record
(collectors/training/heartbeat.py;
`heartbeat_dir=`, else $FAULTLENS_HEARTBEAT_DIR, else /dev/shm/faultlens-heartbeats; an empty
FAULTLENS_HEARTBEAT_DIR or `heartbeat=False` turns it off; only for a process with a rank),
independently of how often rows are flushed: attribution judges progress from it.

With `cuda_events=True` and torch with CUDA, every section also records a pair of CUDA events; the
writer thread resolves them (never the training thread) and adds `cuda/<path>` entries (GPU seconds)
to the row's sections.

This module is the training-thread side (StepTimer, the step and section contexts); the writer
thread and its row bookkeeping are StepTimer's base class (collectors/training/timer_writer.py), and
the identity, phases, counts and sink protocol are collectors/training/timer_model.py (all
importable from here).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

from faultlens import environment
from faultlens.collectors.training.timer_model import (
    Clock,
    ParallelCoords,
    Phase,
    RankIdentity,
    RowSink,
    TimerStats,
)
from faultlens.collectors.training.timer_writer import RowWriter

log = logging.getLogger(__name__)


class StepHook(Protocol):
    """An observer of every StepTimer of the process, called on the training thread after the
    timer's own bookkeeping: the fault-injection lab's injector (controller/lab/inject.py) fires its
    faults at a chosen step and section through it. What a hook raises reaches the training code
    (an injected exception must): the one exception to "nothing here raises", so only a harness
    installs one."""

    def step_begun(self, timer: StepTimer, number: int, phase: str) -> None: ...

    def section_entered(self, timer: StepTimer, name: str) -> None: ...


_hooks: list[StepHook] = []


def add_hook(hook: StepHook) -> None:
    """Call `hook` at every step's begin and every section's entry of every StepTimer here."""
    _hooks.append(hook)


def remove_hook(hook: StepHook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)


class _Step:
    """The context of one step; `loss`, `tokens`, `samples` may be set inside the block."""

    __slots__ = ("_timer", "loss", "number", "phase", "samples", "tokens")

    def __init__(
        self, timer: StepTimer, number: int, phase: Phase, tokens: int | None, samples: int | None
    ):
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
    """Reusable per name; the timing state lives on the timer's stack, so nesting and reuse are
    safe.
    """

    __slots__ = ("_name", "_timer")

    def __init__(self, timer: StepTimer, name: str) -> None:
        self._timer = timer
        self._name = name

    def __enter__(self) -> _Section:
        timer = self._timer
        stack = timer._stack
        stack.append((f"{stack[-1][0]}/{self._name}" if stack else self._name, timer._clock()))
        for hook in _hooks:
            hook.section_entered(timer, self._name)
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
        # an unbalanced stack (a section exited twice): count it, never raise
        except Exception as exc:
            timer._error("section", exc)
        return False


class _CudaSection(_Section):
    """A section that also records CUDA events around the block (resolved later by the writer
    thread).
    """

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


class StepTimer(RowWriter):
    """Times steps and named sections of one training thread and writes them to the store off that
    thread.
    """

    def __init__(self, sink: RowSink | None, *, identity: RankIdentity | None = None,
                 parallel: ParallelCoords | None = None, max_buffered_rows: int = 4096,
                 flush_interval_s: float = 2.0, cuda_events: bool = False,
                 clock: Clock = time.perf_counter_ns, wall_clock: Clock = time.time_ns,
                 cuda_event_factory: Callable[[], Any] | None = None, start: bool = True,
                 heartbeat: bool = True, heartbeat_dir: str | os.PathLike[str] | None = None,
                 total_steps: int | None = None) -> None:
        self.sink = sink
        # the job's declared length (its ranks row), else $FAULTLENS_TOTAL_STEPS; None: not declared
        self.total_steps = (
            total_steps if total_steps is not None else environment.TOTAL_STEPS.get_int()
        )
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
        self._queue: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=self.max_buffered_rows
        )
        self._pending_ranks: list[dict[str, Any]] = []
        self._extra: dict[str, collections.deque[dict[str, Any]]] = {}
        self.extra_dropped: dict[str, int] = {}
        self._section_cache: dict[str, _Section] = {}
        self._stack: list[tuple[str, int]] = []
        self._sections: dict[str, int] = {}
        self._step: _Step | None = None
        self._step_start = 0
        self._step_wall_start = 0
        self._new_event = cuda_event_factory or (
            _torch_cuda_event_factory() if cuda_events else None
        )
        self._section_class: type[_Section] = (
            _CudaSection if self._new_event is not None else _Section
        )
        self._cuda_open: list[Any] = []
        self._cuda_pairs: list[tuple[str, Any, Any]] = []
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._writer: threading.Thread | None = None
        self._write_lock = threading.Lock()
        self._closed = False
        # the writer's and close()'s bookkeeping of rows taken from the queue
        self._account = threading.Lock()
        # step rows taken from the queue, not yet confirmed written (or counted as dropped)
        self._handed = 0
        # close() counted the handed rows as lost; a later confirmation takes them back
        self._gave_up = False
        self._late = 0  # of those, rows the writer had handed to the sink (it may still write them)
        self._drops_reported = 0
        self._drops_logged_at: float | None = None
        # at most one "rows not written" warning per this many seconds
        self.drop_log_interval_s = 30.0
        self.heartbeat = _heartbeat_writer(self.identity, heartbeat, heartbeat_dir, wall_clock)
        if start:
            self.start()

    @classmethod
    def from_env(
        cls, store: str | None = None, *, flush_rows: int = 10_000, **kwargs: Any
    ) -> StepTimer:
        """A timer writing to `store` (else $FAULTLENS_STORE; no store: rows are counted and
        dropped). A store that cannot be opened is logged, never raised."""
        url = store or environment.STORE.raw()
        sink = None
        if url:
            try:
                from faultlens.collectors.store.sink import SegmentSink

                # no rollup here: merging older segments reads and rewrites Parquet, work that
                # belongs to the node's agent or `faultlens compact`, never a training process
                sink = SegmentSink(url, flush_rows=flush_rows, flush_age_s=3600.0, rollup=False)
            except Exception as exc:
                log.warning("step_timer: store %r cannot be opened (%s); steps will be counted, "
                            "not stored", url, exc)
        return cls(sink, **kwargs)

    @property
    def cuda_events(self) -> bool:
        return self._new_event is not None

    # -- the training-thread API
    # ----------------------------------------------------------------------------
    def step(self, number: int, phase: str | Phase = Phase.TRAIN, *, tokens: int | None = None,
             samples: int | None = None) -> _Step:
        """Context manager timing step `number` (phase train, eval, warmup or checkpoint)."""
        parsed = phase if isinstance(phase, Phase) else Phase.parse(phase)
        if parsed is Phase.UNKNOWN and phase != Phase.UNKNOWN:
            self.stats.unknown_phases += 1
        return _Step(self, number, parsed, tokens, samples)

    def section(self, name: str) -> _Section:
        """Context manager timing a named section of the current step (nesting gives 'outer/inner').
        """
        section = self._section_cache.get(name)
        if section is None:
            section = self._section_cache[name] = self._section_class(self, str(name))
        return section

    def queue_row(self, table: str, row: dict[str, Any]) -> None:
        """Queue one row of another table (its identity columns added) for the writer thread to
        write beside the steps: collectors/training/numerics.py writes its rows so. Bounded like
        the steps queue (the oldest row is pushed out and counted in extra_dropped); never raises.
        """
        try:
            queue = self._extra.get(table)
            if queue is None:
                queue = self._extra[table] = collections.deque(maxlen=self.max_buffered_rows)
            if self._closed or len(queue) == self.max_buffered_rows:
                self.extra_dropped[table] = self.extra_dropped.get(table, 0) + 1
                if self._closed:
                    return
            full = dict(self._identity_columns)
            full.update(row)
            queue.append(full)
        except Exception as exc:
            self._error("queue row", exc)

    def _begin_step(self, step: _Step) -> None:
        # a step inside a step: close the outer one's sections into it first
        if self._step is not None:
            self.stats.errors += 1
        self._step = step
        self._sections = {}
        self._cuda_pairs = []
        self._step_wall_start = self._wall_clock()
        if self.heartbeat is not None:
            self.heartbeat.begin(step.number, step.phase.value)
        self._step_start = self._clock()
        for hook in _hooks:
            hook.step_begun(self, step.number, step.phase.value)

    def _end_step(self, step: _Step, failed: bool) -> None:
        end = self._clock()
        try:
            if self._step is not step:
                return
            self._step = None
            if failed:
                if self.heartbeat is not None:
                    self.heartbeat.end(step.number, 0, None, completed=False)
                # an exception left the step: it did not complete, there is no duration to report
                return
            duration_ns = end - self._step_start
            start_wall = self._step_wall_start
            row = dict(self._identity_columns)
            row.update(
                ts=start_wall + duration_ns,
                step=step.number,
                phase=step.phase.value,
                start_ts=start_wall,
                end_ts=start_wall + duration_ns,
                duration_s=duration_ns / 1e9,
                sections={path: ns / 1e9 for path, ns in self._sections.items()},
                tokens=step.tokens,
                samples=step.samples,
                loss=_float_or_none(step.loss),
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

    # -- lifecycle
    # ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Queue the ranks row and start the writer thread."""
        if self._writer is not None:
            return
        try:
            row = dict(self._identity_columns)
            row.update(
                ts=self._wall_clock(),
                pid=self.identity.pid,
                world_size=self.identity.world_size,
                local_world_size=self.identity.local_world_size,
                hostname=self.identity.hostname,
                **asdict(self.parallel),
            )
            if self.total_steps is not None:
                row["total_steps"] = int(self.total_steps)
            self._pending_ranks.append(row)
            self._writer = threading.Thread(
                target=self._writer_loop, name="faultlens-step-timer", daemon=True
            )
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
        """Stop the writer after a last flush (bounded by timeout_s when the store hangs). Rows it
        could not write by then (still queued, or in the sink's buffer) are counted in
        stats.lost_at_close and logged."""
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

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _heartbeat_writer(
    identity: RankIdentity,
    enabled: bool,
    directory: str | os.PathLike[str] | None,
    wall_clock: Clock,
) -> Any:
    """The heartbeat record of a rank process (None: off, no rank, or it could not be created;
    logged).
    """
    if (
        not enabled
        or identity.rank is None
        or (directory is None and environment.HEARTBEAT_DIR.raw() == "")
    ):
        return None
    try:
        from pathlib import Path

        from faultlens.collectors.training.heartbeat import (
            HeartbeatWriter,
            default_dir,
            heartbeat_name,
        )

        path = Path(directory if directory is not None else default_dir()) / heartbeat_name(
            identity.job_id, identity.attempt, identity.rank)
        writer = HeartbeatWriter(
            path, {**identity.columns(), "hostname": identity.hostname}, identity.pid, wall_clock
        )
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
