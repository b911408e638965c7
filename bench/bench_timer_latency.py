"""Training-thread step latency with the step timer running (writer thread writing real Parquet
segments) beside the same loop without it: p50 / p99 / p99.9 / max per step, and the ratios.

    python -m bench.bench_timer_latency [--steps 20000] [--work-us 500] [--flush-interval 0.05]
    [--repeat 3]

A step is `--work-us` of CPU work on the training thread (two sections), like a small model's
host-side step. Runs:
- without: the loop alone (what a user has without faultlens);
- timer: `with timer.step(n)` / `timer.section(...)` with a real SegmentSink on a temporary store;
  the writer thread drains every --flush-interval seconds (far more often than the default 2 s, to
  make its GIL use visible) and writes a segment each time;
- timer_slow_store: the same with a store that takes 50 ms per segment write (a slow object store),
  so the queue overflows and rows are dropped (and counted).
Best of --repeat runs of each (by p99). Per-step latency is measured on the training thread around
the whole step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from bench.common import emit, machine
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer

IDENTITY = RankIdentity(rank=0, job_id="bench", node="n")


class SlowSink(SegmentSink):
    def _write_table(self, name: str, table: Any) -> list[str]:
        time.sleep(0.05)
        return super()._write_table(name, table)


def _work(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    x = 0
    while time.perf_counter() < end:
        x += 1


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6

    return {
        "p50_us": round(pick(0.50), 1),
        "p99_us": round(pick(0.99), 1),
        "p999_us": round(pick(0.999), 1),
        "max_us": round(ordered[-1] * 1e6, 1),
        "mean_us": round(statistics.fmean(ordered) * 1e6, 1),
    }


def run_without(steps: int, work_us: float) -> dict[str, Any]:
    latencies = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _work(work_us / 2)
        _work(work_us / 2)
        latencies.append(time.perf_counter() - t0)
    return _percentiles(latencies)


def run_timer(steps: int, work_us: float, flush_interval: float, slow: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as store:
        sink = (SlowSink if slow else SegmentSink)(store, flush_rows=10**9, flush_age_s=3600.0)
        timer = StepTimer(
            sink, identity=IDENTITY, flush_interval_s=flush_interval, max_buffered_rows=4096
        )
        latencies = []
        forward, backward = timer.section("forward"), timer.section("backward")
        for n in range(steps):
            t0 = time.perf_counter()
            with timer.step(n):
                with forward:
                    _work(work_us / 2)
                with backward:
                    _work(work_us / 2)
            latencies.append(time.perf_counter() - t0)
        timer.close(timeout_s=30)
        stats = timer.stats
        result = _percentiles(latencies)
        result.update(
            rows_written=stats.rows_written,
            dropped=stats.dropped,
            segments=sink.segments_written,
            accounted=stats.steps == stats.rows_written + stats.dropped,
        )
        return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--work-us", type=float, default=500.0)
    parser.add_argument("--flush-interval", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    def best(fn: Any) -> dict[str, Any]:
        return min((fn() for _ in range(args.repeat)), key=lambda r: r["p99_us"])

    without = best(lambda: run_without(args.steps, args.work_us))
    timer = best(lambda: run_timer(args.steps, args.work_us, args.flush_interval, slow=False))
    slow = best(lambda: run_timer(args.steps, args.work_us, args.flush_interval, slow=True))
    emit("timer_latency", {
        "steps": args.steps, "work_us": args.work_us, "flush_interval_s": args.flush_interval,
        "without": without, "timer": timer, "timer_slow_store": slow,
        "p99_ratio_timer_vs_without": round(timer["p99_us"] / without["p99_us"], 3),
        "p99_ratio_slow_store_vs_without": round(slow["p99_us"] / without["p99_us"], 3),
        "p50_added_us": round(timer["p50_us"] - without["p50_us"], 1),
        "machine": machine(),
    })


if __name__ == "__main__":
    main()
