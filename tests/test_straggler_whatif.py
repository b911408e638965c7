"""The what-if step model: the pipeline model per replica, the data-parallel sync as a max over
replicas from the observed arrivals at the sync (attribution/detectors/straggler/whatif.py), on
several layouts. The real torch jobs are in tests/test_straggler_torch.py; these pin the model's
arithmetic on layouts the jobs do not cover."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from faultlens.attribution.detectors.straggler.layout import build_layout
from faultlens.attribution.detectors.straggler.whatif import StepModel, what_if

STEPS = 12


def model(replicas: int, stages: int) -> StepModel:
    world = replicas * stages
    ranks = pd.DataFrame({"rank": range(world), "dp_rank": [r // stages for r in range(world)],
                          "pp_rank": [r % stages for r in range(world)]})
    return StepModel(build_layout(list(range(world)), ranks, None, {}))


def compute_of(replicas: int, stages: int, unit_s: float = 0.08) -> np.ndarray:
    return np.full((STEPS, replicas * stages), unit_s)


@pytest.mark.parametrize("replicas,stages,culprit,gap", [
    # 4 replicas x 2 stages: the next-slowest replica arrives 50 ms before the culprit's
    (4, 2, 3, 0.05),
    (2, 4, 6, 0.03),  # 2 x 4
    (8, 1, 5, 0.02),  # plain data parallelism (every rank a replica)
])
def test_a_fixed_worker_saves_only_down_to_the_next_slowest_replica(
    replicas: int, stages: int, culprit: int, gap: float
) -> None:
    m = model(replicas, stages)
    compute = compute_of(replicas, stages)
    compute[:, culprit] += 0.12  # 120 ms of excess per step
    fixed = compute_of(replicas, stages)
    design = float(np.median(m.saving(compute, fixed, 4.0)))  # the pipeline model alone
    assert design > gap
    # every rank reached the sync at 10.0 s, the culprit's replica later (its excess on its critical
    # path), and one other replica `gap` before the culprit's (its own slowness: jitter, a slow
    # link; not compute)
    arrival = np.full((STEPS, replicas * stages), 10.0)
    culprit_replica = culprit // stages
    other = (culprit_replica + 1) % replicas
    arrival[:, culprit_replica * stages:(culprit_replica + 1) * stages] = 10.0 + design
    arrival[:, other * stages:(other + 1) * stages] = 10.0 + design - gap
    assert np.median(m.saving(compute, fixed, 4.0, arrival)) == pytest.approx(gap)
    # with every other replica well ahead the saving is the model's
    arrival[:, other * stages:(other + 1) * stages] = 10.0
    assert np.median(m.saving(compute, fixed, 4.0, arrival)) == pytest.approx(design)


def test_the_last_group_to_sync_bounds_the_saving() -> None:
    """2 x 4, replica 1 slow in every stage: its stage 0 finishes its backward last (GPipe), the
    stage-3 group syncs early. The saving is set by the last arrival (stage 0's group), not by the
    earliest group's slack."""
    m = model(2, 4)
    compute = compute_of(2, 4)
    compute[:, 4:8] += 0.12
    fixed = compute_of(2, 4)
    design = float(np.median(m.saving(compute, fixed, 4.0)))
    arrival = np.full((STEPS, 8), 10.0)
    arrival[:, 0:4] = 10.0 + np.array([0.0, -0.01, -0.02, -0.03])  # replica 0: stage 0 last
    # replica 1's lag grows towards stage 0
    arrival[:, 4:8] = 10.0 + design + np.array([0.0, -0.06, -0.12, -0.18])
    assert np.median(m.saving(compute, fixed, 4.0, arrival)) == pytest.approx(design)


def test_one_replica_and_untimed_syncs_keep_the_pipeline_model() -> None:
    m1 = model(1, 4)
    compute = compute_of(1, 4)
    compute[:, 2] += 0.12
    fixed = compute_of(1, 4)
    alone = m1.saving(compute, fixed, 4.0)
    # one replica: nobody to wait for, arrivals change nothing (own history is the only reference)
    assert np.allclose(m1.saving(compute, fixed, 4.0, np.full((STEPS, 4), 10.0)), alone)
    # M-1 microbatches at the bottleneck + one
    assert np.median(alone) == pytest.approx(0.12 * 3 / 4 + 0.12 / 4)
    m4 = model(4, 2)
    compute, fixed = compute_of(4, 2), compute_of(4, 2)
    compute[:, 3] += 0.12
    expected = m4.saving(compute, fixed, 4.0)
    # arrivals seen in one replica only cannot tell who waits for whom: the model's saving
    arrival = np.full((STEPS, 8), np.nan)
    arrival[:, 2:4] = 10.0
    assert np.allclose(m4.saving(compute, fixed, 4.0, arrival), expected)


def test_what_if_uses_the_arrivals() -> None:
    m = model(4, 2)
    compute, fixed = compute_of(4, 2), compute_of(4, 2)
    compute[:, 3] += 0.12
    observed = np.full(STEPS, 0.4)
    plain = what_if(m, compute, fixed, observed, 4.0)
    arrival = np.full((STEPS, 8), 10.0)
    arrival[:, 2:4] = 10.12
    arrival[:, 4:6] = 10.08  # replica 2 is 80 ms behind the others on its own
    bounded = what_if(m, compute, fixed, observed, 4.0, arrival=arrival)
    assert plain is not None and bounded is not None
    assert plain.saving_s == pytest.approx(0.12) and bounded.saving_s == pytest.approx(0.04)


def test_a_fixed_replica_that_times_no_sync_keeps_the_model() -> None:
    """The fixed worker's replica waits under another name (pipeline traffic, no sync section): its
    arrival cannot be placed, so the others' arrivals alone say nothing about the saving."""
    m = model(4, 2)
    compute, fixed = compute_of(4, 2), compute_of(4, 2)
    compute[:, 5] += 0.12
    arrival = np.full((STEPS, 8), 10.0)
    arrival[:, 4:6] = np.nan
    assert np.allclose(m.saving(compute, fixed, 4.0, arrival), m.saving(compute, fixed, 4.0))
