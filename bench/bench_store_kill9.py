"""Two writers, compaction and kill -9 at random moments: is every acknowledged row in the store
exactly once?

Each trial starts two real writer processes (SegmentSink, the same job/date/node partition of the
steps table, a flush every few rows; after each flush returns, the writer appends the flushed row
ids to its own acknowledgement file) and one process that compacts the store in a loop. At a random
moment one of the three (or all) is killed with SIGKILL; the others are stopped with SIGKILL a
little later. The store is then read twice: as it is (compacted segments may sit beside the
originals they replace, temporary files of dead writers lie about) and after one recovery
compaction. Lost: an acknowledged row id missing. Duplicated: a row id read more than once.

    PYTHONPATH=. python -m bench.bench_store_kill9 --trials 60
    PYTHONPATH=. python -m bench.bench_store_kill9 --trials 60 --write   # docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WRITER = """
import datetime as dt, sys, time
from faultlens.collectors.store.sink import SegmentSink
store, writer, acks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
T0 = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
sink = SegmentSink(store, flush_rows=10**9, flush_age_s=10**9)
step = 0
with open(acks, "a") as ack:
    while True:
        rows = [{"ts": T0 + dt.timedelta(microseconds=writer * 10**9 + step + i), "node": "node-1",
                 "job_id": "job-1", "rank": writer, "step": step + i, "duration_s": 1.0}
                for i in range(7)]
        sink.write("steps", rows)
        sink.flush("steps")
        ack.write(f"{step} {step + 7}\\n")
        ack.flush()
        step += 7
