"""A writer process for the crash test: writes numbered step rows through the sink forever, and after every
flush that returned prints how many rows are committed. The test SIGKILLs it at random moments."""

from __future__ import annotations

import datetime as dt
import random
import sys

import pyarrow as pa

from faultlens.collectors.schema import TABLES
from faultlens.collectors.sink import SegmentSink


def main() -> None:
    store, seed, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    sink = SegmentSink(store, flush_rows=10**9, flush_age_s=10**9)
    base = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    schema = TABLES["steps"]
    written = 0
    print("ready", flush=True)
    while True:
        n = rng.randint(1, 5000)
        ids = pa.array(range(written, written + n), pa.int64())
        ts = pa.array([base + dt.timedelta(seconds=i % 86_000) for i in range(written, written + n)],
                      schema.field("ts").type)
        nodes = pa.array([f"node-{i % 3}" for i in range(written, written + n)])
        sink.write("steps", pa.table({"ts": ts, "node": nodes, "job_id": pa.array([job] * n), "step": ids}))
        written += n
        if rng.random() < 0.6:
            sink.flush()
            print(written, flush=True)


if __name__ == "__main__":
    main()
