"""The batch pass reads a job's heartbeats reduced (attribution/reading/windows.py: a digest per
(attempt, rank) and the lowest ranks' steps for the progress baseline's fallback), never whole:
heartbeats are about a row per rank per second. Every detector's reading of them is the same from
the reduction as from every beat:

- on the stores of real torch jobs (DDP over gloo under real torchrun agents,
  tests/test_live_judgment.py's runs: healthy, a SIGSEGV in two attempts, a NaN loss, a node loss,
  an agent loss): the windowed pass finds exactly the incidents of the whole-store pass;
- on heartbeats written through the real sink as the heartbeat source emits them (a beat per rank
  per second, steps of their own pace, ranks that close, a NaN loss, three attempts), with more
  ranks than the fallback reads: closed ranks, ranks alive after a time, last progress, completed
  steps, placements, the NaN loss and the fallback's intervals, per attempt.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pandas as pd
import pytest

from faultlens.attribution.detectors.crash.liveness import alive_after, closed_ranks
from faultlens.attribution.detectors.desync import completed_steps
from faultlens.attribution.detectors.loss import _first_nonfinite
from faultlens.attribution.detectors.progress.monitor import (
    HEARTBEAT_INTERVALS,
    _closed_attempts,
    _heartbeat_intervals,
    _last_progress,
    _latest_beats,
)
from faultlens.attribution.engine import attribute
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store, placements, to_frame
from faultlens.attribution.reading.windows import JobWindows, store_jobs
from faultlens.collectors.store.sink import SegmentSink
from tests.test_live_judgment import live_runs  # noqa: F401  (the real torch runs: a session fixture)
from tests.test_windowed_attribution import _identity

T0 = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.UTC)
WARMUP = 3


@pytest.mark.parametrize("name", ["healthy", "sigsegv", "nan", "nodeloss", "agentloss"])
def test_real_torch_jobs_windowed_with_reduced_heartbeats_find_what_the_whole_store_pass_finds(
        live_runs: Path, name: str) -> None:  # noqa: F811
    store = str(live_runs / name / "store")
    with Store(store) as opened:
        every = opened.query("SELECT count(*) AS n FROM heartbeats").column("n")[0].as_py()
        windows = JobWindows.open(opened, store_jobs(opened)[0], None, warmup_steps=WARMUP)
        windowed = attribute(opened)
        whole = attribute(opened, windowed=False)
    assert every > 0 and 0 < len(windows.context.heartbeats) <= every
    assert _identity(windowed) == _identity(whole)


def _beats(
    rng: random.Random, attempt: int, ranks: int, seconds: int, start: dt.datetime
) -> list[dict]:
    """A beat per rank per second as HeartbeatSource emits them: the rank's last completed step and
    when it ended, the step in progress; rank 1 closes its timer at the end of attempt 0, every rank
    at the end of attempt 2; rank 2's loss goes NaN at step 40 of attempt 1; node-<rank // 8>."""
    rows = []
    for rank in range(ranks):
        step_s = 0.6 + 0.1 * (rank % 3)
        last_end = None
        for second in range(seconds):
            now = start + dt.timedelta(seconds=second + rng.random() * 0.2)
            done = int(second / step_s) - 1
            if done >= 0:
                last_end = start + dt.timedelta(seconds=(done + 1) * step_s)
            closed = (attempt == 0 and rank == 1 and second == seconds - 1) or (
                attempt == 2 and second == seconds - 1
            )
            bad = 40 if attempt == 1 and rank == 2 and done >= 40 else None
            rows.append(
                {
                    "ts": now,
                    "node": f"node-{rank // 8}",
                    "job_id": "beats",
                    "attempt": attempt,
                    "rank": rank,
                    "local_rank": rank % 8,
                    "pid": 1000 + rank,
                    "step": done if done >= 0 else None,
                    "step_ts": last_end,
                    "steps": done + 1,
                    "current_step": done + 1,
                    "in_step": not closed,
                    "phase": "train",
                    "loss": None if bad else 2.0,
                    "bad_loss_step": bad,
                    "closed": closed,
                }
            )
    return rows


