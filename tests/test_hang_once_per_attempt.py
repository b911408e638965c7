"""One failure per attempt, live: an attempt whose hang (or crash) the follower reported before is
not reported hung again when a later poll sees it stalled at another last step (the campaign's
skip-world-collective-3-nodes: the desync failed over, then 10-14 s into the next attempt a second
`hang-no-dumps` incident of the first attempt at 0.30). The engine's hang detector over the pass
the follower makes: a stalled attempt is a suspect until its attempt is among the reported ones."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from faultlens.attribution.detectors.base import JobOptions, JobPass
from faultlens.attribution.detectors.builtin import CrashDetector, CrashNotes
from faultlens.attribution.detectors.crash.failures import CrashResult
from faultlens.attribution.detectors.progress.suspect import HangSuspect
from faultlens.attribution.engine import Engine
from faultlens.attribution.reading.telemetry import Telemetry, empty_samples, to_frame

NOW = dt.datetime(2026, 12, 8, 2, 0, tzinfo=dt.UTC)


def _telemetry() -> Telemetry:
    return Telemetry(
        ranks=to_frame(None, "ranks"),
        steps=to_frame(None, "steps"),
        process_events=to_frame(None, "process_events"),
        gpu_events=to_frame(None, "gpu_events"),
        collectives=pa.table({}),
        fetch_samples=lambda *args, **kwargs: empty_samples(),
        jobs=("job",),
    )


def _stalled(attempt: int, last_step: int) -> HangSuspect:
    since = NOW - dt.timedelta(seconds=90)
    return HangSuspect("job", attempt, since, "progress", last_step, 90.0, 30.0, ())


def _hangs(reported: frozenset) -> list:  # type: ignore[type-arg]
    hang = Engine().detector("hang")
    run = JobPass(_telemetry(), NOW, NOW, JobOptions(reported=reported))
    run.notes[CrashDetector.name] = CrashNotes(CrashResult(), (_stalled(0, 7), _stalled(1, 3)))
    return hang.detect(run)


def test_a_stalled_attempt_not_reported_before_is_a_hang_suspect() -> None:
    found = _hangs(frozenset())
    assert sorted(i.attempt for i in found) == [0, 1]


def test_an_attempt_reported_before_is_not_reported_hung_again() -> None:
    found = _hangs(frozenset({("job", 0)}))
    assert [i.attempt for i in found] == [1]


def test_the_engine_counts_the_followers_hung_and_crashed_attempts_as_reported() -> None:
    seen: list[JobOptions] = []

    class Spy:
        name, scope = "spy", Engine().detector("hang").scope

        def detect(self, run: JobPass) -> list:  # type: ignore[type-arg]
            seen.append(run.options)
            return []

    engine = Engine()
    engine.detectors = (Spy(),)
    engine.run_job(_telemetry(), NOW, NOW, hung={("job", 0): NOW}, failed={("job", 2): NOW})
    assert seen[0].reported == frozenset({("job", 0), ("job", 2)})
