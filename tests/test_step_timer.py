"""The step timer: rows it writes through a real SegmentSink into a real store, its behaviour when
the store is slow or gone, and the steps/ranks rows real torchrun processes wrote with it (fixture
scenarios)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training import step_timer
from faultlens.collectors.training.step_timer import ParallelCoords, Phase, RankIdentity, StepTimer

TORCHRUN_ENV = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "FAULTLENS_NODE": "node-7",
    "FAULTLENS_CLUSTER": "c1",
}


class TickClock:
    """A monotonic ns clock that advances by the step it is told to on each read."""

    def __init__(self, tick_ns: int = 1_000_000) -> None:
        self.now = 0
        self.tick = tick_ns

    def __call__(self) -> int:
        self.now += self.tick
        return self.now


def test_identity_from_torchrun_environment() -> None:
    identity = RankIdentity.from_env(TORCHRUN_ENV)
    assert (identity.rank, identity.local_rank, identity.world_size, identity.local_world_size) == (
        5,
        1,
        8,
        4,
    )
    assert (identity.job_id, identity.attempt, identity.node, identity.cluster) == (
        "job-42",
        2,
        "node-7",
        "c1",
    )
    bare = RankIdentity.from_env({"RANK": "not-a-number"})
    assert bare.rank is None and bare.node == bare.hostname  # node falls back to the hostname


def test_rows_in_the_store(store_dir: Path) -> None:
    sink = SegmentSink(str(store_dir), flush_rows=1_000_000, flush_age_s=3600)
    timer = StepTimer(
        sink,
        identity=RankIdentity.from_env(TORCHRUN_ENV),
        parallel=ParallelCoords(dp_rank=1, pp_rank=2, tp_rank=0, pp_size=4),
        clock=TickClock(),
        wall_clock=lambda: 1_796_000_000_000_000_000,
        flush_interval_s=60,
    )
    for n in range(3):
        with timer.step(n, tokens=4096, samples=8) as step:
            with timer.section("data"):
                pass
            with timer.section("forward"), timer.section("attention"):
                pass
            with timer.section("forward"):  # entered twice: adds up
                pass
            step.loss = 2.5 - n
    with timer.step(3, phase="eval"):
        pass
    timer.close()
    with Store(str(store_dir)) as store:
        steps = store.query("SELECT * FROM steps ORDER BY step").to_pylist()
        ranks = store.query("SELECT * FROM ranks").to_pylist()
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    first = steps[0]
    sections = dict(first["sections"])
    # each clock read advances 1 ms: data = 1 tick, forward/attention = 1, forward = 3 (outer) + 1
    # (second entry)
    assert sections == pytest.approx({"data": 0.001, "forward/attention": 0.001, "forward": 0.004})
    assert first["duration_s"] == pytest.approx(0.009)  # 9 reads after the one at the step start
    assert (
        first["rank"],
        first["local_rank"],
        first["job_id"],
        first["attempt"],
        first["node"],
    ) == (5, 1, "job-42", 2, "node-7")
    assert (first["phase"], first["tokens"], first["samples"], first["loss"]) == (
        "train",
        4096,
        8,
        2.5,
    )
    assert first["end_ts"] - first["start_ts"] == pa.scalar(9_000_000, pa.duration("ns")).as_py()
    assert steps[3]["phase"] == "eval"
    assert len(ranks) == 1
    rank_row = ranks[0]
    assert (
        rank_row["world_size"],
        rank_row["local_world_size"],
        rank_row["dp_rank"],
        rank_row["pp_rank"],
        rank_row["pp_size"],
        rank_row["cp_rank"],
    ) == (8, 4, 1, 2, 4, None)
    assert timer.stats.rows_written == 4 and timer.stats.dropped == 0


def test_exception_leaves_the_loop_and_no_row(store_dir: Path) -> None:
    sink = SegmentSink(str(store_dir))
    timer = StepTimer(sink, identity=RankIdentity(rank=0), flush_interval_s=60)
    with pytest.raises(ZeroDivisionError), timer.step(0), timer.section("forward"):
        1 / 0  # noqa: B018
    with timer.step(1):
        pass
    timer.close()
    with Store(str(store_dir)) as store:
        assert store.query("SELECT step FROM steps").column("step").to_pylist() == [1]


class RecordingHook:
    """A harness on the timer's public hook: records what it sees, sleeps in one section, raises at
    one step (as the lab's injector does)."""

    def __init__(self, raise_at: int, sleep_in: str) -> None:
        self.seen: list[tuple[str, object, object]] = []
        self.raise_at, self.sleep_in = raise_at, sleep_in

    def step_begun(self, timer: StepTimer, number: int, phase: str) -> None:
        self.seen.append(("step", number, phase))
        if number == self.raise_at:
            raise KeyError("'labels'")

    def section_entered(self, timer: StepTimer, name: str) -> None:
        self.seen.append(("section", name, timer.parallel.pp_rank))
        if name == self.sleep_in:
            time.sleep(0.05)


def test_a_hook_sees_every_step_and_section_and_what_it_raises_reaches_the_loop() -> None:
    timer = StepTimer(None, identity=RankIdentity(rank=0), parallel=ParallelCoords(pp_rank=1),
                      start=False)
    hook = RecordingHook(raise_at=2, sleep_in="attention")
    step_timer.add_hook(hook)
    try:
        for n in range(3):
            phase = "eval" if n == 1 else "train"
            with timer.step(n, phase=phase), timer.section("forward"), timer.section("attention"):
                pass
    except KeyError:
        pass
    finally:
        step_timer.remove_hook(hook)
    assert hook.seen == [
        ("step", 0, "train"), ("section", "forward", 1), ("section", "attention", 1),
        ("step", 1, "eval"), ("section", "forward", 1), ("section", "attention", 1),
        ("step", 2, "train"),
    ]
    rows = list(timer._queue)
    assert [r["step"] for r in rows] == [0, 1]  # the step the hook raised in has no row
    # the hook's sleep counts in the section it was entered for (the injector's slow section)
    assert all(r["sections"]["forward/attention"] >= 0.05 for r in rows)
    with timer.step(3), timer.section("attention"):
        pass
    assert len(hook.seen) == 7  # removed: no longer called


def test_unknown_phase_and_sections_outside_steps_are_counted() -> None:
    timer = StepTimer(None, identity=RankIdentity(rank=0), start=False)
    with timer.step(0, phase="trian"):
        pass
    with timer.section("stray"):
        pass
    assert timer.stats.unknown_phases == 1
    assert timer.stats.sections_outside_step == 1
    assert timer._queue[0]["phase"] == Phase.UNKNOWN.value


class FailingSink:
    """A store that is gone: every write raises, as a SegmentSink on an unreachable filesystem does.
    """

    def __init__(self) -> None:
        self.writes = 0

    def write(self, table: str, data: object) -> None:
        self.writes += 1
        raise OSError("store unreachable")

    def flush(self, table: str | None = None) -> list:
        raise OSError("store unreachable")

    def pending_rows(self, table: str | None = None) -> int:
        return 0


class BlockingSink(FailingSink):
    """A store that hangs: writes wait until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.rows: list = []

    def write(self, table: str, data: object) -> None:
        self.release.wait()
        if table == "steps":
            self.rows.extend(data)  # type: ignore[arg-type]

    def flush(self, table: str | None = None) -> list:
        return []


def test_store_gone_never_raises_and_memory_is_bounded() -> None:
    sink = FailingSink()
    timer = StepTimer(
        sink, identity=RankIdentity(rank=0), max_buffered_rows=50, flush_interval_s=0.01
    )
    for n in range(2000):
        with timer.step(n), timer.section("forward"):
            pass
    time.sleep(0.05)
    timer.close()
    assert sink.writes > 0
    assert timer.stats.write_failures > 0
    assert len(timer._queue) <= 50
    # every row is either still queued or counted
    assert timer.stats.dropped + len(timer._queue) == 2000


def test_slow_store_does_not_block_training_and_keeps_newest_rows() -> None:
    sink = BlockingSink()
    timer = StepTimer(
        sink, identity=RankIdentity(rank=0), max_buffered_rows=100, flush_interval_s=0.001
    )
    time.sleep(0.02)  # the writer is now stuck in the sink
    for n in range(5000):
        with timer.step(n), timer.section("forward"):
            pass
    assert len(timer._queue) == 100
    assert timer.stats.dropped == 4900
    sink.release.set()
    timer.close()
    # the loop ran to the end while the store never returned; the oldest rows were dropped, the
    # newest kept
    assert [row["step"] for row in sink.rows] == list(range(4900, 5000))


def test_unopenable_store_is_logged_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    timer = StepTimer.from_env(
        store=str(blocker / "store"), identity=RankIdentity(rank=0), flush_interval_s=0.01
    )
    assert timer.sink is None
    with timer.step(0):
        pass
    timer.close()
    assert timer.stats.dropped >= 1


class FakeCudaEvent:
    """The CUDA event interface the timer uses (record at creation, synchronize, elapsed_time in
    ms).
    """

    clock = 0.0

    def __init__(self) -> None:
        FakeCudaEvent.clock += 2.0
        self.at = FakeCudaEvent.clock
        self.synchronized = False

    def synchronize(self) -> None:
        self.synchronized = True

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        return end.at - self.at


def test_cuda_event_timing_is_resolved_off_the_training_thread(store_dir: Path) -> None:
    sink = SegmentSink(str(store_dir))
    timer = StepTimer(
        sink, identity=RankIdentity(rank=0), cuda_event_factory=FakeCudaEvent, flush_interval_s=60
    )
    assert timer.cuda_events
    with timer.step(0):
        with timer.section("forward"), timer.section("matmul"):
            pass
        with timer.section("backward"):
            pass
    timer.close()
    with Store(str(store_dir)) as store:
        sections = dict(store.query("SELECT sections FROM steps").column("sections")[0].as_py())
    # events: forward start (2), matmul start (4), matmul end (6), forward end (8), backward 10..12
    # (ms)
    assert sections["cuda/forward"] == pytest.approx(0.006)
    assert sections["cuda/forward/matmul"] == pytest.approx(0.002)
    assert sections["cuda/backward"] == pytest.approx(0.002)
    assert "forward" in sections and "forward/matmul" in sections


def test_cuda_events_with_real_cuda(store_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    sink = SegmentSink(str(store_dir))
    timer = StepTimer(sink, identity=RankIdentity(rank=0), cuda_events=True, flush_interval_s=60)
    x = torch.randn(2048, 2048, device="cuda")
    with timer.step(0), timer.section("matmul"):
        for _ in range(10):
            x = x @ x / 2048
    timer.close()
    with Store(str(store_dir)) as store:
        sections = dict(store.query("SELECT sections FROM steps").column("sections")[0].as_py())
    assert sections["cuda/matmul"] > 0


# ------------------------------------------------------------------------------- real torchrun
# processes


def test_straggler_rows_written_by_real_ranks(torch_artifacts: dict[str, Path]) -> None:
    with Store(str(torch_artifacts["straggler"] / "store")) as store:
        per_rank = store.query(
            "SELECT rank, count(*) AS n, median(sections['forward']) AS forward, "
            "median(sections['backward']) AS bw,"
            " any_value(job_id) AS job, any_value(node) AS node, any_value(attempt) AS attempt,"
            " min(step) AS first, max(step) AS last FROM steps GROUP BY rank ORDER BY rank"
        ).to_pylist()
        ranks = store.query("SELECT rank, world_size, local_rank, dp_rank, pp_rank, pp_size, pid "
                            "FROM ranks "
                            "ORDER BY rank").to_pylist()
    assert [r["rank"] for r in per_rank] == [0, 1, 2, 3]
    assert all(r["n"] == 30 and (r["first"], r["last"]) == (0, 29) for r in per_rank)
    assert {(r["job"], r["node"], r["attempt"]) for r in per_rank} == {
        ("faultlens-straggler", "node-0", 0)
    }
    slow = per_rank[3]["forward"]
    others = [r["forward"] for r in per_rank[:3]]
    assert slow >= 0.02  # rank 3 sleeps 20 ms inside forward
    assert slow > 5 * max(others)
    assert [
        (r["rank"], r["world_size"], r["local_rank"], r["dp_rank"], r["pp_size"]) for r in ranks
    ] == [(n, 4, n, n, 1) for n in range(4)]
    assert len({r["pid"] for r in ranks}) == 4


def test_progress_stops_at_the_hang(torch_artifacts: dict[str, Path]) -> None:
    """Ranks blocked in the hung collective complete no further step; the writer thread still
    flushed the completed ones while the main thread was blocked."""
    with Store(str(torch_artifacts["hang"] / "store")) as store:
        last = store.query(
            "SELECT rank, max(step) AS last FROM steps GROUP BY rank ORDER BY rank"
        ).to_pylist()
    # the fault is at step 3
    assert [(r["rank"], r["last"]) for r in last] == [(n, 2) for n in range(4)]
