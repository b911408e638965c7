"""The sink's rollup (collectors/store/rollup.py): a partition written by many flushes holds a few
segments, every row read exactly once, the writer's own segments only, after min_age_s only, under
the partition's merge lock, and kill -9 at any moment loses or doubles nothing."""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from faultlens.attribution.reading.maintenance import compact
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.layout import partition_dir, resolve_store, write_segment
from faultlens.collectors.store.rollup import MERGE_LOCK, Rollup, merge_lock
from faultlens.collectors.store.schema import validate
from faultlens.collectors.store.sink import SegmentSink

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _steps(nodes: list[str], first: int, rows: int) -> list[dict]:
    return [
        {
            "ts": T0 + dt.timedelta(seconds=first + i),
            "node": node,
            "job_id": "job-1",
            "rank": r,
            "step": first + i,
            "duration_s": 1.0,
        }
        for r, node in enumerate(nodes)
        for i in range(rows)
    ]


def _read(store: Path) -> list[tuple[str, int]]:
    with Store(store, tables=["steps"]) as reader:
        table = reader.query("SELECT node, step FROM steps")
    return sorted(
        zip(table.column("node").to_pylist(), table.column("step").to_pylist(), strict=True)
    )


def _segments(store: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in store.rglob("*.parquet"):
        counts[path.parent.name] = counts.get(path.parent.name, 0) + 1
    return counts


def _levels_bound(flushes: int, fan_in: int) -> int:
    """At most fan_in - 1 segments per level, plus the young ones not yet merged."""
    levels = 1
    while fan_in**levels <= flushes:
        levels += 1
    return (fan_in - 1) * levels


@pytest.mark.parametrize(
    ("flushes", "nodes", "fan_in", "rows"),
    [(1, 1, 4, 3), (3, 2, 4, 1), (4, 1, 2, 7), (17, 3, 4, 5), (40, 2, 3, 2), (66, 1, 4, 1)],
)
def test_many_flushes_leave_few_segments_and_every_row_once(
    tmp_path: Path, flushes: int, nodes: int, fan_in: int, rows: int
) -> None:
    clock = Clock()
    names = [f"node-{n}" for n in range(nodes)]
    sink = SegmentSink(
        tmp_path,
        flush_rows=10**9,
        flush_age_s=10**9,
        clock=clock,
        rollup=Rollup(fan_in=fan_in, min_age_s=0),
    )
    for flush in range(flushes):
        sink.write("steps", _steps(names, flush * rows, rows))
        sink.flush()
        clock.now += 5
    expected = sorted((node, step) for node in names for step in range(flushes * rows))
    assert _read(tmp_path) == expected
    for node in names:
        assert _segments(tmp_path)[f"node={node}"] <= _levels_bound(flushes, fan_in)
    assert (sink.merges > 0) == (flushes >= fan_in)
    assert not list(tmp_path.rglob(MERGE_LOCK))


def test_young_segments_wait_min_age(tmp_path: Path) -> None:
    clock = Clock()
    sink = SegmentSink(
        tmp_path,
        flush_rows=10**9,
        flush_age_s=10**9,
        clock=clock,
        rollup=Rollup(fan_in=2, min_age_s=60),
    )
    for flush in range(8):  # 8 flushes 5 s apart: none is 60 s old
        sink.write("steps", _steps(["n"], flush, 1))
        sink.flush()
        clock.now += 5
    assert sink.merges == 0 and _segments(tmp_path) == {"node=n": 8}
    clock.now += 60
    sink.write("steps", _steps(["n"], 8, 1))
    sink.flush()  # the 8 old ones merge in pairs; the 4 merged ones and the new one wait
    assert sink.merges == 4 and _segments(tmp_path)["node=n"] == 5
    clock.now += 60
    sink.write("steps", _steps(["n"], 9, 1))
    sink.flush()  # 4 -> 2 at level 1; the 9th flush waits for a partner, this one is young
    assert sink.merges == 6 and _segments(tmp_path)["node=n"] == 4
    assert _read(tmp_path) == [("n", s) for s in range(10)]


def test_another_writers_segments_are_never_merged(tmp_path: Path) -> None:
    location = resolve_store(str(tmp_path))
    directory = partition_dir(location, "steps", "job-1", "2026-11-30", "n")
    other = write_segment(
        location,
        directory,
        validate(
            "steps",
            pa.Table.from_pylist(
                _steps(["n"], 1000, 3),
                schema=validate("steps", pa.Table.from_pylist(_steps(["n"], 0, 1))).schema,
            ),
        ),
    )
    sink = SegmentSink(
        tmp_path, flush_rows=10**9, flush_age_s=10**9, rollup=Rollup(fan_in=2, min_age_s=0)
    )
    for flush in range(6):
        sink.write("steps", _steps(["n"], flush, 1))
        sink.flush()
    assert sink.merges > 0
    assert Path(other).exists()  # left for `faultlens compact`
    assert _read(tmp_path) == [("n", s) for s in [*range(6), 1000, 1001, 1002]]


def test_object_store_rolls_up_only_when_asked() -> None:
    sink = SegmentSink("memory://rollup-off", flush_rows=10**9, flush_age_s=10**9)
    for flush in range(6):
        sink.write("steps", _steps(["n"], flush, 1))
        sink.flush()
    assert sink.merges == 0
    asked = SegmentSink(
        "memory://rollup-on",
        flush_rows=10**9,
        flush_age_s=10**9,
        rollup=Rollup(fan_in=2, min_age_s=0),
    )
    for flush in range(6):
        asked.write("steps", _steps(["n"], flush, 1))
        asked.flush()
    assert asked.merges > 0
    with Store("memory://rollup-on", tables=["steps"]) as reader:
        steps = sorted(reader.query("SELECT step FROM steps").column("step").to_pylist())
    assert steps == list(range(6))


def test_a_held_lock_skips_the_merge_and_compact_skips_the_partition(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = SegmentSink(
        tmp_path, flush_rows=10**9, flush_age_s=10**9, rollup=Rollup(fan_in=2, min_age_s=0)
    )
    sink.write("steps", _steps(["n"], 0, 1))
    sink.flush()
    partition = next(tmp_path.rglob("node=n"))
    location = resolve_store(str(tmp_path))
    with merge_lock(location, str(partition)) as held:
        assert held
        with merge_lock(location, str(partition)) as again:
            assert not again  # one merger at a time, in one process too
        for flush in range(1, 4):
            sink.write("steps", _steps(["n"], flush, 1))
            sink.flush()
        assert sink.merges == 0 and _segments(tmp_path) == {"node=n": 4}
        with caplog.at_level(logging.WARNING):
            assert compact(tmp_path, ["steps"]) == []
        assert "being merged by its writer" in caplog.text
    assert not (partition / MERGE_LOCK).exists()
    assert len(compact(tmp_path, ["steps"])) == 1
    assert _read(tmp_path) == [("n", s) for s in range(4)]


def test_a_dead_mergers_lock_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    from faultlens.collectors.store.layout import host_tag

    sink = SegmentSink(
        tmp_path, flush_rows=10**9, flush_age_s=10**9, rollup=Rollup(fan_in=2, min_age_s=0)
    )
    sink.write("steps", _steps(["n"], 0, 1))
    sink.flush()
    partition = next(tmp_path.rglob("node=n"))
    (partition / MERGE_LOCK).write_text(f"{dead.stdout.strip()}@{host_tag()}")
    for flush in range(1, 4):
        sink.write("steps", _steps(["n"], flush, 1))
        sink.flush()
    assert sink.merges > 0
    assert not (partition / MERGE_LOCK).exists()
    # a live holder (this process) is never taken over
    (partition / MERGE_LOCK).write_text(f"{os.getpid()}@{host_tag()}")
    assert compact(tmp_path, ["steps"]) == []
    (partition / MERGE_LOCK).unlink()


WRITER = """
import datetime as dt, os, signal, sys
from faultlens.collectors.store import rollup
from faultlens.collectors.store.rollup import Rollup
from faultlens.collectors.store.sink import SegmentSink
store, acks, die_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
if die_after >= 0:  # SIGKILL right after the die_after-th merged segment lands, before its deletes
    write, landed = rollup.write_segment, []
    def write_then_die(*args, **kwargs):
        path = write(*args, **kwargs)
        landed.append(path)
        if len(landed) > die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return path
    rollup.write_segment = write_then_die
T0 = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
sink = SegmentSink(store, flush_rows=10**9, flush_age_s=10**9, rollup=Rollup(fan_in=2, min_age_s=0))
step = 0
with open(acks, "a") as ack:
    while True:
        rows = [{"ts": T0 + dt.timedelta(microseconds=step + i), "node": f"n{i % 2}",
                 "job_id": "job-1", "rank": 0, "step": step + i, "duration_s": 1.0}
                for i in range(6)]
        sink.write("steps", rows)
        sink.flush("steps")
        ack.write(f"{step} {step + 6}\\n")
        ack.flush()
        step += 6
"""


def _acked(path: Path) -> set[int]:
    ids: set[int] = set()
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split()
        if len(parts) == 2:
            ids.update(range(int(parts[0]), int(parts[1])))
    return ids


@pytest.mark.parametrize("die_after", [-1, 0, 3])
def test_kill9_while_rolling_up(tmp_path: Path, die_after: int) -> None:
    store, acks = tmp_path / "store", tmp_path / "acks"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(store), str(acks), str(die_after)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_acked(acks)) < 60 and proc.poll() is None:
        time.sleep(0.05)
    if die_after < 0:  # a random moment once it has written a while
        time.sleep(random.Random(7).uniform(0.0, 0.5))
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    acked = _acked(acks)
    assert len(acked) >= 6
    for _ in range(2):  # as left, then after a recovery compaction
        steps = [step for _, step in _read(store)]
        assert len(steps) == len(set(steps)), "a row read twice"
        assert acked <= set(steps), "an acknowledged row lost"
        compact(store, ["steps"])
    assert not list(store.rglob(MERGE_LOCK))


@pytest.mark.parametrize(("polls_every", "listing_job"), [(1, None), (3, None), (2, "job-1")])
def test_a_live_tail_reads_every_row_once_while_the_sink_rolls_up(
    tmp_path: Path, polls_every: int, listing_job: str | None
) -> None:
    """The follower's tail polls between flushes (every flush, every 3rd; the whole store or its
    job's partitions): segments it has read are merged under it, and it counts each row once."""
    from faultlens.attribution.reading.tail import PartitionListing, SegmentTail
    from faultlens.attribution.reading.telemetry import to_frame

    clock = Clock()
    sink = SegmentSink(
        tmp_path,
        flush_rows=10**9,
        flush_age_s=10**9,
        clock=clock,
        rollup=Rollup(fan_in=2, min_age_s=20),
    )
    sink.write("steps", _steps(["a"], 0, 1))
    sink.flush()
    with Store(tmp_path, tables=["steps"]) as store:
        listing = PartitionListing(store.location, listing_job) if listing_job else None
        tail = SegmentTail(
            store,
            ["steps"],
            retain_s=1e9,
            max_rows=10**6,
            to_frame=to_frame,
            arrow_tables=["steps"],
            listing=listing,
        )
        for flush in range(1, 40):
            clock.now += 5
            sink.write("steps", _steps(["a", "b"], flush * 10, 2))
            sink.flush()
            if flush % polls_every == 0:
                tail.poll()
        tail.poll()
        table = tail.table("steps")
        rows = list(
            zip(table.column("node").to_pylist(), table.column("step").to_pylist(), strict=True)
        )
    assert sink.merges > 5
    assert sorted(rows) == sorted(
        [("a", 0)] + [(n, f * 10 + i) for f in range(1, 40) for n in "ab" for i in range(2)]
    )


def test_one_flush_waits_for_a_bounded_number_of_merges_partitions_in_turn(tmp_path: Path) -> None:
    clock = Clock()
    sink = SegmentSink(
        tmp_path,
        flush_rows=10**9,
        flush_age_s=10**9,
        clock=clock,
        rollup=Rollup(fan_in=2, min_age_s=0, merges_per_roll=1),
    )
    names = ["a", "b", "c"]
    merges = []
    for flush in range(12):
        before = sink.merges
        sink.write("steps", _steps(names, flush, 1))
        sink.flush()
        merges.append(sink.merges - before)
    # at most max(merges_per_roll, the 3 segments each flush wrote)
    assert max(merges) == 3 and sum(merges) >= 9
    assert all(count <= 4 for count in _segments(tmp_path).values())  # every partition had turns
    assert _read(tmp_path) == sorted((n, s) for n in names for s in range(12))


def test_flushes_from_two_threads_while_rolling(tmp_path: Path) -> None:
    import threading

    sink = SegmentSink(
        tmp_path,
        flush_rows=10**9,
        flush_age_s=10**9,
        write_through=["steps"],
        rollup=Rollup(fan_in=2, min_age_s=0),
    )

    def writer(node: str) -> None:
        for step in range(30):
            sink.write("steps", _steps([node], step, 1))  # write-through: a flush each

    threads = [threading.Thread(target=writer, args=(node,)) for node in ("x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.flush()
    assert sink.merges > 0
    assert _read(tmp_path) == sorted((n, s) for n in ("x", "y") for s in range(30))


def test_a_training_processes_step_timer_never_rolls_up(tmp_path) -> None:
    """Merging reads and rewrites Parquet: the agent or `faultlens compact` does it, never the
    step timer inside a training process (a local store otherwise rolls up by default)."""
    from faultlens.collectors.store.sink import SegmentSink
    from faultlens.collectors.training.step_timer import StepTimer

    assert SegmentSink(str(tmp_path / "other")).rolls_up
    timer = StepTimer.from_env(str(tmp_path / "store"))
    try:
        assert timer.sink is not None and not timer.sink.rolls_up
    finally:
        timer.close()
