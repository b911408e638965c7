"""Issue 11: the demo's store holds exactly one incident per fault (none made of the supervisor's
own signals), and `faultlens attribute` re-run in batch over the store written live gives the same
incidents and decisions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from faultlens.attribution.engine import Engine, attribute, write_new_incidents
from faultlens.attribution.policy import DecisionPolicy, StoreHistory
from faultlens.attribution.reading.store import Store
from faultlens.attribution.rules import load_thresholds

pytest.importorskip("torch")

DEMO_THRESHOLDS = Path(__file__).resolve().parents[1] / "rules" / "thresholds-demo.yaml"


def _live(store: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    with Store(store) as reader:
        incidents = {row["incident_id"]: row for row in reader.query(
            "SELECT * FROM incidents QUALIFY row_number() OVER (PARTITION BY incident_id ORDER BY "
            "ts) = 1"
        ).to_pylist()}
        decisions = {row["incident_id"]: row for row in reader.query(
            "SELECT incident_id, action, exclude_nodes FROM decisions "
            "QUALIFY row_number() OVER (PARTITION BY decision_id ORDER BY ts) = 1").to_pylist()}
    return incidents, decisions


def test_one_incident_per_fault(demo_store):
    store, workdir, _ = demo_store
    summary = json.loads((workdir / "summary.json").read_text())
    incidents, _ = _live(store)
    assert len(incidents) == len(summary["attempts"]) == 5, sorted(
        (row["attempt"], row["class"], row["cause"], row["rule"]) for row in incidents.values())
    assert sorted(row["attempt"] for row in incidents.values()) == list(range(5))


def test_batch_over_the_live_store_agrees_with_live(demo_store, tmp_path):
    store, _, _ = demo_store
    live, live_decisions = _live(store)
    engine = Engine(thresholds=load_thresholds(DEMO_THRESHOLDS))
    batch = attribute(store, engine=engine)
    assert {i.incident_id for i in batch} == set(live)
    for incident in batch:
        row = live[incident.incident_id]
        assert (incident.incident_class.value, incident.cause.value, list(incident.culprit_nodes),
                list(incident.culprit_ranks)) == (row["class"], row["cause"], row["culprit_nodes"],
                                                  row["culprit_ranks"]), incident
    # the decisions a batch pass makes, in order, over a store holding only the telemetry
    copy = tmp_path / "store"
    shutil.copytree(store, copy, ignore=shutil.ignore_patterns("incidents", "decisions"))
    from faultlens.controller.delivery import Deliverer

    policy = DecisionPolicy(history=StoreHistory(Store(copy)))
    deliverer = Deliverer(str(copy), [])
    for incident in sorted(batch, key=lambda i: (i.attempt or 0, i.first_signal_ts)):
        write_new_incidents(str(copy), [incident])
        decision = policy.decide(incident)
        deliverer.submit(decision)
        expected = live_decisions[incident.incident_id]
        assert (decision.action.value, list(decision.exclude_nodes)) == (
            expected["action"],
            expected["exclude_nodes"],
        ), incident
