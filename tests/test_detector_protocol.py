"""A new incident class is one detector class and one register() call
(attribution/detectors/base.py), and the batch pass over a store runs it attempt by attempt like the
built-in ones: the windowed pass (Engine.run_windows) goes through the Detector protocol
(prepare_job, detect_attempt, or the declared window), never reads a job whole because of which
detectors are registered, and finds what the built-in detectors find without it. Run on a small
real store of two attempts written through the real SegmentSink (tests/engine_rows.py)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from faultlens.attribution import engine as engine_module
from faultlens.attribution.detectors.base import (
    REGISTRY,
    AttemptDetector,
    AttemptPass,
    AttemptWindow,
    DetectorInputs,
    DetectorRegistryError,
    JobPass,
    Scope,
)
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from tests.engine_rows import at, ranks_rows, steps_rows, write

JOB = "newcomer"
WORLD, PER_NODE, STEPS = 4, 2, 40
# attempt 0: one step of 5 s; attempt 1: its loss jumps 50x and stays there (a divergence: a spike
# that comes back is an observation, no incident)
SLOW_STEP, SPIKE_STEP = 12, 30
SECOND_START = 40.0  # attempt 1 starts about 3 s after attempt 0 ended (no hang between them)
CEILING_S = 3.0
NOW = at(SECOND_START + 35.0)  # just after attempt 1's last step: detection time, observation end


def _sections(slow_at: int | None) -> Callable[[int, int], dict[str, float]]:
    def sections(rank: int, step: int) -> dict[str, float]:
        return {"forward": 5.0 if step == slow_at else 0.3, "backward": 0.5}
    return sections


def _steps(attempt: int, start: float, slow_at: int | None, spike_at: int | None) -> list[dict]:
    rows = steps_rows(JOB, attempt, WORLD, PER_NODE, range(STEPS), start=start,
                      sections=_sections(slow_at))
    for row in rows:
        diverged = spike_at is not None and row["step"] >= spike_at
        row["loss"] = 50.0 if diverged else 1.0 + 0.01 * (row["step"] % 3)
    return rows


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("protocol") / "store"
    first = _steps(0, 0.0, SLOW_STEP, None)
    second = _steps(1, SECOND_START, None, SPIKE_STEP)
    assert max(r["end_ts"] for r in first) < at(SECOND_START - 1)
    assert max(r["ts"] for r in second) < NOW
    write(path, "ranks", ranks_rows(JOB, 0, WORLD, PER_NODE)
          + ranks_rows(JOB, 1, WORLD, PER_NODE, start=SECOND_START))
    write(path, "steps", first + second)
    return str(path)


def _incident(name: str, attempt: int, ts: dt.datetime, now: dt.datetime, summary: str,
              step: int | None = None) -> Incident:
    return Incident(incident_id=Incident.make_id(name, JOB, attempt, step),
                    incident_class=IncidentClass.UNKNOWN, cause=Cause.UNKNOWN, first_signal_ts=ts,
                    detected_ts=now, confidence=0.5, rule=name, summary=summary, job_id=JOB,
                    attempt=attempt, step=step)


class SlowStep:
    """A step that took longer than a ceiling, as a newcomer writes a detector: name, scope, detect
    over a job pass, and detect_attempt over one attempt of the batch pass (here its every step row,
    chunk by chunk)."""

    name = "slow-step"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        self.seen: list[tuple[int, int, set[int]]] = []  # per pass: attempt, rows, their attempts

    def detect(self, run: JobPass) -> list[Incident]:
        return self._slow(run.telemetry.steps, run.now)

    def detect_attempt(self, run: AttemptPass) -> list[Incident]:
        chunks = list(run.straggler_chunks())
        rows = pd.concat(chunks, ignore_index=True) if chunks else pd.DataFrame()
        self.seen.append((run.attempt, len(rows), set(rows["attempt"]) if len(rows) else set()))
        return self._slow(rows, run.now)

    def _slow(self, steps: pd.DataFrame, now: dt.datetime) -> list[Incident]:
        if steps.empty:
            return []
        slow = steps[steps["duration_s"] > CEILING_S]
        return [_incident(self.name, int(attempt),
                          pd.Timestamp(rows["end_ts"].min()).to_pydatetime(), now,
                          f"step {int(step)} took over {CEILING_S:g} s", int(step))
                for (attempt, step), rows in slow.groupby(["attempt", "step"])]


def _identity(incidents: list[Incident]) -> list[str]:
    rows = []
    for incident in incidents:
        row = incident.to_row()
        row.pop("ts")
        rows.append(json.dumps(row, sort_keys=True, default=str))
    return sorted(rows)


def _no_whole_job_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the windowed pass read a job whole")

    monkeypatch.setattr(engine_module, "load_from_store", refuse)


def _engine_with(*detectors: type) -> Engine:
    registry = REGISTRY.copy()
    for detector in detectors:
        registry.register(detector.name, detector)
    return Engine(registry=registry)


def test_a_new_detector_runs_attempt_by_attempt_in_the_batch_pass(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine_with(SlowStep)
    assert [d.name for d in engine.detectors] == [*REGISTRY.names(), "slow-step"]
    assert "slow-step" not in REGISTRY.names()  # the copy took it
    assert isinstance(engine.detector("slow-step"), AttemptDetector)
    _no_whole_job_read(monkeypatch)
    default = attribute(store, now=NOW)  # the built-in detectors alone
    found = attribute(store, now=NOW, engine=engine)
    slow = [i for i in found if i.rule == "slow-step"]
    assert [(i.attempt, i.step) for i in slow] == [(0, SLOW_STEP)]
    rows = WORLD * STEPS
    assert engine.detector("slow-step").seen == [(0, rows, {0}), (1, rows, {1})]  # its rows only
    assert any(i.incident_class == IncidentClass.NUMERICS and i.attempt == 1 for i in default)
    assert _identity([i for i in found if i.rule != "slow-step"]) == _identity(default)


def test_the_windowed_pass_with_a_new_detector_agrees_with_the_whole_store_pass(store: str) -> None:
    windowed = attribute(store, now=NOW, engine=_engine_with(SlowStep))
    whole = attribute(store, now=NOW, engine=_engine_with(SlowStep), windowed=False)
    assert any(i.rule == "slow-step" for i in whole)
    assert _identity(windowed) == _identity(whole)


class LossCeiling:
    """No detect_attempt: it declares the window its detect reads, and runs once per attempt."""

    name = "loss-ceiling"
    scope = Scope.JOB
    window = AttemptWindow.LOSS

    def __init__(self, inputs: DetectorInputs) -> None:
        self.seen: list[set[int]] = []

    def detect(self, run: JobPass) -> list[Incident]:
        steps = run.telemetry.steps
        self.seen.append(set(steps["attempt"]))
        high = steps[steps["loss"] > 20.0]
        return [_incident(self.name, int(attempt), pd.Timestamp(rows["ts"].min()).to_pydatetime(),
                          run.now, "loss over 20") for attempt, rows in high.groupby("attempt")]


class RowsSeen:
    """Declares the progress window, which holds one start row of every other attempt: it reports
    every attempt with the rows it saw of it, and only each attempt's own pass is kept."""

    name = "rows-seen"
    scope = Scope.JOB
    window = AttemptWindow.PROGRESS

    def __init__(self, inputs: DetectorInputs) -> None:
        self.returned = 0

    def detect(self, run: JobPass) -> list[Incident]:
        counts = run.telemetry.steps.groupby("attempt").size()
        self.returned += len(counts)
        return [_incident(self.name, int(attempt), run.now, run.now, f"{int(n)} rows")
                for attempt, n in counts.items()]


