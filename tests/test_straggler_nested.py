"""Communication timed inside a compute section is waiting, not work.

The fixture is the telemetry of a real `faultlens campaign` run (tests/freeze_store.py, attempt 0):
the pipeline job controller/lab/jobs/pipeline_train.py (2 stages x 2 replicas, gloo, CPU) with stage
1 sleeping 0.12 s more in its forward from step 8. Its send/recv calls are timed in sections nested
in forward and backward (`forward/recv`, `backward/send`). Before, a nested section was left out of
the score and its parent's whole time counted as own work, and with the p2p inside forward both
stages' forward grew by the same ~0.10 s (stage 0 waits for stage 1 in its send): no timing tells
that from the whole job slowing down, and the campaign's slow-stage scenario found nothing. The
nested communication is now taken out of its parent (attribution/detectors/straggler/sections.py:
own_time).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pandas as pd

from faultlens.attribution.decision import Action
from faultlens.attribution.detectors.straggler import own_time
from faultlens.attribution.engine import Engine
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.policy import DecisionPolicy
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import (
    SAMPLE_COLUMNS,
    SECTION_PREFIX,
    Telemetry,
    load_from_store,
    to_frame,
)

FIXTURE = Path(__file__).parent / "data" / "slow-stage-nested"
NOW = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)


def _load() -> Telemetry:
    with Store(str(FIXTURE)) as store:
        telemetry = load_from_store(store)
    no_samples = to_frame(None, "gpu_samples")[list(SAMPLE_COLUMNS)]
    return dataclasses.replace(telemetry, fetch_samples=lambda nodes, start, end: no_samples)


def _stragglers(telemetry: Telemetry) -> list:
    return [i for i in Engine().run(telemetry, NOW) if i.incident_class == IncidentClass.STRAGGLER]


def test_a_slow_stage_is_found_when_its_neighbours_wait_in_nested_sections() -> None:
    (incident,) = _stragglers(_load())
    assert incident.rule == "straggler-pipeline-stage"
    assert incident.cause == Cause.WORKLOAD_IMBALANCE
    assert incident.details["stages"] == [1]  # stage 1, in both replicas (stage = rank % 2)
    assert incident.details["ranks"] == [1, 3]
    assert incident.culprit_nodes == () and incident.culprit_ranks == ()
    decision = DecisionPolicy().decide(incident)
    assert decision.action == Action.NOTIFY and decision.exclude_nodes == ()


def test_without_the_nested_sections_the_same_run_shows_no_stage() -> None:
    """The limit the fix lifts, on the same rows: with the nested sections' names unknown (the waits
    inside the parents, as a script that does not time them), both stages' forward grew alike and
    nothing stands out."""
    telemetry = _load()
    nested = [c for c in telemetry.steps.columns if c.startswith(SECTION_PREFIX) and "/" in c]
    assert nested  # the fixture holds what the test is about
    forward = telemetry.steps.groupby([telemetry.steps["rank"] % 2, telemetry.steps["step"] >= 12])[
        SECTION_PREFIX + "forward"].median().unstack()
    grew = forward[True] - forward[False]
    assert (grew > 0.08).all() and abs(grew[0] - grew[1]) < 0.03  # both stages' forward +~0.1 s
    assert (
        _stragglers(dataclasses.replace(telemetry, steps=telemetry.steps.drop(columns=nested)))
        == []
    )


def test_own_time_takes_out_only_the_outermost_nested_communication() -> None:
    steps = pd.DataFrame({"sec:forward": [1.0, 2.0], "sec:forward/recv": [0.25, 0.5],
                          "sec:forward/recv/send": [0.1, 0.1], "sec:backward": [1.0, 1.0]})
    comm = {"forward/recv": "p2p", "forward/recv/send": "p2p"}
    adjusted = own_time(steps, ["sec:forward", "sec:backward"], comm)
    assert list(adjusted) == ["sec:forward"]
    assert adjusted["sec:forward"].tolist() == [0.75, 1.5]
