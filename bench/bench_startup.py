"""CLI start-up: `faultlens --help` and `faultlens sql` with lazy command loading, beside the eager
CLI (every command module imported up front, as before) and beside what a user would otherwise run
(python importing duckdb and querying the Parquet files directly).

    python -m bench.bench_startup [--runs 7]

Each command runs as a fresh process `--runs` times; the medians of wall-clock and CPU (user+sys of
the child) seconds are printed as one JSON line. CPU seconds are the steadier figure on a busy
machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import emit, machine

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _store(root: Path) -> Path:
    from faultlens.collectors.store.sink import SegmentSink

    store = root / "store"
    now = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    with SegmentSink(store) as sink:
        sink.write(
            "steps",
            [
                {
                    "ts": now + dt.timedelta(seconds=i),
                    "node": f"node-{i % 4}",
                    "job_id": "j",
                    "rank": i % 8,
                    "step": i // 8,
                    "duration_s": 0.5,
                }
                for i in range(4000)
            ],
        )
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        query = "SELECT node, count(*) FROM steps GROUP BY node"
        cases = {
            "python_bare": [py, "-c", "pass"],
            "help_lazy": [py, "-m", "faultlens.controller.cli.main", "--help"],
            "help_eager": [
                py,
                "-c",
                "from faultlens.controller.cli.main import build_parser; "
                "build_parser().print_help()",
            ],
            "sql_lazy": [
                py,
                "-m",
                "faultlens.controller.cli.main",
                "sql",
                "--store",
                str(store),
                query,
            ],
            "sql_eager": [
                py,
                "-c",
                "import sys; from faultlens.controller.cli.main import "
                "build_parser; "
                f"a = build_parser().parse_args(['sql', '--store', {str(store)!r}, "
                f"{query!r}]); "
                "sys.exit(a.func(a))",
            ],
            "duckdb_direct": [
                py,
                "-c",
                'import duckdb; print(duckdb.connect().sql("SELECT node, '
                "count(*) FROM "
                f"read_parquet('{store}/steps/**/*.parquet') GROUP BY "
                'node").fetchall())',
            ],
        }
        results: dict[str, dict[str, float]] = {}
        for name, argv in cases.items():
            _run(argv, env)  # warm the page cache
            samples = [_run(argv, env) for _ in range(args.runs)]
            results[name] = {"wall_s": round(statistics.median(w for w, _ in samples), 3),
                             "cpu_s": round(statistics.median(c for _, c in samples), 3)}
    load = os.getloadavg()[0]
    emit(
        "startup",
        {
            "runs": args.runs,
            "load_avg_1m": round(load, 2),
            "machine": machine(),
            **results,
            "help_speedup_cpu": round(
                results["help_eager"]["cpu_s"] / results["help_lazy"]["cpu_s"], 1
            ),
            "sql_speedup_cpu": round(
                results["sql_eager"]["cpu_s"] / results["sql_lazy"]["cpu_s"], 1
            ),
        },
    )


if __name__ == "__main__":
    main()
