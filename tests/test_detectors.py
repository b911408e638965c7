"""The engine's one extension point (attribution/detectors/base.py): the Detector protocol and its
registry. The built-in detectors are registered in the order that carries the judgment; an engine
runs what is registered, so a new incident class is one detector and one register() call; a registry
refuses a name twice and an unknown name. Run on the real `faultlens demo` store of
tests/data/teardown/demo-sigkill."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from faultlens.attribution.detectors.base import (
    REGISTRY,
    Detector,
    DetectorInputs,
    DetectorRegistry,
    DetectorRegistryError,
    JobPass,
    Scope,
)
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Incident, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import load_from_store

DEMO_SIGKILL = Path(__file__).parent / "data" / "teardown" / "demo-sigkill"
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_the_built_in_detectors_run_in_the_order_that_carries_the_judgment() -> None:
    assert REGISTRY.names() == ("crash", "hang", "straggler", "loss", "health")
    engine = Engine()
    assert [d.name for d in engine.detectors] == list(REGISTRY.names())
    assert all(isinstance(d, Detector) for d in engine.detectors)
    assert [d.scope for d in engine.detectors] == [Scope.JOB] * 4 + [Scope.STORE]


def test_an_engine_runs_only_the_detectors_it_is_built_with() -> None:
    everything = attribute(str(DEMO_SIGKILL), now=NOW)
    crash_only = attribute(str(DEMO_SIGKILL), now=NOW, engine=Engine(detectors=["crash"]))
    classes = {i.incident_class for i in everything}
    assert IncidentClass.CRASH in classes and len(classes) > 1, classes  # the demo run also hung
    assert crash_only and {i.incident_class for i in crash_only} == {IncidentClass.CRASH}
    assert {i.incident_id for i in crash_only} <= {i.incident_id for i in everything}


class _Echo:
    """A new detector: it sees what the detectors before it found in the same job pass."""

    name = "echo"
    scope = Scope.JOB

    def __init__(self, inputs: DetectorInputs) -> None:
        self.seen: list[list[str]] = []

    def detect(self, run: JobPass) -> list[Incident]:
        self.seen.append(sorted(run.incidents))
        return []


def test_a_new_detector_is_one_class_and_one_registration() -> None:
    registry = REGISTRY.copy()
    registry.register(_Echo.name, _Echo)
    # the copy took it, not the original
    assert REGISTRY.names() == ("crash", "hang", "straggler", "loss", "health")
    engine = Engine()
    engine.detectors = registry.build(
        DetectorInputs(engine.crash_rules, engine.thresholds, engine.catalog)
    )
    echo = engine.detector("echo")
    store = Store(str(DEMO_SIGKILL))
    try:
        telemetry = load_from_store(store, None)
        found = {}
        for job in telemetry.jobs:
            found[job] = sorted(
                i.incident_id for i in engine.run_job(telemetry.for_job(job), NOW, NOW)
            )
    finally:
        store.close()
    # after every other JOB detector, once a job
    assert echo.seen == list(found.values()) and any(found.values())


def test_a_registry_refuses_a_name_twice_and_an_unknown_name() -> None:
    registry = DetectorRegistry()
    registry.register("echo", _Echo)
    with pytest.raises(DetectorRegistryError, match="'echo' is already registered"):
        registry.register("echo", _Echo)
    engine = Engine()
    with pytest.raises(DetectorRegistryError, match="no detector named nan-loss"):
        registry.build(
            DetectorInputs(engine.crash_rules, engine.thresholds, engine.catalog), ["nan-loss"]
        )