def test_a_detector_without_detect_attempt_runs_its_detect_over_its_declared_window(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine_with(LossCeiling, RowsSeen)
    _no_whole_job_read(monkeypatch)
    found = attribute(store, now=NOW, engine=engine)
    assert engine.detector("loss-ceiling").seen == [{0}, {1}]  # each attempt's loss window
    assert [i.attempt for i in found if i.rule == "loss-ceiling"] == [1]
    assert engine.detector("rows-seen").returned == 4  # both attempts in each progress window
    seen = {i.attempt: i.summary for i in found if i.rule == "rows-seen"}
    assert sorted(seen) == [0, 1]
    # attempt 1 as its own pass saw it, not as attempt 0's pass did (its start row alone)
    assert all(int(summary.split()[0]) > 1 for summary in seen.values()), seen


class LiveOnly:
    """Neither detect_attempt nor a window: the batch pass could only read its jobs whole."""

    name = "live-only"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        pass

    def detect(self, run: JobPass) -> list[Incident]:
        return []


def test_a_detector_the_windowed_pass_cannot_run_is_refused_when_the_engine_is_built() -> None:
    with pytest.raises(DetectorRegistryError,
                       match=r"'live-only' .* cannot run attempt by attempt"):
        _engine_with(LiveOnly)


def test_only_the_data_sends_a_job_to_the_whole_job_read(store: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with a row of no attempt has no attempt window that holds it: that job is read whole,
    and finds what the whole-store pass finds."""
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    write(copy, "ranks", [{**ranks_rows(JOB, 0, WORLD, PER_NODE)[0], "attempt": None}])
    whole = attribute(str(copy), now=NOW, engine=_engine_with(SlowStep), windowed=False)
    reads: list[str | None] = []
    load = engine_module.load_from_store

    def counted(opened: object, job: str | None = None) -> object:
        reads.append(job)
        return load(opened, job)

    monkeypatch.setattr(engine_module, "load_from_store", counted)
    windowed = attribute(str(copy), now=NOW, engine=_engine_with(SlowStep))
    assert reads == [JOB]
    assert _identity(windowed) == _identity(whole) and any(i.rule == "slow-step" for i in whole)
