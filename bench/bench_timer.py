"""Cost of timing a section on the training thread: the faultlens step timer vs what a user would
write by hand.

    python -m bench.bench_timer [--steps 20000] [--sections 8] [--repeat 5]

Each step times `sections` empty sections (one of them nested), so the figures are the timer's own
overhead.
- faultlens: `with timer.step(n):` / `with timer.section(name):`, rows queued for the writer thread
  (the writer's work, rows -> Arrow -> Parquet segment, is measured apart: it runs off the training
  thread).
- naive: a @contextlib.contextmanager that appends {step, name, start, end} dicts
  (time.perf_counter) to a list, turned into per-step rows with pandas at the end (the pandas cost
  is spread over the sections).
Per-section cost = (loop time - the same loop with no timing) / (steps x sections); best of `repeat`
runs.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator

import pandas as pd

from bench.common import emit, machine
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer

NAMES = (
    "data",
    "forward",
    "attention",
    "backward",
    "comm",
    "optimizer",
    "checkpoint",
    "logging",
    "eval",
    "misc",
)


def _best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def baseline(steps: int, sections: int) -> float:
    names = NAMES[:sections]
    started = time.perf_counter()
    for _step in range(steps):
        for _name in names:
            pass
    return time.perf_counter() - started


def faultlens(steps: int, sections: int) -> float:
    timer = StepTimer(None, identity=RankIdentity(rank=0), max_buffered_rows=steps + 1, start=False)
    names = NAMES[:sections]
    outer = timer.section(names[0])
    nested = [timer.section(name) for name in names[1:]]
    section = timer.section
    started = time.perf_counter()
    for step in range(steps):
        with timer.step(step):
            with outer, nested[0]:  # a nested pair: "data/forward"
                pass
            for name in names[2:]:
                with section(name):
                    pass
    elapsed = time.perf_counter() - started
    timer.close()
    return elapsed


def naive(steps: int, sections: int) -> float:
    records: list[dict] = []

    @contextlib.contextmanager
    def timed(step: int, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            records.append({"step": step, "name": name, "start": start, "end": time.perf_counter()})

    names = NAMES[:sections]
    started = time.perf_counter()
    for step in range(steps):
        with timed(step, "step"):
            with timed(step, names[0]), timed(step, names[1]):
                pass
            for name in names[2:]:
                with timed(step, name):
                    pass
    frame = pd.DataFrame.from_records(records)
    frame["seconds"] = frame["end"] - frame["start"]
    frame.pivot_table(index="step", columns="name", values="seconds", aggfunc="sum")
    return time.perf_counter() - started


def writer_cost(rows: int) -> float:
    """Seconds per row for the writer thread's work: queued dict rows -> Arrow -> a Parquet segment.
    """
    with tempfile.TemporaryDirectory() as store:
        sink = SegmentSink(store, flush_rows=rows + 1, flush_age_s=3600)
        timer = StepTimer(sink, identity=RankIdentity(rank=0, job_id="bench", node="n"),
                          max_buffered_rows=rows + 1, start=False)
        for step in range(rows):
            with timer.step(step):
                for name in NAMES[:6]:
                    with timer.section(name):
                        pass
        started = time.perf_counter()
        timer.flush()
        elapsed = time.perf_counter() - started
        if timer.stats.rows_written != rows:
            raise RuntimeError(f"writer wrote {timer.stats.rows_written} rows, expected {rows}")
        return elapsed / rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--sections", type=int, default=8, choices=range(2, len(NAMES) + 1))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    count = args.steps * args.sections
    empty = _best(lambda: baseline(args.steps, args.sections), args.repeat)
    ours = _best(lambda: faultlens(args.steps, args.sections), args.repeat)
    theirs = _best(lambda: naive(args.steps, args.sections), args.repeat)
    per_section_us = (ours - empty) / count * 1e6
    naive_us = (theirs - empty) / count * 1e6
    emit("timer", {
        "steps": args.steps, "sections_per_step": args.sections,
        "faultlens_us_per_section": round(per_section_us, 3),
        "naive_contextmanager_pandas_us_per_section": round(naive_us, 3),
        "speedup_vs_naive": round(naive_us / per_section_us, 2) if per_section_us > 0 else None,
        "target_us_per_section": 5.0, "meets_target": per_section_us <= 5.0,
        "writer_thread_us_per_step_row": round(writer_cost(min(args.steps, 20_000)) * 1e6, 2),
        "note": "per-section cost includes the step's own overhead spread over its sections; best "
                "of "
                f"{args.repeat} runs",
        "machine": machine(),
    })


if __name__ == "__main__":
    main()
