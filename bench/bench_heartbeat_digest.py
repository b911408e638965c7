"""A job's heartbeats in the batch pass: the reduced read (attribution/reading/windows.py: a digest
per (attempt, rank) and the lowest ranks' steps for the progress baseline's fallback) beside reading
them whole (what the pass did before, and what `load_from_store` still does), on one job of N ranks
beating once a second for H hours.

    python -m bench.bench_heartbeat_digest [--ranks 2048] [--hours 1] [--attempts 2] [--out
    bench/out/heartbeats]

The heartbeats are written once through the real sink (cached under --out, git-ignored), a beat per
rank per second as the heartbeat source emits them (steps of 0.8 s, a rank's last completed step and
its end). Each read runs in its own process (its peak RSS is its own: os.wait4); both must give the
same answers to the detectors' readings (checked: closed ranks, last progress per attempt, completed
steps, the fallback's intervals).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import emit, machine

ROOT = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
STEP_S = 0.8

_READ = """
import json, sys, time
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store
from faultlens.attribution.reading.windows import JobWindows
from faultlens.attribution.detectors.crash.liveness import closed_ranks
from faultlens.attribution.detectors.progress.monitor import _heartbeat_intervals, _last_progress
import pandas as pd

began = time.perf_counter()
with Store(sys.argv[1]) as store:
    if sys.argv[2] == "whole":
        beats = store.query("SELECT * FROM heartbeats WHERE job_id = 'beats'")
        from faultlens.attribution.reading.telemetry import to_frame

        beats = to_frame(beats, "heartbeats")
    else:
        beats = JobWindows.open(store, "beats", None, warmup_steps=3).context.heartbeats
seconds = time.perf_counter() - began
answers = {}
for attempt in sorted(int(a) for a in beats["attempt"].dropna().unique()):
    mine = beats[beats["attempt"] == attempt]
    last = _last_progress(pd.DataFrame(), mine)
    answers[attempt] = {
        "closed": sorted(closed_ranks(beats, attempt)),
        "last": [str(last[0]), last[1], last[2]],
        "intervals": _heartbeat_intervals(mine, 3)[-20:],
    }
print(json.dumps({"rows": len(beats), "seconds": seconds, "answers": answers}, default=str))
"""


def write_beats(store: Path, ranks: int, hours: float, attempts: int) -> int:
    """A beat per rank per second for `hours` per attempt, through the real sink; the rows written.
    """
    from faultlens.collectors.store.sink import SegmentSink

    sink = SegmentSink(str(store), flush_rows=2_000_000, flush_age_s=3600.0)
    seconds = int(hours * 3600)
    rank = np.arange(ranks, dtype=np.int32)
    written = 0
    start = T0
    for attempt in range(attempts):
        for second in range(0, seconds, 60):  # a minute of beats per write
            at = np.arange(second, min(second + 60, seconds), dtype=np.int64)
            when = np.repeat(at, ranks)
            who = np.tile(rank, len(at))
            done = (when / STEP_S).astype(np.int64) - 1
            ts = np.datetime64(start.replace(tzinfo=None), "us") + (when * 1_000_000 + who).astype(
                "timedelta64[us]"
            )
            step_ts = np.datetime64(start.replace(tzinfo=None), "us") + \
                ((done + 1) * STEP_S * 1_000_000).astype(np.int64).astype("timedelta64[us]")
            closed = (when == seconds - 1) & (attempt == attempts - 1)
            table = pa.table({
                "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                "node": pa.array([f"node-{r // 8:04d}" for r in who.tolist()]),
                "job_id": pa.array(["beats"] * len(who)),
                "attempt": pa.array(np.full(len(who), attempt, np.int32)),
                "rank": pa.array(who), "local_rank": pa.array(who % 8),
                "pid": pa.array(1000 + who.astype(np.int64)),
                "step": pa.array(np.where(done >= 0, done, 0), mask=done < 0),
                "step_ts": pa.array(step_ts, pa.timestamp("us", tz="UTC"), mask=done < 0),
                "steps": pa.array(done + 1), "current_step": pa.array(done + 1),
                "in_step": pa.array(~closed), "phase": pa.array(["train"] * len(who)),
                "loss": pa.array(np.full(len(who), 2.0)), "closed": pa.array(closed),
            })
            sink.write("heartbeats", table)
            written += table.num_rows
        start += dt.timedelta(seconds=seconds + 60)
    sink.close()
    return written


def measured(store: Path, how: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _READ, str(store), how],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        text=True,
    )
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the {how} read failed ({status})")
    result = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))
    result.update(
        wall_s=round(time.perf_counter() - began, 2),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 2),
        peak_rss_mb=round(usage.ru_maxrss / 1024.0, 1),
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2048)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "heartbeats")
    args = parser.parse_args(argv)
    store = args.out / f"beats-{args.ranks}r-{args.hours:g}h-{args.attempts}a"
    marker = store.with_suffix(".done")
    if not marker.exists():
        began = time.perf_counter()
        rows = write_beats(store, args.ranks, args.hours, args.attempts)
        marker.write_text(
            json.dumps({"rows": rows, "write_s": round(time.perf_counter() - began, 1)})
        )
    written = json.loads(marker.read_text())
    whole, reduced = measured(store, "whole"), measured(store, "reduced")
    same = whole.pop("answers") == reduced.pop("answers")
    emit("heartbeat_digest", {"ranks": args.ranks, "hours": args.hours, "attempts": args.attempts,
                              "rows_in_store": written["rows"], "whole": whole, "reduced": reduced,
                              "same_answers": same, "machine": machine()})
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
