"""Step rows per second into Parquet: the faultlens segment sink vs pandas DataFrame.to_parquet per
batch.

    python -m bench.bench_sink [--rows 2000000] [--batch 20000] [--nodes 1,128]

Both write the same Arrow batches of steps rows (identity columns, step, phase, timestamps, a
sections map) to a temporary directory; the sink buffers and writes crash-safe segments in the store
layout, pandas writes one file per batch. pyarrow is limited to one CPU thread for both, so figures
are per core.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import emit, machine, timed
from faultlens.collectors.store.schema import validate
from faultlens.collectors.store.sink import SegmentSink

SECTIONS = ["data", "forward", "backward", "optimizer", "comm"]


def make_batches(
    rows: int, batch: int, ranks: int = 1024, seed: int = 0, nodes: int = 128
) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    base = np.datetime64(dt.datetime(2026, 11, 30, 0, 0), "ns").astype(np.int64)
    batches = []
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        idx = np.arange(start, start + n)
        rank = idx % ranks
        step = idx // ranks
        durations = rng.lognormal(mean=-1.0, sigma=0.1, size=(n, len(SECTIONS)))
        end = base + step * 1_000_000_000 + (durations.sum(axis=1) * 1e9).astype(np.int64)
        keys = pa.array(np.tile(SECTIONS, n))
        offsets = pa.array(np.arange(0, (n + 1) * len(SECTIONS), len(SECTIONS), dtype=np.int32))
        sections = pa.MapArray.from_arrays(offsets, keys, pa.array(durations.ravel()))
        table = pa.table(
            {
                "ts": pa.array(end, pa.timestamp("ns", tz="UTC")),
                "node": pa.array([f"node-{(r // 8) % nodes:04d}" for r in rank])
                .dictionary_encode()
                .cast(pa.string()),
                "job_id": pa.array(["bench"] * n),
                "attempt": pa.array(np.zeros(n, dtype=np.int32)),
                "rank": pa.array(rank.astype(np.int32)),
                "local_rank": pa.array((rank % 8).astype(np.int32)),
                "step": pa.array(step),
                "phase": pa.array(["train"] * n),
                "start_ts": pa.array(base + step * 1_000_000_000, pa.timestamp("ns", tz="UTC")),
                "end_ts": pa.array(end, pa.timestamp("ns", tz="UTC")),
                "duration_s": pa.array(durations.sum(axis=1)),
                "sections": sections,
            }
        )
        batches.append(validate("steps", table))
    return batches


def _as_pandas_frame(table: pa.Table):
    """What a pandas user would hold: the same rows, sections as one float column each, no all-null
    columns.
    """
    keep = [
        name
        for name in table.column_names
        if name != "sections" and table.column(name).null_count < len(table)
    ]
    frame = table.select(keep).to_pandas()
    values = table.column("sections").combine_chunks().items.to_numpy().reshape(-1, len(SECTIONS))
    for i, name in enumerate(SECTIONS):
        frame[f"{name}_s"] = values[:, i]
    return frame


def run(rows: int, batch: int, nodes: int) -> dict:
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    batches = make_batches(rows, batch, nodes=nodes)
    frames = [_as_pandas_frame(b) for b in batches]
    work = Path(tempfile.mkdtemp(prefix="faultlens-bench-sink-"))
    try:
        def sink_all() -> int:
            with SegmentSink(work / "store", flush_rows=1_000_000, flush_age_s=3600) as sink:
                for b in batches:
                    sink.write("steps", b)
            return sink.segments_written

        segments, sink_t = timed(sink_all)

        def pandas_all() -> None:
            out = work / "pandas"
            out.mkdir()
            for i, frame in enumerate(frames):
                frame.to_parquet(out / f"batch-{i}.parquet")

        _, pandas_t = timed(pandas_all)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "rows": rows,
        "batch_rows": batch,
        "nodes": nodes,
        "sink_segments": segments,
        "sink_rows_per_s": round(rows / sink_t.wall_s),
        "sink_rows_per_cpu_s": round(rows / sink_t.cpu_s),
        "pandas_rows_per_s": round(rows / pandas_t.wall_s),
        "pandas_rows_per_cpu_s": round(rows / pandas_t.cpu_s),
        "ratio_sink_over_pandas": round(pandas_t.wall_s / sink_t.wall_s, 2),
        "target_rows_per_s_per_core": 1_000_000,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--nodes", default="1,128",
                        help="comma-separated: how many nodes the rows come from (1 = a node "
                             "agent's own sink, "
                             "128 = one sink for a whole 1,024-rank job, one segment per node per "
                             "flush)")
    args = parser.parse_args()
    results = [run(args.rows, args.batch, int(n)) for n in args.nodes.split(",")]
    emit("sink_ingest", {"runs": results})


if __name__ == "__main__":
    main()
