"""The straggler cases of the real torch jobs at 1,024 ranks on the simulator (128 nodes x 8 GPUs,
tensor parallel in a node, 4 pipeline stages, 32 replicas): one slow GPU -> its node only; one slow
stage in every replica -> one systemic incident, nothing excluded; one slow replica (4 nodes) ->
named as a replica, no node excluded; a CPU hog's jitter -> no incident. Decisions through the
default policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.attribution.policy.slowdown import decide_all
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.controller.lab.simulate.straggler_cases import write_case


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


@pytest.mark.parametrize("case", ["worker", "stage", "replica", "jitter"])
def test_straggler_cases_at_1024_ranks(tmp_path: Path, engine: Engine, case: str) -> None:
    store = str(tmp_path / "store")
    truth = write_case(store, case, steps=100, onset=30, seed=4)
    assert truth.world_size == 1024

    found = [
        i for i in attribute(store, engine=engine) if i.incident_class is IncidentClass.STRAGGLER
    ]
    decisions = decide_all(DecisionPolicy(load_policy()), found)

    if case == "jitter":
        assert found == []
        return
    (incident,), (decision,) = found, decisions
    if case == "worker":
        assert incident.culprit_nodes == truth.nodes and set(incident.culprit_ranks) == set(
            truth.ranks
        )
        assert decision.action is Action.FAILOVER and decision.exclude_nodes == truth.nodes
    elif case == "stage":
        assert incident.cause is Cause.WORKLOAD_IMBALANCE and incident.culprit_nodes == ()
        assert f"pipeline stage {truth.stage}" in incident.evidence[0].text
        assert decision.action is Action.NOTIFY and decision.exclude_nodes == ()
    else:
        assert (
            set(incident.culprit_ranks) == set(truth.ranks)
            and f"replica {truth.replica}" in incident.summary
        )
        assert incident.culprit_nodes == ()
        assert decision.action is Action.NOTIFY and decision.exclude_nodes == ()
    assert incident.details["saving_fraction"] > 0.05