"""

COMPACTOR = """
import os, signal, sys
import faultlens.attribution.reading.maintenance as maintenance
if sys.argv[2] == "between":  # SIGKILL right after a compacted segment lands, before any delete
    write = maintenance.write_segment
    def write_then_die(*args, **kwargs):
        write(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    maintenance.write_segment = write_then_die
with open(sys.argv[3], "a") as started:
    started.write(".")  # imported: compacting from now on
while True:
    maintenance.compact(sys.argv[1], ["steps"], min_segments=2)
"""


@dataclass(frozen=True)
class Trial:
    acked: int
    lost: int
    duplicated: int
    lost_after_recovery: int
    duplicated_after_recovery: int
    compacted_beside_originals: bool
    temporaries: int


def _acked(path: Path) -> set[tuple[int, int]]:
    ids: set[tuple[int, int]] = set()
    if not path.exists():
        return ids
    writer = int(path.stem.rsplit("-", 1)[1])
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:  # a line cut by the kill is not an acknowledgement
            ids.update((writer, step) for step in range(int(parts[0]), int(parts[1])))
    return ids


def _read(store: Path) -> list[tuple[int, int]]:
    from faultlens.attribution.reading.store import Store

    if not (store / "steps").exists():
        return []
    with Store(store, tables=["steps"]) as reader:
        table = reader.query("SELECT rank, step FROM steps")
    ranks, steps = table.column("rank").to_pylist(), table.column("step").to_pylist()
    return list(zip(ranks, steps, strict=True))


def _beside(store: Path) -> bool:
    """Does a compacted segment sit beside a segment it replaces?"""
    import pyarrow.parquet as pq

    from faultlens.collectors.store.layout import REPLACES_KEY

    for compacted in store.rglob("c-*.parquet"):
        try:
            meta = pq.read_schema(compacted).metadata or {}
        except Exception:  # a torn file replaces nothing
            continue
        names = meta.get(REPLACES_KEY, b"").decode("utf-8", "replace").split(",")
        if any((compacted.parent / name).exists() for name in names if name):
            return True
    return False


def _score(acked: set[tuple[int, int]], rows: list[tuple[int, int]]) -> tuple[int, int]:
    present = set(rows)
    return len(acked - present), len(rows) - len(present)


def trial(workdir: Path, rng: random.Random) -> Trial:
    store = workdir / "store"
    store.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for writer in range(2):
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(store),
                    str(writer),
                    str(workdir / f"ack-{writer}"),
                ],
                env=env,
                stderr=subprocess.DEVNULL,
            )
        )
    mode = rng.choice(["random", "random", "between"])
    procs.append(
        subprocess.Popen(
            [sys.executable, "-c", COMPACTOR, str(store), mode, str(workdir / "started")],
            env=env,
            stderr=(workdir / "compactor.err").open("w"),
        )
    )
    # until both writers have acknowledged a flush and the compactor is running
    ready = time.monotonic() + 60
    while time.monotonic() < ready and not all(
        (workdir / name).exists() and (workdir / name).stat().st_size
        for name in ("ack-0", "ack-1", "started")
    ):
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 6.0))
    if mode == "between":  # the compactor kills itself once its compacted segment has landed
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[2].wait(timeout=90)
    victims = rng.choice([[0], [1], [2], [0, 1], [0, 1, 2]])
    for index in victims:
        procs[index].send_signal(signal.SIGKILL)
    time.sleep(rng.uniform(0.0, 1.5))
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    acked = _acked(workdir / "ack-0") | _acked(workdir / "ack-1")
    beside = _beside(store)
    temporaries = sum(1 for _ in store.rglob(".*.tmp"))
    lost, duplicated = _score(acked, _read(store))
    from faultlens.attribution.reading.maintenance import compact

    if store.exists():
        compact(store, ["steps"], min_segments=2)
    lost_after, duplicated_after = _score(acked, _read(store))
    return Trial(len(acked), lost, duplicated, lost_after, duplicated_after, beside, temporaries)


def run(trials: int, seed: int) -> list[Trial]:
    rng = random.Random(seed)
    results = []
    for _ in range(trials):
        workdir = Path(tempfile.mkdtemp(prefix="faultlens-kill9-"))
        try:
            results.append(trial(workdir, rng))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    started = time.monotonic()
    results = run(args.trials, args.seed)
    wall = time.monotonic() - started
    acked = sum(r.acked for r in results)
    lost, dup = sum(r.lost for r in results), sum(r.duplicated for r in results)
    lost2 = sum(r.lost_after_recovery for r in results)
    dup2 = sum(r.duplicated_after_recovery for r in results)
    beside = sum(r.compacted_beside_originals for r in results)
    temps = sum(1 for r in results if r.temporaries)
    print(f"{len(results)} trials, {acked} acknowledged rows, {wall:.0f} s")
    print(
        f"as left: lost {lost}, duplicated {dup}; after a recovery compaction: lost {lost2}, "
        f"duplicated {dup2}"
    )
    print(
        f"trials with a compacted segment beside its originals: {beside}; with temporaries: {temps}"
    )
    if args.write:
        from bench.common import Figure, Section, write_section

        today = dt.date.today().isoformat()
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=REPO,
                check=False,
            ).stdout.strip()
            or "-"
        )
        section = Section(
            title="Store under kill -9: two writers and compaction",
            compares="Acknowledged rows (a flush returned) against the rows the store reader "
            "returns, after SIGKILL of a writer, the compactor or all of them at a random moment; "
            "read as left and after one recovery compaction.",
            commands=(
                f"PYTHONPATH=. python -m bench.bench_store_kill9 --trials {args.trials} "
                f"--seed {args.seed} --write",
            ),
            figures=(
                Figure(
                    f"{len(results)} trials, {acked:,} acknowledged rows: lost, duplicated "
                    "(as left)",
                    f"{lost}, {dup}",
                    "0, 0",
                    commit=commit,
                    date=today,
                ),
                Figure(
                    "lost, duplicated after a recovery compaction",
                    f"{lost2}, {dup2}",
                    "0, 0",
                    commit=commit,
                    date=today,
                ),
                Figure(
                    "trials where a compacted segment sat beside its originals",
                    str(beside),
                    ">= 1",
                    commit=commit,
                    date=today,
                ),
                Figure("trials that left a temporary file", str(temps), commit=commit, date=today),
            ),
            notes=(f"Shared 2-core machine, {wall:.0f} s for the run.",),
        )
        write_section(REPO / "docs" / "benchmarks.md", section)


if __name__ == "__main__":
    main()
