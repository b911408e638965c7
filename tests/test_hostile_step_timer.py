"""StepTimer never loses a row silently (issue 16): rows pushed out of the full queue by a slow
store are logged (rate-limited) and counted, rows still queued or in the sink's buffer when close()
gives up are counted, and after close() every step is either in the store or counted: steps ==
rows_written + dropped, rows_written == what the store holds. Real SegmentSink on a real store; the
slowness is a real sleep in its segment write."""

from __future__ import annotations

import logging
import shutil
import threading
import time

import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer

IDENTITY = RankIdentity(rank=0, job_id="job-1", node="node-1")


class SlowSink(SegmentSink):
    """A real sink whose segment writes take `delay_s` (a slow object store), or wait for `gate`."""

    def __init__(
        self, store, delay_s: float = 0.0, gate: threading.Event | None = None, **kwargs
    ) -> None:
        super().__init__(store, flush_age_s=3600.0, **kwargs)
        self.delay_s = delay_s
        self.gate = gate

    def _write_table(self, name, table):
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.delay_s)
        return super()._write_table(name, table)


def _stored(store_dir) -> int:
    with Store(store_dir) as store:
        return store.query("SELECT count(*) AS n FROM steps").to_pylist()[0]["n"]


def _run(timer: StepTimer, steps: int) -> None:
    for n in range(steps):
        with timer.step(n), timer.section("forward"):
            pass


def test_queue_overflow_with_a_slow_sink_is_logged_and_counted(store_dir, caplog):
    timer = StepTimer(SlowSink(store_dir, delay_s=0.05), identity=IDENTITY, max_buffered_rows=64,
                      flush_interval_s=0.001)
    timer.drop_log_interval_s = 3600.0  # rate limit: one warning while running, one at close
    with caplog.at_level(logging.WARNING, logger="faultlens.collectors.training.step_timer"):
        for n in range(20_000):
            with timer.step(n), timer.section("forward"):
                pass
            if n % 2000 == 0:
                time.sleep(0.01)
        timer.close(timeout_s=60)
    stats = timer.stats
    assert stats.dropped_queue_full > 0
    assert stats.steps == 20_000 == stats.rows_written + stats.dropped
    assert stats.dropped == stats.dropped_queue_full + stats.lost_at_close
    assert _stored(store_dir) == stats.rows_written
    warnings = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert 1 <= len(warnings) <= 3  # rate-limited, never one per row
    assert (
        "pushed out of the full queue" in warnings[-1]
        and f"of {stats.steps} in all" in warnings[-1]
    )


@pytest.mark.parametrize("rows", [10, 500, 3000])
def test_close_that_gives_up_counts_rows_in_the_queue_and_the_sink_buffer(store_dir, caplog, rows):
    gate = threading.Event()
    sink = SlowSink(store_dir, gate=gate)
    timer = StepTimer(sink, identity=IDENTITY, max_buffered_rows=10_000, flush_interval_s=0.001)
    _run(timer, rows)
    time.sleep(0.05)  # the writer takes some rows and hangs in the store
    _run_more = rows // 2
    for n in range(rows, rows + _run_more):
        with timer.step(n):
            pass
    with caplog.at_level(logging.WARNING, logger="faultlens.collectors.training.step_timer"):
        timer.close(timeout_s=0.2)
    stats = timer.stats
    assert stats.rows_written == 0
    assert stats.lost_at_close == rows + _run_more == stats.dropped
    assert any("left at close" in r.getMessage() for r in caplog.records)
    # a step after close is counted, not queued forever
    with timer.step(10**6):
        pass
    assert stats.steps == stats.dropped + stats.rows_written
    # the store comes back: the rows the writer had handed over land after all, and the counts
    # follow
    gate.set()
    timer._writer.join(30)
    assert stats.steps == stats.rows_written + stats.dropped
    assert _stored(store_dir) == stats.rows_written


def test_store_failing_at_close_counts_the_sink_buffer(tmp_path):
    store_dir = tmp_path / "store"
    sink = SegmentSink(store_dir, flush_age_s=3600.0)
    timer = StepTimer(sink, identity=IDENTITY, flush_interval_s=3600.0)
    _run(timer, 300)
    assert timer.flush()
    shutil.rmtree(store_dir)
    # every later write fails for real
    store_dir.write_text("the store is gone: a file in its place")
    _run(timer, 200)
    timer.close(timeout_s=10)
    stats = timer.stats
    assert stats.rows_written == 300
    assert stats.lost_at_close == 200 and stats.steps == stats.rows_written + stats.dropped
    assert stats.write_failures >= 1


def test_no_store_counts_every_row():
    timer = StepTimer(None, identity=IDENTITY, flush_interval_s=0.001)
    _run(timer, 1000)
    timer.close()
    assert timer.stats.dropped_no_store + timer.stats.lost_at_close == 1000 == timer.stats.dropped
    assert timer.stats.ranks_dropped == 1
