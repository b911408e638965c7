"""A writer for the crash test: writes numbered step rows through the sink forever, and after every
flush that returned prints how many rows are committed. The test SIGKILLs it at random moments.

    python -m tests.sink_writer STORE SEED JOB  # one writer, its acknowledgements on stdout
    python -m tests.sink_writer --zygote        # many writers, one per request line, each a fork

The zygote imports pyarrow and the sink once and forks one writer per request line on stdin
("STORE SEED JOB ACKFILE"): it answers "pid N", the writer writes its acknowledgements to ACKFILE
(line by line, flushed), and once the writer is gone the zygote answers "exit STATUS" (os.waitpid's
status). The writer is a real process with nothing started before the fork: its sink, threads and
files are its own, and it dies by a real SIGKILL; only the imports are shared.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sys
from typing import TextIO

import pyarrow as pa

from faultlens.collectors.store.schema import TABLES
from faultlens.collectors.store.sink import SegmentSink


def write_forever(store: str, seed: int, job: str, out: TextIO) -> None:
    rng = random.Random(seed)
    sink = SegmentSink(store, flush_rows=10**9, flush_age_s=10**9)
    base = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
    schema = TABLES["steps"]
    written = 0
    print("ready", file=out, flush=True)
    while True:
        n = rng.randint(1, 5000)
        ids = pa.array(range(written, written + n), pa.int64())
        ts = pa.array(
            [base + dt.timedelta(seconds=i % 86_000) for i in range(written, written + n)],
            schema.field("ts").type,
        )
        nodes = pa.array([f"node-{i % 3}" for i in range(written, written + n)])
        sink.write(
            "steps", pa.table({"ts": ts, "node": nodes, "job_id": pa.array([job] * n), "step": ids})
        )
        written += n
        if rng.random() < 0.6:
            sink.flush()
            print(written, file=out, flush=True)


def zygote() -> None:
    for line in sys.stdin:
        store, seed, job, ack_path = line.split()
        pid = os.fork()
        if pid == 0:  # the writer
            try:
                with open(ack_path, "w", buffering=1) as out:
                    write_forever(store, int(seed), job, out)
            finally:
                os._exit(1)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)


def main() -> None:
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        write_forever(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.stdout)


if __name__ == "__main__":
    main()
