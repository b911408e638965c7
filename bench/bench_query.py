"""Queries over a large steps table: faultlens' DuckDB views over the Parquet layout vs pandas.

    python -m bench.bench_query [--rows 100000000] [--ranks 1024]

Writes (once, cached under bench/out/query-store-<rows>) a steps table in the store layout: `ranks`
ranks on ranks/8 nodes, one segment per node, with identity columns, step, phase, duration and a
sections map. Then runs the same two questions both ways, in one run:
  Q1 per-rank step-time profile: count, mean and median train-step duration per rank;
  Q2 slowest nodes in the last 1,000 steps: mean duration per node, top 10.
pandas reads only the columns a query needs (pyarrow engine), which is what a careful pandas user
would do.
"""

from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import emit, machine, timed
from faultlens.collectors.store.layout import partition_dir, resolve_store
from faultlens.collectors.store.schema import TABLES, ts_array

SECTIONS = ["data", "forward", "backward", "optimizer", "comm"]
OUT = Path(__file__).resolve().parent / "out"


def build_store(rows: int, ranks: int) -> Path:
    root = OUT / f"query-store-{rows}-{ranks}-us"  # -us: timestamps of schema version 2
    done = root / ".complete"
    if done.exists():
        return root
    location = resolve_store(str(root), create=True)
    schema = TABLES["steps"]
    nodes = ranks // 8
    steps_per_rank = rows // ranks
    rng = np.random.default_rng(7)
    base = np.datetime64("2026-11-30T00:00:00", "ns").astype(np.int64)
    for node in range(nodes):
        node_ranks = np.arange(node * 8, node * 8 + 8, dtype=np.int32)
        step = np.repeat(np.arange(steps_per_rank, dtype=np.int64), 8)
        rank = np.tile(node_ranks, steps_per_rank)
        n = len(step)
        slow = 1.3 if node == nodes // 3 else 1.0
        sections = rng.lognormal(-2.0, 0.1, size=(n, len(SECTIONS))) * slow
        duration = sections.sum(axis=1)
        start = base + step * 800_000_000
        offsets = pa.array(np.arange(0, (n + 1) * len(SECTIONS), len(SECTIONS), dtype=np.int32))
        keys = pa.DictionaryArray.from_arrays(
            pa.array(np.tile(np.arange(len(SECTIONS), dtype=np.int32), n)), pa.array(SECTIONS)
        ).cast(pa.string())
        table = pa.table({
            "ts": ts_array(start + (duration * 1e9).astype(np.int64)),
            "node": pa.array(np.full(n, f"node-{node:04d}")),
            "job_id": pa.array(np.full(n, "bench")),
            "attempt": pa.array(np.zeros(n, np.int32)),
            "rank": pa.array(rank),
            "local_rank": pa.array(rank % 8),
            "step": pa.array(step),
            "phase": pa.array(np.where(step % 500 == 0, "eval", "train")),
            "duration_s": pa.array(duration),
            "sections": pa.MapArray.from_arrays(offsets, keys, pa.array(sections.ravel())),
        })
        columns = [
            table.column(f.name) if f.name in table.column_names else pa.nulls(n, f.type)
            for f in schema
        ]
        table = pa.Table.from_arrays(columns, schema=schema)
        directory = partition_dir(location, "steps", "bench", "2026-11-30", f"node-{node:04d}")
        Path(directory).mkdir(parents=True, exist_ok=True)
        pq.write_table(
            table, f"{directory}/00000000000000000000-seg.parquet", row_group_size=1_000_000
        )
    done.touch()
    return root


Q1 = ("SELECT rank, count(*) AS steps, avg(duration_s) AS mean_s, median(duration_s) AS median_s "
      "FROM steps WHERE phase = 'train' GROUP BY rank ORDER BY rank")
Q2 = ("SELECT node, avg(duration_s) AS mean_s FROM steps WHERE step >= (SELECT max(step) FROM "
      "steps) - 1000 "
      "GROUP BY node ORDER BY mean_s DESC LIMIT 10")


def run_duckdb(root: Path) -> dict:
    from faultlens.attribution.reading.store import Store

    with Store(str(root), threads=1) as store:
        q1, t1 = timed(lambda: store.query(Q1))
        q2, t2 = timed(lambda: store.query(Q2))
    return {
        "q1_s": t1.wall_s,
        "q2_s": t2.wall_s,
        "q1_rows": q1.num_rows,
        "top_node": q2.column("node")[0].as_py(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_pandas(root: Path) -> dict:
    import pandas as pd

    files = sorted(str(p) for p in (root / "steps").rglob("*.parquet"))

    def q1() -> pd.DataFrame:
        frame = pd.concat(
            [pd.read_parquet(f, columns=["rank", "phase", "duration_s"]) for f in files]
        )
        frame = frame[frame["phase"] == "train"]
        return frame.groupby("rank")["duration_s"].agg(["count", "mean", "median"])

    def q2() -> pd.Series:
        frame = pd.concat(
            [pd.read_parquet(f, columns=["node", "step", "duration_s"]) for f in files]
        )
        recent = frame[frame["step"] >= frame["step"].max() - 1000]
        return recent.groupby("node")["duration_s"].mean().sort_values(ascending=False).head(10)

    r1, t1 = timed(q1)
    gc.collect()
    r2, t2 = timed(q2)
    return {"q1_s": t1.wall_s, "q2_s": t2.wall_s, "q1_rows": len(r1), "top_node": r2.index[0],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _in_subprocess(which: str, root: Path) -> dict:
    """Each side in its own process, so peak memory is its own."""
    import json

    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_query", "--side", which, "--root", str(root)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="DuckDB over the store vs pandas, on a large "
                                                 "steps table")
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--side", choices=["duckdb", "pandas"], help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        import json

        pa.set_cpu_count(1)
        result = (
            run_duckdb(Path(args.root)) if args.side == "duckdb" else run_pandas(Path(args.root))
        )
        print(json.dumps(result, default=str))
        return
    root, build = timed(lambda: build_store(args.rows, args.ranks))
    duck = _in_subprocess("duckdb", root)
    try:
        pand = _in_subprocess("pandas", root)
    except subprocess.CalledProcessError as exc:  # pandas can run out of memory at this size
        pand = {"error": (exc.stderr or "").strip().splitlines()[-1:] or [f"exit {exc.returncode}"]}
    result = {
        "rows": args.rows,
        "ranks": args.ranks,
        "build_s": round(build.wall_s, 1),
        "duckdb": duck,
        "pandas": pand,
        "machine": machine(),
        "threads": 1,
    }
    if "q1_s" in pand:
        result["ratio_q1"] = round(pand["q1_s"] / duck["q1_s"], 1)
        result["ratio_q2"] = round(pand["q2_s"] / duck["q2_s"], 1)
        result["same_answer"] = (
            duck["q1_rows"] == pand["q1_rows"] and duck["top_node"] == pand["top_node"]
        )
    emit("query_steps", result)


if __name__ == "__main__":
    main()
