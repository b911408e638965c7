"""Real torch pipeline jobs (8 ranks, gloo, CPU; 2 replicas x 4 stages and 4 replicas x 2 stages; slowness by
sleeping in chosen sections, tests/torch_jobs/straggler_jobs.py): one slow worker -> that node only, failed over;
one slow stage in every replica -> one systemic incident, nothing excluded; one slow replica -> named as a replica;
a CPU hog beside a healthy job -> no incident. The what-if estimate against the injected slowness (the measured
step-time change is the bench's: bench/bench_straggler.py --torch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.attribution.straggler_policy import decide_all
from faultlens.collectors.xid_catalog import load_xid_catalog
from tests.torch_jobs.straggler_jobs import CASES, straggler_artifacts


@pytest.fixture(scope="module")
def jobs() -> dict[str, Path]:
    return straggler_artifacts()


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(catalog=load_xid_catalog())


def analyse(art: Path, store: Path, engine: Engine) -> tuple[dict, list, list]:
    shutil.copytree(art / "store", store)
    meta = json.loads((art / "meta.json").read_text())
    found = attribute(str(store), engine=engine)
    return meta, found, decide_all(DecisionPolicy(load_policy()), found)


def injected_saving(meta: dict) -> float:
    """The step time the injected sleep costs by design: a GPipe schedule of M microbatches pays a slow stage's
    extra M times, a slow replica's (P + M - 1) times (every stage of it)."""
    slow = meta["slow"][0]
    m, p = meta["microbatches"], meta["stages"]
    return slow["extra_s"] * (p + m - 1 if slow["stage"] is None else m)


@pytest.mark.parametrize("name", sorted(n for n in CASES if not CASES[n].hog))
def test_real_pipeline_job_slowdowns(jobs: dict[str, Path], tmp_path: Path, engine: Engine, name: str) -> None:
    meta, found, decisions = analyse(jobs[name], tmp_path / "store", engine)
    expected = meta["expected"]

    assert [i.incident_class for i in found] == [IncidentClass.STRAGGLER]  # one incident, nothing else
    (incident,), (decision,) = found, decisions
    if expected["kind"] == "worker":
        (rank,) = expected["ranks"]
        assert incident.culprit_ranks == (rank,) and incident.culprit_nodes == (f"node-{rank // 2}",)
        assert incident.confidence >= load_policy().threshold_for(IncidentClass.STRAGGLER)
        assert decision.action is Action.FAILOVER and decision.exclude_nodes == (f"node-{rank // 2}",)
    elif expected["kind"] == "stage":
        assert incident.cause is Cause.WORKLOAD_IMBALANCE and incident.culprit_nodes == ()
        assert f"pipeline stage {expected['stage']}" in incident.evidence[0].text
        assert decision.action is Action.NOTIFY and decision.exclude_nodes == ()
    else:
        assert list(incident.culprit_ranks) == expected["ranks"]
        assert f"replica {expected['replica']}" in incident.summary
        nodes = sorted({f"node-{r // 2}" for r in expected["ranks"]})
        if len(nodes) == 1:  # 4 x 2: the replica is one node
            assert incident.culprit_nodes == tuple(nodes) and incident.rule == "straggler-replica-node"
        else:
            assert incident.culprit_nodes == () and decision.exclude_nodes == ()
            assert decision.action is Action.NOTIFY
    # the what-if: the saving the model estimates against what the injected sleep costs by design
    saving_s = incident.details["whatif"]["step_s"] - incident.details["whatif"]["ideal_s"]
    assert saving_s == pytest.approx(injected_saving(meta), rel=0.3)
    assert any(e.text.startswith("what-if") for e in incident.evidence)


def test_cpu_hog_beside_a_healthy_job_raises_nothing(jobs: dict[str, Path], tmp_path: Path, engine: Engine) -> None:
    _, found, _ = analyse(jobs["hog_2x4"], tmp_path / "store", engine)
    assert found == []
