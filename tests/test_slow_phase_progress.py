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
