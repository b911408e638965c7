"""Issue 11: a node that dies with its agent, ranks and telemetry at once (host_down in the
simulated cluster) ends the attempt as a collective hang whose missing flight-recorder dumps are
exactly that node's ranks. The ranks its loss blocked elsewhere (pipeline peers waiting on it in
send/recv, then lagging in their data-parallel groups) are follow-ons: the incident names that node
alone, cause host, and the policy fails it over (before: the dead node and its pipeline peers'
nodes, cause unknown, escalated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.engine import attribute
from faultlens.attribution.incident import Cause
from faultlens.attribution.policy import DecisionPolicy
from faultlens.controller.lab.fault_labels import read_labels
from faultlens.controller.lab.simulate.config import SimConfig
from faultlens.controller.lab.simulate.run import simulate


@pytest.mark.parametrize(("seed", "pp"), [(1, 4), (5, 2)])
def test_a_lost_node_is_the_culprit_not_its_pipeline_peers(
    tmp_path: Path, seed: int, pp: int
) -> None:
    store = tmp_path / "store"
    result = simulate(
        SimConfig(
            seed=seed,
            nodes=8,
            gpus_per_node=2,
            hours=2.0,
            pp_size=pp,
            fault_sequence=("host_down",),
            faults_per_day=12.0,
            stragglers_per_day=0.0,
            benign_per_day=0.0,
        ),
        str(store),
    )
    labels = [label for label in read_labels(result.labels_path) if label.kind == "host_down"]
    assert labels, "the simulated day holds no host_down"
    incidents = attribute(str(store))
    for label in labels:
        found = [i for i in incidents if i.attempt == label.attempt]
        assert len(found) == 1, (label, found)
        incident = found[0]
        assert incident.culprit_nodes == tuple(label.culprit_nodes), (label, incident.summary)
        assert incident.cause == Cause.HOST
        decision = DecisionPolicy().decide(incident)
        assert decision.action == Action.FAILOVER and decision.exclude_nodes == tuple(
            label.culprit_nodes
        )
