"""A rank that skips a world collective: the culprit is the rank that left the collective sequence,
never the rank that noticed it.

The fixtures are the telemetry of real `faultlens campaign` runs (gloo, CPU, a loaded 2-core
machine) frozen with tests/freeze_store.py, attempt 0 only: the DDP job
(controller/lab/jobs/ddp_train.py) with one rank skipping its loss all_reduce at a chosen step, in
five shapes (2 nodes x 2 ranks with the skipper at rank 0, 1, 2 or 3; 3 nodes x 2 ranks; 4 nodes x 1
rank). In each, gloo hands the skipper's next message (its next step's gradient bucket) to a peer
waiting in the skipped all_reduce; that peer aborts ("Received data size doesn't match expected size
... Is there a distributed collective mismatch in your code?", SIGABRT) and torchrun names it the
root cause. Before the fix, that victim was the crash's culprit and its healthy node was failed over
(or, when its stderr line landed first, the crash was read as software and escalated).

The pipeline job (controller/lab/jobs/pipeline_train.py, 2 stages x 2 replicas) skipping the world
all_reduce hangs instead: the skipper went on to its next step's recv while its stage-0 peer waits
for it in the all_reduce. Live, the supervisor's py-spy stacks add that recv as a wait, and the
dumps show a cycle {0, 1} nothing in them could order (confidence 0.5: escalated). The real dumps
and stacks of that run are kept beside the store.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pandas as pd
import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.detectors.desync import ranks_apart
from faultlens.attribution.detectors.hang import attach_stacks
from faultlens.attribution.engine import Engine
from faultlens.attribution.incident import IncidentClass
from faultlens.attribution.policy import DecisionPolicy
from faultlens.attribution.reading.store import Store
from faultlens.attribution.reading.telemetry import (
    SAMPLE_COLUMNS,
    Telemetry,
    load_from_store,
    to_frame,
)
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import load_stack_dir
from faultlens.collectors.sources.source import NodeIdentity

DATA = Path(__file__).parent / "data"
TEARDOWN = DATA / "teardown"

# fixture -> (the rank that skipped, its node)
SKIPS = {
    "desync-skip-world-collective": (1, "node-0"),
    "desync-skip-r0-s9": (0, "node-0"),
    "desync-skip-r2-s7": (2, "node-1"),
    "desync-skip-r3-s15": (3, "node-1"),
    "desync-skip-3nodes-r4": (4, "node-2"),
    "desync-skip-1rank-nodes-r1": (1, "node-1"),
}


def _load(name: str) -> Telemetry:
    with Store(str(TEARDOWN / name)) as store:
        telemetry = load_from_store(store)
    no_samples = to_frame(None, "gpu_samples")[list(SAMPLE_COLUMNS)]
    return dataclasses.replace(telemetry, fetch_samples=lambda nodes, start, end: no_samples)


def _as_of(telemetry: Telemetry) -> pd.Timestamp:
    return max(
        pd.Timestamp(f["ts"].max()) for f in (telemetry.heartbeats, telemetry.process_events)
    )


@pytest.mark.parametrize("name", sorted(SKIPS))
def test_the_skipper_is_the_culprit_not_the_rank_that_aborted(name: str) -> None:
    telemetry = _load(name)
    as_of = _as_of(telemetry).to_pydatetime()
    incidents = Engine().run(telemetry, as_of, as_of)
    assert len(incidents) == 1, [(i.incident_class, i.rule, i.culprit_ranks) for i in incidents]
    (incident,) = incidents
    rank, node = SKIPS[name]
    assert incident.incident_class == IncidentClass.COLLECTIVE_HANG
    assert incident.rule == "hang-desync-apart"
    assert incident.culprit_ranks == (rank,)
    assert incident.culprit_nodes == (node,)
    reporter = incident.details["reported_by"]
    # the rank that aborted is named as the reporter only
    assert reporter is not None and reporter != rank
    decision = DecisionPolicy().decide(incident)
    assert decision.action == Action.FAILOVER
    assert decision.exclude_nodes == (node,)


def test_without_a_rank_apart_nobody_is_blamed_and_a_human_is_called() -> None:
    """The same real failure, with every rank's heartbeats at one step (a mismatch inside a step:
    progress cannot say who left): the desync is reported without a culprit, and escalated."""
    telemetry = _load("desync-skip-world-collective")
    beats = telemetry.heartbeats.copy()
    beats["step"] = beats.groupby("rank")["step"].transform("min")
    steps = telemetry.steps.iloc[0:0]
    telemetry = dataclasses.replace(telemetry, heartbeats=beats, steps=steps)
    as_of = _as_of(telemetry).to_pydatetime()
    report = telemetry.process_events["ts"].max().to_pydatetime()
    # the last heartbeats may still be on their way: wait
    assert Engine().run(telemetry, report, report) == []
    later = as_of + dt.timedelta(seconds=10)
    (incident,) = Engine().run(telemetry, later, later)
    assert incident.incident_class == IncidentClass.COLLECTIVE_HANG
    assert incident.rule == "hang-desync-no-culprit"
    assert incident.culprit_ranks == () and incident.culprit_nodes == ()
    assert DecisionPolicy().decide(incident).action == Action.ESCALATE


@pytest.mark.parametrize(("completed", "reporters", "apart"), [
    ({0: 11, 1: 12, 2: 11, 3: 11}, {0}, [1]),  # one rank a step ahead
    # one ahead, one behind (a heartbeat on its way)
    ({0: 11, 1: 12, 2: 11, 3: 10, 4: 11, 5: 11}, {3}, [1]),
    ({0: 11, 1: 10, 2: 11, 3: 11, 4: 11, 5: 11}, {3}, []),  # one behind only: not named
    ({0: 11, 1: 12}, {0}, []),  # two ranks: no majority to speak of
    ({0: 11, 1: 12, 2: 12, 3: 11}, {0}, []),  # half and half
    # the reporter alone ahead: it is where the message went wrong
    ({0: 12, 1: 11, 2: 11, 3: 11}, {0}, []),
    ({0: 3, 1: 4, 2: 5, 3: 6}, set(), []),  # no strict majority
])
def test_ranks_apart(completed: dict[int, int], reporters: set[int], apart: list[int]) -> None:
    assert ranks_apart(completed, reporters)[0] == apart


def test_a_cycle_the_dumps_cannot_order_is_broken_by_progress() -> None:
    """The pipeline job's real dumps and py-spy stacks, as the supervisor handed them to the
    analysis live.
    """
    telemetry = _load("desync-pipe-world-r1")
    dumps_dir = DATA / "desync-pipe-world-r1-dumps"
    (job,) = telemetry.jobs or tuple(telemetry.heartbeats["job_id"].dropna().unique())
    table = read_dump_dir(dumps_dir, identity=NodeIdentity(node=None, job_id=job, attempt=0)).table
    table = attach_stacks(table, load_stack_dir(dumps_dir / "stacks"))
    as_of = _as_of(telemetry).to_pydatetime()
    (incident,) = Engine(dump_requester=lambda suspect: table).run(telemetry, as_of, as_of)
    assert incident.incident_class == IncidentClass.COLLECTIVE_HANG
    texts = " | ".join(e.text for e in incident.evidence)
    assert "cycle" in texts and "blocked in recv" in texts  # the stacks made the cycle
    assert incident.rule == "hang-cycle-progress"
    assert incident.culprit_ranks == (1,) and incident.culprit_nodes == ("node-0",)
    decision = DecisionPolicy().decide(incident)
    assert decision.action == Action.FAILOVER and decision.exclude_nodes == ("node-0",)