@pytest.fixture(scope="module")
def beats_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("beats") / "store"
    rng = random.Random(7)
    sink = SegmentSink(str(path), flush_rows=5_000, flush_age_s=3600.0)
    start = T0
    for attempt, (ranks, seconds) in enumerate(((24, 50), (24, 60), (16, 8))):
        sink.write("heartbeats", _beats(rng, attempt, ranks, seconds, start))
        sink.write(
            "ranks",
            [
                {
                    "ts": start,
                    "node": f"node-{r // 8}",
                    "job_id": "beats",
                    "attempt": attempt,
                    "rank": r,
                    "local_rank": r % 8,
                }
                for r in range(ranks)
            ],
        )
        start += dt.timedelta(seconds=seconds + 30)
    sink.close()
    return str(path)


def test_every_reading_of_the_heartbeats_is_the_same_from_the_reduction(beats_store: str) -> None:
    with Store(beats_store) as opened:
        whole = load_from_store(opened).for_job("beats")
        windows = JobWindows.open(opened, "beats", None, warmup_steps=WARMUP)
    full, reduced = whole.heartbeats, windows.context.heartbeats
    assert len(reduced) * 2 < len(full)  # a reduction, not a copy
    assert _closed_attempts(reduced) == _closed_attempts(full) == {2}
    assert _first_nonfinite(pd.DataFrame(), reduced[reduced["attempt"] == 1]) == \
        _first_nonfinite(pd.DataFrame(), full[full["attempt"] == 1]) is not None
    for attempt in (0, 1, 2):
        mine, every = reduced[reduced["attempt"] == attempt], full[full["attempt"] == attempt]
        ranks = sorted(int(r) for r in every["rank"].unique())
        assert closed_ranks(reduced, attempt) == closed_ranks(full, attempt)
        middle = every["ts"].min() + (every["ts"].max() - every["ts"].min()) / 2
        for after in (every["ts"].min(), middle, every["ts"].max() - dt.timedelta(seconds=1)):
            assert (alive_after(reduced, attempt, ranks, after)
                    == alive_after(full, attempt, ranks, after))
        assert _last_progress(pd.DataFrame(), mine) == _last_progress(pd.DataFrame(), every)
        assert _latest_beats(mine).sort_values("rank").reset_index(drop=True).equals(
            _latest_beats(every).sort_values("rank").reset_index(drop=True))
        assert completed_steps(windows.context, attempt, ranks) == completed_steps(
            whole, attempt, ranks
        )
        assert placements(pd.DataFrame(), attempt, reduced) == placements(
            pd.DataFrame(), attempt, full
        )
        intervals = _heartbeat_intervals(every, WARMUP)
        assert _heartbeat_intervals(mine, WARMUP) == intervals
        # the fallback stops early: the reduction holds the beats of only its lowest ranks
        if attempt < 2:
            assert len(intervals) >= HEARTBEAT_INTERVALS
            assert mine["rank"].value_counts().max() < every["rank"].value_counts().max() or \
                len(mine) < len(every) // 2


def test_the_history_read_follows_the_warmup_it_is_given(beats_store: str) -> None:
    """The fallback skips `warmup_steps` steps: the reduction read for another warm-up answers for
    that one.
    """
    with Store(beats_store) as opened:
        whole = load_from_store(opened).for_job("beats")
        for warmup in (0, 10):
            reduced = JobWindows.open(opened, "beats", None, warmup_steps=warmup).context.heartbeats
            for attempt in (0, 1):
                mine = reduced[reduced["attempt"] == attempt]
                every = whole.heartbeats[whole.heartbeats["attempt"] == attempt]
                assert _heartbeat_intervals(mine, warmup) == _heartbeat_intervals(every, warmup)


def test_a_job_without_heartbeats_reads_an_empty_frame(tmp_path: Path) -> None:
    sink = SegmentSink(str(tmp_path / "store"))
    sink.write("ranks", [{"ts": T0, "node": "node-0", "job_id": "quiet", "attempt": 0, "rank": 0}])
    sink.close()
    with Store(str(tmp_path / "store")) as opened:
        beats = JobWindows.open(opened, "quiet", None).context.heartbeats
    assert beats.empty and list(beats.columns) == list(to_frame(None, "heartbeats").columns)
