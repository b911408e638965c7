"""A long checkpoint or evaluation is not a hang (issue 11, campaign scenario
healthy-long-checkpoint): the step timer's heartbeat says which phase the step in progress is, and
while a rank is inside the attempt's first step of a slow phase only the slow-phase floor counts;
once the phase was timed, slow_phase_k x its longest step. A rank stalled in a training step is
still a suspect at the usual threshold.

Real StepTimers (one per rank, in this process, on a controlled clock) write their step rows through
a real SegmentSink and their heartbeat records to real files; the real HeartbeatSource reads them
into the store."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from faultlens.attribution.detectors.progress import ProgressMonitor
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store
from faultlens.attribution.rules import load_thresholds
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.heartbeat import HeartbeatSource, read_heartbeat
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer

T0 = 1_796_000_000 * 10**9  # ns
RANKS = 4


class Clock:
    def __init__(self) -> None:
        self.ns = T0

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


def _job(
    tmp_path: Path,
    plan: list[tuple[str, float]],
    last: tuple[str, float] | None,
    rank_stuck: int = 0,
):
    """RANKS timers run `plan` ((phase, seconds) per step) in lockstep, then every rank (or only
    `rank_stuck`, when last[0] is train) opens one more step of phase last[0] and stays in it; the
    store holds the step rows and the heartbeats as they are `last[1]` seconds into that step.
    Returns (store, the clock's time then)."""
    clock = Clock()
    store = tmp_path / "store"
    beats = tmp_path / "beats"
    sink = SegmentSink(str(store), flush_rows=10**6, flush_age_s=10**6)
    timers = [
        StepTimer(
            sink,
            identity=RankIdentity(
                rank=r, local_rank=r, world_size=RANKS, node="node-0", job_id="job-1", attempt=0
            ),
            clock=clock,
            wall_clock=clock,
            heartbeat_dir=beats,
            start=False,
        )
        for r in range(RANKS)
    ]
    source = HeartbeatSource(beats, min_interval_s=0.0, keepalive_s=0.0, wall_clock=clock)
    for step, (phase, seconds) in enumerate(plan):
        contexts = [timer.step(step, phase=phase) for timer in timers]
        for context in contexts:
            context.__enter__()
        clock.advance(seconds)
        for context in contexts:
            context.__exit__(None, None, None)
        for table, batch in source.poll().items():
            sink.write(table, batch)
    opened = []
    if last is not None:
        phase, seconds = last
        for rank, timer in enumerate(timers):
            if phase != "train" or rank == rank_stuck:
                context = timer.step(len(plan), phase=phase)
                context.__enter__()
                opened.append(context)
        clock.advance(seconds)
        for timer in timers:
            timer.heartbeat.alive()
    for table, batch in source.poll().items():
        sink.write(table, batch)
    for timer in timers:
        timer.flush()
    sink.flush()
    return store, dt.datetime.fromtimestamp(clock.ns / 1e9, dt.UTC)


@pytest.fixture
def monitor() -> ProgressMonitor:
    return ProgressMonitor(load_thresholds().progress)


def _suspects(monitor: ProgressMonitor, store: Path, now: dt.datetime):
    with Store(str(store)) as reader:
        return monitor.suspects(load_from_store(reader), now)


TRAIN = [("train", 1.0)] * 30


def test_the_heartbeat_says_the_phase_of_the_step_in_progress(tmp_path: Path) -> None:
    timer = StepTimer(
        None,
        identity=RankIdentity(rank=0, job_id="j", attempt=0),
        heartbeat_dir=tmp_path,
        start=False,
    )
    path = timer.heartbeat.path
    with timer.step(0, phase="checkpoint"):
        assert read_heartbeat(path).phase == "checkpoint" and read_heartbeat(path).in_step
    assert read_heartbeat(path).phase is None
    with timer.step(1):
        assert read_heartbeat(path).phase == "train"


@pytest.mark.parametrize("phase", ["checkpoint", "eval"])
def test_the_first_long_checkpoint_or_evaluation_is_not_a_hang(
    tmp_path: Path, monitor: ProgressMonitor, phase: str
) -> None:
    # 30 steps of 1 s (threshold: the 10 s floor), then every rank 60 s into the attempt's first
    # `phase` step
    store, now = _job(tmp_path, TRAIN, (phase, 60.0))
    assert _suspects(monitor, store, now) == []
    floor = load_thresholds().progress.slow_phase_floor_s
    late, later = _job(tmp_path / "late", TRAIN, (phase, floor + 30.0))
    (suspect,) = _suspects(monitor, late, later)
    assert f"first {phase} step" in suspect.evidence[0].text


def test_a_timed_checkpoint_allows_k_times_its_longest(
    tmp_path: Path, monitor: ProgressMonitor
) -> None:
    # a 20 s checkpoint at step 10 was timed: the next one may take 2 x 20 s, not the 600 s floor
    plan = [*TRAIN[:10], ("checkpoint", 20.0), *TRAIN[:20]]
    store, now = _job(tmp_path, plan, ("checkpoint", 35.0))
    assert _suspects(monitor, store, now) == []
    late, later = _job(tmp_path / "late", plan, ("checkpoint", 50.0))
    (suspect,) = _suspects(monitor, late, later)
    assert "checkpoint steps take up to 20s" in suspect.evidence[0].text


def test_a_rank_stalled_in_a_training_step_is_still_a_suspect(
    tmp_path: Path, monitor: ProgressMonitor
) -> None:
    store, now = _job(tmp_path, TRAIN, ("train", 30.0))
    (suspect,) = _suspects(monitor, store, now)
    assert suspect.last_step == 29 and "slow-phase" not in suspect.evidence[0].text


# ------------------------------------------------------ judged against the peers (issue 33)
# Every rank's heartbeat carries its own work (RankUsage: CPU of its training thread and child
# processes, bytes moved). Here each timer's usage is set by the test, beat by beat, as a stuck,
# blocked, saving or evaluating rank's would move.


class Usage:
    """A rank's counters as the test moves them (cpu_ns, io_bytes; None: not known)."""

    def __init__(self) -> None:
        self.cpu_ns: int | None = 1_000_000_000
        self.io_bytes: int | None = 50_000_000

    def training_thread(self) -> None:
        pass

    def read(self) -> tuple[int | None, int | None]:
        return self.cpu_ns, self.io_bytes


def _peers_job(tmp_path: Path, plan, phase: str, seconds: float, work, beats_until=None):
    """RANKS timers run `plan`, then every rank opens a `phase` step and stays in it `seconds`,
    beating every second; `work(rank, second)` -> (cpu seconds, bytes) that rank does in that
    second; a rank in `beats_until` stops beating after that many seconds (gone). Returns (store,
    the clock's time then)."""
    clock = Clock()
    store, beats = tmp_path / "store", tmp_path / "beats"
    sink = SegmentSink(str(store), flush_rows=10**6, flush_age_s=10**6)
    timers = [
        StepTimer(
            sink,
            identity=RankIdentity(
                rank=r, local_rank=r, world_size=RANKS, node="node-0", job_id="job-1", attempt=0
            ),
            clock=clock,
            wall_clock=clock,
            heartbeat_dir=beats,
            start=False,
        )
        for r in range(RANKS)
    ]
    usages = [Usage() for _ in timers]
    for timer, usage in zip(timers, usages, strict=True):
        timer.heartbeat.usage = usage
    source = HeartbeatSource(beats, min_interval_s=0.0, keepalive_s=0.0, wall_clock=clock)

    def beat(second: int | None = None) -> None:
        for rank, timer in enumerate(timers):
            if second is not None and (beats_until or {}).get(rank, 10**9) < second:
                continue
            timer.heartbeat.alive()
        for table, batch in source.poll().items():
            sink.write(table, batch)

    for step, (step_phase, step_s) in enumerate(plan):
        contexts = [timer.step(step, phase=step_phase) for timer in timers]
        for context in contexts:
            context.__enter__()
        clock.advance(step_s)
        for context in contexts:
            context.__exit__(None, None, None)
        beat()
    for timer in timers:
        timer.step(len(plan), phase=phase).__enter__()
    beat()
    for second in range(1, int(seconds) + 1):
        clock.advance(1.0)
        for rank, usage in enumerate(usages):
            cpu_s, moved = work(rank, second)
            usage.cpu_ns += int(cpu_s * 1e9)
            usage.io_bytes += int(moved)
        beat(second)
    for timer in timers:
        timer.flush()
    sink.flush()
    return store, dt.datetime.fromtimestamp(clock.ns / 1e9, dt.UTC)


def _idle(rank: int, second: int) -> tuple[float, int]:
    return 0.0, 0


@pytest.mark.parametrize("phase", ["checkpoint", "eval"])
def test_every_rank_idle_in_the_first_slow_phase_is_a_hang_at_the_normal_floor(
    tmp_path: Path, monitor: ProgressMonitor, phase: str
) -> None:
    # one rank stopped in its first save / evaluation; the others blocked in the collective after
    # it: nobody works for 30 s (the normal threshold is the 10 s floor, the allowance 600 s)
    store, now = _peers_job(tmp_path, TRAIN, phase, 30, _idle)
    (suspect,) = _suspects(monitor, store, now)
    text = suspect.evidence[0].text
    assert suspect.threshold_s == 10.0, text
    assert "every rank idle together for 10s (4 ranks" in text, text
    assert f"in {phase} step 30 (untimed phase allowance withheld)" in text, text
    # before the floor: nothing yet
    early, then = _peers_job(tmp_path / "early", TRAIN, phase, 8, _idle)
    assert _suspects(monitor, early, then) == []


@pytest.mark.parametrize(
    "work",
    [
        # the saving rank serialises (CPU), even at 5% of a core beside a CPU hog
        lambda rank, second: (0.05, 0) if rank == 2 else (0.0, 0),
        # the saving rank writes to a slow disk: almost no CPU, 2 MiB a second
        lambda rank, second: (0.001, 2 << 20) if rank == 2 else (0.0, 0),
        # every rank evaluates (a long first evaluation)
        lambda rank, second: (0.6, 0),
    ],
    ids=["slow-save-cpu-under-a-hog", "slow-save-io", "long-eval"],
)
def test_a_slow_phase_still_working_keeps_its_allowance(
    tmp_path: Path, monitor: ProgressMonitor, work
) -> None:
    store, now = _peers_job(tmp_path, TRAIN, "checkpoint", 30, work)
    assert _suspects(monitor, store, now) == []


def test_a_save_that_stops_working_is_caught_a_floor_after_it_stopped(
    tmp_path: Path, monitor: ProgressMonitor
) -> None:
    # rank 2 saves for 20 s (writing), then its filesystem hangs: idle together from second 20
    def work(rank: int, second: int) -> tuple[float, int]:
        return (0.0, 2 << 20) if rank == 2 and second <= 20 else (0.0, 0)

    store, now = _peers_job(tmp_path, TRAIN, "checkpoint", 28, work)
    assert _suspects(monitor, store, now) == []
    later_store, later = _peers_job(tmp_path / "later", TRAIN, "checkpoint", 34, work)
    (suspect,) = _suspects(monitor, later_store, later)
    assert "idle together" in suspect.evidence[0].text


def test_no_evidence_without_usage_or_with_a_rank_gone(
    tmp_path: Path, monitor: ProgressMonitor
) -> None:
    # usage unknown (a writer from before it existed): the allowance holds
    def unknown(rank: int, second: int) -> tuple[float, int]:
        return 0.0, 0

    store, now = _peers_job(tmp_path, TRAIN, "checkpoint", 30, unknown)
    with Store(str(store)) as reader:
        telemetry = load_from_store(reader)
    telemetry.heartbeats["cpu_s"] = None
    assert monitor.suspects(telemetry, now) == []
    # a rank whose beats stopped (gone, frozen) is not seen idle: no evidence about it
    gone, then = _peers_job(tmp_path / "gone", TRAIN, "checkpoint", 30, _idle, {1: 5})
    assert _suspects(monitor, gone, then) == []


def test_before_a_baseline_the_window_is_k_times_the_longest_training_step(
    tmp_path: Path, monitor: ProgressMonitor
) -> None:
    # the first evaluation after 4 training steps of 3 s (no baseline: warm-up 3, 5 needed): idle
    # together for 5 x 3 s = 15 s withholds the allowance, not the 600 s startup floor
    plan = [("train", 3.0)] * 4
    store, now = _peers_job(tmp_path, plan, "eval", 13, _idle)
    assert _suspects(monitor, store, now) == []
    later_store, later = _peers_job(tmp_path / "later", plan, "eval", 20, _idle)
    (suspect,) = _suspects(monitor, later_store, later)
    assert "no baseline yet: 5 x the longest training step so far 3s" in suspect.evidence[0].text


def test_rank_usage_moves_for_work_and_not_for_waiting(tmp_path: Path) -> None:
    """The real counters (this process, Linux /proc): asleep or waiting on a lock moves neither;
    computing, a DataLoader-like child computing, or writing moves them."""
    import multiprocessing
    import threading

    from faultlens.collectors.training.heartbeat import RankUsage

    usage = RankUsage()
    usage.training_thread()

    def moved(action) -> tuple[float, int]:
        cpu0, io0 = usage.read()
        action()
        cpu1, io1 = usage.read()
        assert None not in (cpu0, io0, cpu1, io1)
        return (cpu1 - cpu0) / 1e9, io1 - io0

    lock = threading.Lock()
    lock.acquire()
    for wait in (lambda: time.sleep(1.0), lambda: lock.acquire(timeout=1.0)):
        cpu, io = moved(wait)
        assert cpu < 0.02 and io < 4096, (cpu, io)
    cpu, _ = moved(lambda: sum(i * i for i in range(2_000_000)))
    assert cpu > 0.05, cpu
    _, io = moved(lambda: (tmp_path / "shard.pt").write_bytes(b"\0" * (2 << 20)))
    assert io > (2 << 20) - 4096, io  # (the reader's own reads are taken out)

    # a child of the training thread (a DataLoader worker) computing: counted while it lives
    child = multiprocessing.get_context("fork").Process(
        target=lambda: sum(i * i for i in range(50_000_000)))
    before = usage.read()[0]
    child.start()
    seen, deadline = 0.0, time.monotonic() + 60
    try:
        while child.is_alive() and time.monotonic() < deadline and seen <= 0.1:
            time.sleep(0.2)
            seen = (usage.read()[0] - before) / 1e9
    finally:
        child.kill()
        child.join()
    assert seen > 0.1, seen
