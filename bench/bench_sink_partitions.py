"""The whole-job sink at 128 partitions per flush beside pandas, per CPU second, alternated in one
run, the rows read back and compared.

    PYTHONPATH=. python -m bench.bench_sink_partitions [--rows 1000000] [--repeat 3] [--doc FILE]

The same steps rows (bench_sink's batches: 1,024 ranks on 128 nodes, a sections map per row) are
written three ways, each case in turn, `--repeat` rounds:
- sink: faultlens' SegmentSink, one flush of all rows, one crash-safe segment per (job, date,
  node) partition: 128 segments;
- pandas_partition_cols: what a pandas user writes for the same partitions, the batches
  concatenated into one frame and `DataFrame.to_parquet(dir, partition_cols=["node"])` (one file
  per node);
- pandas_one_file: `DataFrame.to_parquet` of the same frame as one file, no partitions (the floor
  of encoding these rows).
CPU is the process's (every thread: the sink writes segments on a pool) from time.process_time;
pyarrow is held to one CPU thread for all three. Correctness: each case's files are read back and
their rows per node and sum of steps compared with the input.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402

from bench.bench_sink import _as_pandas_frame, make_batches  # noqa: E402
from bench.common import Figure, Section, emit, machine, timed, write_section  # noqa: E402
from faultlens.collectors.store.sink import SegmentSink  # noqa: E402

TITLE = "Sink: 128 partitions per flush beside pandas partition_cols"


def _summary(path: Path, node_column: str = "node") -> dict[str, tuple[int, int]]:
    """rows and sum of step per node of every Parquet file under path (node from the column, or
    from pandas' node=<value> directories)."""
    files = [str(p) for p in path.rglob("*.parquet")]
    out: dict[str, tuple[int, int]] = {}
    for file in files:
        table = ds.dataset(file, format="parquet").to_table(
            columns=[c for c in ("node", "step") if c in pa.parquet.read_schema(file).names]
        )
        if "node" in table.column_names:
            groups = table.group_by("node").aggregate([("step", "count"), ("step", "sum")])
            for node, n, s in zip(*(groups.column(i).to_pylist() for i in range(3)), strict=True):
                rows, total = out.get(node, (0, 0))
                out[node] = (rows + n, total + s)
        else:
            node = Path(file).parent.name.split("=", 1)[1]
            rows, total = out.get(node, (0, 0))
            out[node] = (rows + table.num_rows, total + pc.sum(table.column("step")).as_py())
    return out


def run(rows: int, repeat: int) -> dict:
    import pyarrow.parquet  # noqa: F401  (pa.parquet for _summary)

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    batches = make_batches(rows, 20_000, nodes=128)
    frame = None
    import pandas as pd

    frame = pd.concat([_as_pandas_frame(b) for b in batches], ignore_index=True)
    truth: dict[str, tuple[int, int]] = {}
    table = pa.concat_tables(batches)
    groups = table.group_by("node").aggregate([("step", "count"), ("step", "sum")])
    for node, n, s in zip(*(groups.column(i).to_pylist() for i in range(3)), strict=True):
        truth[node] = (n, s)
    samples: dict[str, list] = {"sink": [], "pandas_partition_cols": [], "pandas_one_file": []}
    same: dict[str, bool] = {}
    segments = 0
    for round_ in range(repeat):
        work = Path(tempfile.mkdtemp(prefix="faultlens-bench-sinkp-"))
        try:

            def sink(work: Path = work) -> int:
                with SegmentSink(work / "store", flush_rows=10 * rows, flush_age_s=3600) as s:
                    for b in batches:
                        s.write("steps", b)
                return s.segments_written

            segments, t = timed(sink)
            samples["sink"].append(t)

            def partitioned(work: Path = work) -> None:
                frame.to_parquet(work / "pandas-parts", partition_cols=["node"])

            _, t = timed(partitioned)
            samples["pandas_partition_cols"].append(t)

            def one_file(work: Path = work) -> None:
                frame.to_parquet(work / "pandas-one.parquet")

            _, t = timed(one_file)
            samples["pandas_one_file"].append(t)
            if round_ == 0:
                same["sink"] = _summary(work / "store") == truth
                same["pandas_partition_cols"] = _summary(work / "pandas-parts") == truth
        finally:
            shutil.rmtree(work, ignore_errors=True)
    cases = {
        name: {
            "cpu_s": round(statistics.median(t.cpu_s for t in runs), 3),
            "wall_s": round(statistics.median(t.wall_s for t in runs), 3),
            "rows_per_cpu_s": round(rows / statistics.median(t.cpu_s for t in runs)),
        }
        for name, runs in samples.items()
    }
    sink_cpu = cases["sink"]["cpu_s"]
    return {
        "rows": rows,
        "repeat": repeat,
        "sink_segments": segments,
        "same_rows": same,
        **cases,
        "sink_over_partition_cols_per_cpu_s": round(
            cases["pandas_partition_cols"]["cpu_s"] / sink_cpu, 2
        ),
        "sink_over_one_file_per_cpu_s": round(cases["pandas_one_file"]["cpu_s"] / sink_cpu, 2),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "machine": machine(),
    }


def section(result: dict, commit: str, date: str) -> Section:
    sink, parts, one = (result[k] for k in ("sink", "pandas_partition_cols", "pandas_one_file"))
    right = result["same_rows"]

    def cell(case: dict) -> str:
        return (
            f"{case['rows_per_cpu_s']:,} rows per CPU-second ({case['cpu_s']} s CPU, "
            f"{case['wall_s']} s wall)"
        )

    return Section(
        title=TITLE,
        compares="faultlens' SegmentSink writing one flush of a 1,024-rank job's steps rows "
        "(128 nodes: one crash-safe segment per partition) beside pandas writing the same rows "
        "with partition_cols=['node'] and as one plain file, alternated in one run; per CPU "
        "second (every thread), pyarrow held to one CPU thread; each case's files read back.",
        commands=(
            f"PYTHONPATH=. python -m bench.bench_sink_partitions --rows {result['rows']} "
            f"--repeat {result['repeat']}",
        ),
        figures=(
            Figure(
                f"{result['rows']:,} rows, 128 partitions in one flush "
                f"({result['sink_segments']} segments)",
                cell(sink) + (", rows per node same as the input" if right.get("sink") else ""),
                ">= 1.0x pandas per CPU second",
                "pandas to_parquet(partition_cols=['node']): "
                + cell(parts)
                + (", same rows" if right.get("pandas_partition_cols") else ""),
                f"{result['sink_over_partition_cols_per_cpu_s']}x",
                commit,
                date,
            ),
            Figure(
                "the same rows: pandas writing one file, no partitions",
                cell(sink),
                "-",
                "pandas to_parquet, one file: " + cell(one),
                f"{result['sink_over_one_file_per_cpu_s']}x",
                commit,
                date,
            ),
        ),
        notes=(
            f"Load average {result['load_avg_1m']} on {result['machine']['cores']} cores: wall "
            "figures are inflated by it, CPU seconds are the compared figure.",
            "The one-file row is not like for like: it sorts nothing, writes one footer and no "
            "partition; the sink's extra CPU is the sort by partition and one take of every "
            "column (the sections map dominates), and 128 footers.",
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--doc", type=Path, default=None, help="write the section here")
    parser.add_argument("--commit", default="-")
    args = parser.parse_args(argv)
    result = run(args.rows, args.repeat)
    emit("sink_partitions", result)
    if args.doc is not None:
        write_section(
            args.doc, section(result, args.commit, time.strftime("%Y-%m-%d %H:%M", time.gmtime()))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
