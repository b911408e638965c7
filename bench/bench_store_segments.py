"""A query on a store of many small segments beside the same query on its compacted form, whole
`faultlens sql` processes alternated in one run, the answers compared.

    PYTHONPATH=. python -m bench.bench_store_segments [--segments 10000] [--nodes 64] [--runs 3]

The store: the steps table of one job on `--nodes` nodes over one day, written as `--segments`
segments (each a flush of a few rows, as a node agent's sink writes them at the recommended flush
interval), then copied and compacted (`faultlens compact`: one segment per partition). The same
rows are also written through the sink itself (`SegmentSink`, one whole-job sink, a flush of every
node's rows every 5 s of a simulated clock, its default rollup: collectors/store/rollup.py), which
merges its own segments as it goes. Cases, each a fresh process per run, alternated run by run; CPU
is the child's user + sys (wait4), peak RSS from wait4:
- sink: `faultlens sql --store SINK QUERY` on the store the sink wrote (`--segments` flushes);
- many: the same on the `--segments` small segments as they are (a writer without the rollup);
- compacted: the same on the compacted copy;
- duckdb_many / duckdb_compacted: DuckDB alone, `read_parquet` over the same files (the floor a
  query engine pays for the files it opens).
Each query's answer (rows, sum of steps) must be the same in every case.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import Figure, Section, emit, machine, write_section  # noqa: E402
from faultlens.collectors.store.layout import (  # noqa: E402
    new_segment_name,
    partition_dir,
    resolve_store,
    write_parquet,
)
from faultlens.collectors.store.schema import validate  # noqa: E402

TITLE = "Store reading: a query on 10,000 segments beside its compacted form"
QUERY = "SELECT count(*) AS n, sum(step) AS steps FROM steps"
DAY = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


def build(root: Path, segments: int, nodes: int) -> None:
    location = resolve_store(str(root), create=True)
    per_node = max(1, segments // nodes)
    base = int(DAY.timestamp() * 1e6)
    n = 0
    for node in range(nodes):
        name = f"node-{node:04d}"
        directory = partition_dir(location, "steps", "job-a", "2026-11-30", name)
        for k in range(per_node):
            if n >= segments:
                return
            rows = 8
            step = np.arange(k * rows, (k + 1) * rows)
            ts = base + (step * 5_000_000)
            table = pa.table({
                "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                "node": [name] * rows,
                "job_id": ["job-a"] * rows,
                "rank": pa.array(np.full(rows, node * 8, dtype=np.int32)),
                "step": pa.array(step),
                "duration_s": pa.array(np.full(rows, 5.0)),
            })
            # (the generator writes plainly: no fsync and rename per segment, as the sink does)
            os.makedirs(directory, exist_ok=True)
            write_parquet(validate("steps", table), f"{directory}/{new_segment_name()}")
            n += 1


def build_through_sink(root: Path, segments: int, nodes: int) -> int:
    """The rows `build` writes, through one whole-job SegmentSink with its default rollup: a flush
    of every node's 8 rows each 5 s of a simulated clock. Returns the merges it made."""
    from faultlens.collectors.store.sink import SegmentSink

    per_node = max(1, segments // nodes)
    base = int(DAY.timestamp() * 1e6)
    clock = [0.0]
    sink = SegmentSink(str(root), flush_rows=10**9, flush_age_s=10**9, clock=lambda: clock[0])
    names = [f"node-{node:04d}" for node in range(nodes)]
    rows = 8
    for k in range(per_node):
        todo = min(nodes, segments - k * nodes)
        if todo <= 0:
            break
        step = np.tile(np.arange(k * rows, (k + 1) * rows), todo)
        node_of_row = np.repeat(np.arange(todo), rows)
        sink.write("steps", pa.table({
            "ts": pa.array(base + step * 5_000_000, pa.timestamp("us", tz="UTC")),
            "node": [names[n] for n in node_of_row],
            "job_id": ["job-a"] * len(step),
            "rank": pa.array((node_of_row * 8).astype(np.int32)),
            "step": pa.array(step),
            "duration_s": pa.array(np.full(len(step), 5.0)),
        }))
        sink.flush()
        clock[0] += 5.0
    return sink.merges


def _run(argv: list[str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    return {"wall": time.perf_counter() - start, "cpu": usage.ru_utime + usage.ru_stime,
            "rss": usage.ru_maxrss / 1024, "rc": os.waitstatus_to_exitcode(status),
            "out": out.decode(errors="replace")}


DUCK = (
    "import duckdb, glob, json, sys\n"
    "files = sorted(glob.glob(sys.argv[1] + '/steps/*/*/*/*.parquet'))\n"
    "con = duckdb.connect()\n"
    "con.execute('SET enable_progress_bar=false')\n"  # (it prints on stdout past 2 s of wall)
    "n, s = con.sql('SELECT count(*), sum(step) FROM read_parquet($f)', "
    "params={'f': files}).fetchall()[0]\n"
    "print(json.dumps([{'n': n, 'steps': int(s)}]))\n"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--doc", type=Path, default=None)
    parser.add_argument("--commit", default="-")
    parser.add_argument("--keep", type=Path, default=None,
                        help="build the stores here and keep them; a store already there (many, "
                             "compacted: same --segments and --nodes) is reused")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="faultlens-bench-segments-"))
    try:
        many, compacted, sink = work / "many", work / "compacted", work / "sink"
        py = sys.executable
        cli = [py, "-m", "faultlens.controller.cli.main"]
        if not many.exists():
            build(many, args.segments, args.nodes)
        shutil.rmtree(sink, ignore_errors=True)
        start = time.process_time()
        merges = build_through_sink(sink, args.segments, args.nodes)
        sink_cpu = time.process_time() - start
        if not compacted.exists():
            shutil.copytree(many, compacted)
            subprocess.run([*cli, "compact", "--store", str(compacted), "--table", "steps"],
                           check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           stdout=subprocess.DEVNULL)
        counts = {name: sum(1 for _ in (work / name).rglob("*.parquet"))
                  for name in ("many", "compacted", "sink")}
        cases = {
            "sink": [*cli, "sql", "--json", "--store", str(sink), QUERY],
            "many": [*cli, "sql", "--json", "--store", str(many), QUERY],
            "compacted": [*cli, "sql", "--json", "--store", str(compacted), QUERY],
            "duckdb_many": [py, "-c", DUCK, str(many)],
            "duckdb_compacted": [py, "-c", DUCK, str(compacted)],
        }
        samples: dict[str, list[dict]] = {name: [] for name in cases}
        for argv_ in cases.values():  # warm the page cache and the byte code
            _run(argv_)
        for _ in range(args.runs):
            for name, argv_ in cases.items():
                samples[name].append(_run(argv_))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    def answer(run: dict) -> str:
        if run["rc"] != 0:
            return f"rc {run['rc']}"
        try:
            row = json.loads(run["out"])[0]
        except (ValueError, IndexError, KeyError):
            return f"unreadable output: {run['out'][:80]!r}"
        return f"{int(row['n'])} rows, sum of steps {int(row['steps'])}"

    answers = {name: {answer(r) for r in runs} for name, runs in samples.items()}
    same = len({a for v in answers.values() for a in v}) == 1
    result: dict = {
        "segments": counts,
        "segments_arg": args.segments,
        # node flushes the sink made (one segment each before merges): whole nodes only
        "flushes": min(args.segments, max(1, args.segments // args.nodes) * args.nodes),
        "sink_merges": merges,
        "sink_write_cpu_s": round(sink_cpu, 2),
        "nodes": args.nodes,
        "runs": args.runs,
        "same_answers": same,
        "answer": sorted(next(iter(answers.values()))),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "machine": machine(),
    }
    for name, runs in samples.items():
        result[name] = {
            "cpu_s": round(statistics.median(r["cpu"] for r in runs), 3),
            "wall_s": round(statistics.median(r["wall"] for r in runs), 3),
            "peak_rss_mib": round(statistics.median(r["rss"] for r in runs)),
        }
    result["sink_over_compacted_cpu"] = round(
        result["sink"]["cpu_s"] / result["compacted"]["cpu_s"], 2)
    result["many_over_compacted_cpu"] = round(
        result["many"]["cpu_s"] / result["compacted"]["cpu_s"], 2)
    result["duckdb_many_over_compacted_cpu"] = round(
        result["duckdb_many"]["cpu_s"] / result["duckdb_compacted"]["cpu_s"], 2)
    emit("store_segments", result)
    if args.doc is not None:
        write_section(args.doc, section(result, args.commit,
                                        time.strftime("%Y-%m-%d %H:%M", time.gmtime())))
    return 0


def _cell(case: dict) -> str:
    return f"{case['cpu_s']} s CPU ({case['wall_s']} s wall, {case['peak_rss_mib']} MiB)"


def section(result: dict, commit: str, date: str) -> Section:
    many, compacted = result["segments"]["many"], result["segments"]["compacted"]
    rolled = result["segments"]["sink"]
    same = ", same answer" if result["same_answers"] else ", ANSWERS DIFFER"
    return Section(
        title=TITLE,
        compares=f"`faultlens sql` whole processes on the store the sink writes by "
        f"{result['flushes']:,} flushes of the steps table ({result['nodes']} node partitions, a "
        f"flush every 5 s of a simulated clock; its rollup leaves {rolled} segments), on the same "
        f"rows as {many:,} small segments (a writer without the rollup) and on their compacted "
        f"copy ({compacted} segments), beside DuckDB alone reading the same files, alternated in "
        "one run; medians of CPU (user + sys, wait4).",
        commands=(f"PYTHONPATH=. python -m bench.bench_store_segments --segments "
                  f"{result.get('segments_arg', result['flushes'])} --nodes {result['nodes']} "
                  f"--runs {result['runs']}",),
        figures=(
            Figure(f"`{QUERY}` on the store written by {result['flushes']:,} flushes "
                   f"({rolled} segments)", _cell(result["sink"]) + same,
                   "<= 2x the compacted form", "the compacted copy: " + _cell(result["compacted"]),
                   f"{result['sink_over_compacted_cpu']}x CPU", commit, date),
            Figure(f"the same on {many:,} small segments (no rollup)", _cell(result["many"]),
                   "-", "the compacted copy",
                   f"{result['many_over_compacted_cpu']}x CPU", commit, date),
            Figure("DuckDB alone, read_parquet over the small segments",
                   _cell(result["duckdb_many"]), "-",
                   "on the compacted copy: " + _cell(result["duckdb_compacted"]),
                   f"{result['duckdb_many_over_compacted_cpu']}x CPU", commit, date),
        ),
        notes=(f"The rollup leaves {rolled // result['nodes']} segments a partition: merged "
               "levels and the segments younger than its 30 s (a live tail lists them first). "
               f"Without it DuckDB alone already pays {result['duckdb_many_over_compacted_cpu']}x "
               "for opening every small file: no reader-side index takes a store of that many "
               "files to 2x.",
               f"The sink wrote the {result['flushes']:,} flushes in "
               f"{result['sink_write_cpu_s']} s of CPU with {result['sink_merges']} rollup "
               f"merges. Load average {result['load_avg_1m']} on "
               f"{result['machine']['cores']} cores during the run: CPU seconds are the compared "
               "figure.",),
    )

if __name__ == "__main__":
    sys.exit(main())
