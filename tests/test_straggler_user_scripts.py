"""The straggler judgment on training scripts written as users write them (issue 33): real torch
jobs (tests/torch_jobs/user_scripts/, 2 simulated nodes x 2 ranks, gloo, CPU, launched by two
torchrun launchers as a 2-node job is; tests/torch_jobs/user_jobs.py):

- a DDP job with a DataLoader worker, a DistributedSampler and an evaluation every 5 steps (its
  `data` section waits for the worker process: noise, not a slow rank);
- a 2-stage x 2-replica pipeline whose user times the neighbour waits as `wait_act` / `wait_grad`
  and the loss and gradient all_reduces as `comm/loss` / `comm/grads` (names in a wait namespace);
- tensor parallel x data parallel from sub-groups, names under the user's `train/` prefix with the
  tensor-parallel all_reduce nested in the forward.

The DataLoader job and the pipeline job healthy beside a CPU hog (one busy process per core): no
incident of any class. The TP x DP job with one slow worker (30 ms more in its forward every step):
that worker and its node, at the straggler failover threshold, and nothing else. One job per shape
(tests/torch_jobs/user_jobs.py RUNS: 3 torch jobs, 9 before); every script healthy >= 20 times
(half beside a hog) and each with its slow worker: bench/bench_user_scripts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultlens.attribution.engine import attribute
from faultlens.attribution.incident import IncidentClass
from faultlens.attribution.policy import load_policy
from tests.torch_jobs.user_jobs import RUNS, user_artifacts


@pytest.fixture(scope="module")
def runs() -> dict[str, Path]:
    return user_artifacts()


def _found(art: Path) -> list:
    return list(attribute(str(art / "store")))


@pytest.mark.parametrize("name", sorted(n for n, r in RUNS.items() if r.slow_rank is None))
def test_healthy_user_scripts_raise_nothing(runs: dict[str, Path], name: str) -> None:
    found = _found(runs[name])
    assert found == [], [(i.rule, i.summary) for i in found]


@pytest.mark.parametrize("name", sorted(n for n, r in RUNS.items() if r.slow_rank is not None))
def test_the_slow_worker_of_a_user_script_is_found(runs: dict[str, Path], name: str) -> None:
    meta = json.loads((runs[name] / "meta.json").read_text())
    (slow,) = meta["slow"]
    found = _found(runs[name])
    assert [i.incident_class for i in found] == [IncidentClass.STRAGGLER], [
        (i.rule, i.summary) for i in found
    ]
    (incident,) = found
    assert incident.culprit_ranks == (slow["rank"],)
    assert incident.culprit_nodes == (slow["node"],)
    assert incident.confidence >= load_policy().threshold_for(IncidentClass.STRAGGLER)
