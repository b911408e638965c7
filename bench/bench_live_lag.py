"""Live lag: from a process_events segment landing in the store to its crash incident row being
visible.

`faultlens attribute --follow` runs as its own process (as in production) over a store that already
holds a finished job's telemetry (steps of many ranks, GPU samples) while another job keeps landing
one step of all its ranks per second; the benchmark then writes, one at a time, the segment with a
rank's death (SIGKILL, as the supervisor reports it) for a new job, and polls the incidents table
from outside until that job's incident row appears. Side by side, in the same run, the alternative a
user would otherwise pick: re-running the batch pass (`faultlens attribute`) back to back, which
re-reads the whole store every time. Target (issue 5): <= 2 s.

    PYTHONPATH=. python bench/bench_live_lag.py [--runs 10] [--ranks 256] [--steps 400]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import emit, machine  # noqa: E402
from faultlens.attribution.incident import Incident  # noqa: E402
from faultlens.collectors.store.layout import list_segments, resolve_store  # noqa: E402
from faultlens.collectors.store.sink import SegmentSink  # noqa: E402

T0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=1)


def background(store: str, ranks: int, steps: int) -> int:
    """A finished job: `steps` steps of `ranks` ranks on 8-GPU nodes, GPU samples every second,
    clean exits.
    """
    rows = 0
    with SegmentSink(store, flush_rows=50_000, flush_age_s=3600) as sink:
        sink.write(
            "ranks",
            [
                {
                    "ts": T0,
                    "job_id": "background",
                    "attempt": 0,
                    "rank": r,
                    "node": f"n{r // 8:03d}",
                    "local_rank": r % 8,
                    "gpu_index": r % 8,
                    "world_size": ranks,
                }
                for r in range(ranks)
            ],
        )
        for step in range(steps):
            start = T0 + dt.timedelta(seconds=step)
            batch = [
                {
                    "ts": start + dt.timedelta(seconds=0.9),
                    "job_id": "background",
                    "attempt": 0,
                    "rank": r,
                    "node": f"n{r // 8:03d}",
                    "step": step,
                    "phase": "train",
                    "start_ts": start,
                    "end_ts": start + dt.timedelta(seconds=0.9),
                    "duration_s": 0.9,
                    "sections": {"forward": 0.3 + (r % 7) * 1e-3, "backward": 0.5, "comm": 0.1},
                }
                for r in range(ranks)
            ]
            sink.write("steps", batch)
            rows += len(batch)
            if step % 10 == 0:
                sink.write(
                    "gpu_samples",
                    [
                        {
                            "ts": start,
                            "node": f"n{n:03d}",
                            "gpu_index": g,
                            "temp_c": 60.0,
                            "sm_clock_mhz": 1980,
                            "clocks_event_reasons": 0,
                            "source": "recorded",
                        }
                        for n in range(ranks // 8)
                        for g in range(8)
                    ],
                )
        sink.write(
            "process_events",
            [
                {
                    "ts": T0 + dt.timedelta(seconds=steps + 1),
                    "job_id": "background",
                    "attempt": 0,
                    "rank": r,
                    "node": f"n{r // 8:03d}",
                    "kind": "exit",
                    "exit_code": 0,
                    "source": "supervisor",
                }
                for r in range(ranks)
            ],
        )
    return rows


class StepStream:
    """A running job beside the measurement: every second one step of `ranks` ranks lands as a
    segment.
    """

    def __init__(self, store: str, ranks: int) -> None:
        self.store = store
        self.ranks = ranks
        self.stop = threading.Event()
        self.steps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with SegmentSink(self.store, flush_rows=10**9, flush_age_s=3600) as sink:
            while not self.stop.is_set():
                end = dt.datetime.now(dt.UTC)
                start = end - dt.timedelta(seconds=0.9)
                sink.write(
                    "steps",
                    [
                        {
                            "ts": end,
                            "job_id": "running",
                            "attempt": 0,
                            "rank": r,
                            "node": f"r{r // 8:03d}",
                            "step": self.steps,
                            "phase": "train",
                            "start_ts": start,
                            "end_ts": end,
                            "duration_s": 0.9,
                            "sections": {"forward": 0.3, "backward": 0.5, "comm": 0.1},
                        }
                        for r in range(self.ranks)
                    ],
                )
                sink.flush()
                self.steps += 1
                self.stop.wait(1.0)


def land_crash(store: str, job: str) -> float:
    """Write the segment saying rank 3 of `job` was SIGKILLed; returns the wall time it became
    visible.
    """
    now = dt.datetime.now(dt.UTC)
    with SegmentSink(store, flush_rows=10_000, flush_age_s=3600) as sink:
        sink.write(
            "process_events",
            [
                {
                    "ts": now,
                    "job_id": job,
                    "attempt": 0,
                    "rank": 3,
                    "node": "n000",
                    "kind": "exit",
                    "exit_code": -9,
                    "signal": "SIGKILL",
                    "source": "supervisor",
                }
            ],
        )
    return time.time()


def wait_for_incident(
    store: str, incident_id: str, seen: set[str], timeout_s: float
) -> float | None:
    location = resolve_store(store)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in list_segments(location, "incidents"):
            if path in seen:
                continue
            seen.add(path)
            ids = pq.read_table(path, columns=["incident_id"]).column("incident_id").to_pylist()
            if incident_id in ids:
                return time.time()
        time.sleep(0.01)
    return None


def measure(store: str, runs: int, prefix: str, timeout_s: float) -> list[float]:
    seen = set(list_segments(resolve_store(store), "incidents"))
    lags = []
    for i in range(runs):
        job = f"{prefix}-{i}"
        landed = land_crash(store, job)
        visible = wait_for_incident(store, Incident.make_id("crash", job, 0), seen, timeout_s)
        lags.append(float("nan") if visible is None else visible - landed)
        time.sleep(0.2)
    return lags


def summary(lags: list[float]) -> dict[str, float | int]:
    done = sorted(x for x in lags if x == x)
    if not done:
        return {"runs": len(lags), "found": 0}
    return {
        "runs": len(lags),
        "found": len(done),
        "p50_s": round(statistics.median(done), 3),
        "p95_s": round(done[min(len(done) - 1, int(0.95 * len(done)))], 3),
        "max_s": round(done[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--interval", type=float, default=0.25, help="follow mode's listing "
                                                                     "interval")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "faultlens.controller.cli.main"]
    with tempfile.TemporaryDirectory(prefix="faultlens-lag-") as store:
        started = time.perf_counter()
        rows = background(store, args.ranks, args.steps)
        setup_s = time.perf_counter() - started

        follower = subprocess.Popen(
            [*cli, "attribute", "--store", store, "--follow", "--interval", str(args.interval)],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        stream = StepStream(store, args.ranks)
        try:
            assert follower.stderr is not None
            follower.stderr.readline()  # "following ..." once it is listening
            time.sleep(3.0)  # its first poll reads the existing store
            stream.thread.start()
            time.sleep(2.0)
            follow = measure(store, args.runs, "follow", timeout_s=30)
        finally:
            stream.stop.set()
            follower.terminate()
            follower.wait(timeout=30)
            stream.thread.join(timeout=30)

        # the alternative: the batch pass re-run back to back (a cron job with no pause at all)
        stop = False
        batch_runs: list[float] = []

        def loop() -> None:
            while not stop:
                begun = time.perf_counter()
                subprocess.run([*cli, "attribute", "--store", store, "--json"], env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
                batch_runs.append(time.perf_counter() - begun)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        batch = measure(store, max(3, args.runs // 3), "batch", timeout_s=120)
        stop = True
        thread.join(timeout=300)

    emit(
        "live_lag",
        {
            "what": "segment landed -> its crash incident row visible (seconds)",
            "machine": machine(),
            "store": {
                "step_rows": rows,
                "ranks": args.ranks,
                "steps": args.steps,
                "setup_s": round(setup_s, 1),
            },
            "follow": {
                "interval_s": args.interval,
                "while_streaming_step_rows_per_s": args.ranks,
                **summary(follow),
            },
            "batch_rerun_back_to_back": {
                **summary(batch),
                "pass_s_median": round(statistics.median(batch_runs), 2) if batch_runs else None,
            },
            "target_s": 2.0,
            "command": "PYTHONPATH=. python bench/bench_live_lag.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
