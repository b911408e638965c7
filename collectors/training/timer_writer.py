"""The writer-thread half of StepTimer (its base class; the training-thread API is in
step_timer.py): the daemon loop that drains the bounded row queue into the sink, CUDA event pairs
resolved into GPU seconds there, and the bookkeeping that counts every row as written or dropped.
Nothing here raises into the training loop."""

from __future__ import annotations

import collections
import contextlib
import logging
import signal
import threading
import time
from typing import Any

from faultlens.collectors.training.timer_model import RowSink, TimerStats

log = logging.getLogger("faultlens.collectors.training.step_timer")  # the timer's one logger


class RowWriter:
    """Base class of StepTimer: its writer thread and row bookkeeping. StepTimer.__init__ sets every
    attribute below; the training thread appends step rows to `_queue` and the writer takes them
    from it."""

    sink: RowSink | None
    stats: TimerStats
    max_buffered_rows: int
    flush_interval_s: float
    heartbeat: Any  # a HeartbeatWriter, or None
    drop_log_interval_s: float
    _queue: collections.deque[dict[str, Any]]
    _pending_ranks: list[dict[str, Any]]
    _wake: threading.Event
    _stopped: threading.Event
    _write_lock: threading.Lock
    _account: threading.Lock  # the writer's and close()'s bookkeeping of rows taken from the queue
    _handed: int
    _gave_up: bool
    _late: int
    _drops_reported: int
    _drops_logged_at: float | None
    # rows of other tables written beside the steps (StepTimer.queue_row): table -> bounded queue
    _extra: dict[str, collections.deque[dict[str, Any]]]
    # of those, rows not written (pushed out of a full queue, refused, no store), by table
    extra_dropped: dict[str, int]

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

    # -- the writer thread
    # ----------------------------------------------------------------------------------
    def _writer_loop(self) -> None:
        # never the thread a process-directed SIGUSR1/SIGTERM lands on: the flight-recorder trigger
        # waits for them in its own thread, and a thread started before the trigger's install()
        # would not have them blocked
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
        """One warning for the rows not written since the last one, at most every
        drop_log_interval_s.
        """
        stats = self.stats
        new = stats.dropped - self._drops_reported
        if new <= 0 and not (force and stats.ranks_dropped):
            return
        now = time.monotonic()
        if (
            not force
            and self._drops_logged_at is not None
            and now - self._drops_logged_at < self.drop_log_interval_s
        ):
            return
        log.warning(
            "step_timer: %d step row(s) not written since the last report (%d of %d in "
            "all: %d pushed out "
            "of the full queue, %d refused by the store, %d without a store, %d left at "
            "close)%s",
            new,
            stats.dropped,
            stats.steps,
            stats.dropped_queue_full,
            stats.dropped_refused,
            stats.dropped_no_store,
            stats.lost_at_close,
            f"; {stats.ranks_dropped} ranks row(s) not written" if stats.ranks_dropped else "",
        )
        self._drops_reported = stats.dropped
        self._drops_logged_at = now

    def _drain(self) -> bool:
        """Move queued rows into the sink and flush it. Bounded: rows stay queued (oldest dropped)
        while the sink still holds a failed batch of max_buffered_rows."""
        sink = self.sink
        if sink is None:
            for table, queue in list(self._extra.items()):
                self.extra_dropped[table] = self.extra_dropped.get(table, 0) + len(queue)
                queue.clear()
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
            self._drain_extra(sink)
            if sink.pending_rows("steps") < self.max_buffered_rows:
                rows = self._take_rows()
                if rows:
                    before = _pending(sink)
                    try:
                        sink.write("steps", rows)
                    except Exception:
                        after = _pending(sink)
                        if before is None or after is None or after - before < len(rows):
                            # refused before buffering: these rows are gone
                            self._forget(len(rows), refused=True)
                        raise  # (else the sink kept them buffered: a later flush writes them)
            sink.flush()
            self._confirm()
            return True
        except Exception as exc:
            self.stats.write_failures += 1
            self._error("write", exc)
            return False

    def _drain_extra(self, sink: RowSink) -> None:
        """Rows of the other tables into the sink (a refused batch is counted, never retried)."""
        for table, queue in list(self._extra.items()):
            rows = []
            while queue:
                try:
                    rows.append(queue.popleft())
                except IndexError:
                    break
            if not rows:
                continue
            try:
                sink.write(table, rows)
            except Exception:
                self.extra_dropped[table] = self.extra_dropped.get(table, 0) + len(rows)
                raise

    def _take_rows(self) -> list[dict[str, Any]]:
        rows = []
        queue = self._queue
        # taken rows are counted as handed at once, so close() never misses them
        with self._account:
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
            log.warning(
                "step_timer: %s (%d errors so far)", self.stats.last_error, self.stats.errors
            )


def _pending(sink: Any) -> int | None:
    try:
        return int(sink.pending_rows("steps"))
    except Exception:
        return None


def _resolve_cuda(pairs: list[tuple[str, Any, Any]], timer: RowWriter) -> dict[str, float]:
    """GPU seconds per section path from recorded CUDA event pairs (waits for the events on the
    writer thread).
    """
    seconds: dict[str, float] = {}
    for path, start_event, end_event in pairs:
        try:
            end_event.synchronize()
            key = f"cuda/{path}"
            seconds[key] = seconds.get(key, 0.0) + start_event.elapsed_time(end_event) / 1e3
        except Exception as exc:
            timer._error("cuda timing", exc)
    return seconds
