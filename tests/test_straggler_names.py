"""A name chosen for a wait never becomes compute (issue 33): a section's kind comes from what it is
inside as well as from its last part. A healthy pipeline whose user timed the loss all_reduce as
`comm/loss` had it read as the compute section `loss` inside `comm`: stage 1, which waits there for
stage 0, was reported as a slow stage saving 18% of the step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from faultlens.attribution.detectors.straggler.vocab import SectionKind, load_vocabulary
from faultlens.attribution.engine import attribute
from tests.engine_rows import ranks_rows, steps_rows, write

KINDS = {
    # a wait namespace: whatever the last part says
    "comm/loss": SectionKind.COMM,
    "comm/grads": SectionKind.COMM,
    "sync/forward": SectionKind.COMM,
    "Comm/Optimizer": SectionKind.COMM,
    "wait_act": SectionKind.COMM,
    "wait_grad": SectionKind.COMM,
    "wait-for-data/fetch": SectionKind.COMM,
    # the user's own namespace: the last part decides
    "train/forward": SectionKind.COMPUTE,
    "timers/forward-compute": SectionKind.COMPUTE,
    "train/backward": SectionKind.COMPUTE,
    "model/step/forward": SectionKind.COMPUTE,
    "forward/recv": SectionKind.COMM,
    "train/forward/tp-allreduce": SectionKind.COMM,
    # an excluded phase holds everything in it
    "eval/forward": SectionKind.EXCLUDED,
    "checkpoint/save": SectionKind.EXCLUDED,
    # Megatron's own names
    "forward-compute": SectionKind.COMPUTE,
    "backward-compute": SectionKind.COMPUTE,
    "forward-recv": SectionKind.COMM,
    "backward-send": SectionKind.COMM,
    "batch-generator": SectionKind.DATA,
    "grads-all-reduce": SectionKind.COMM,
    "optimizer-clip-main-grad": SectionKind.COMM,
    "optimizer-inner-step": SectionKind.COMPUTE,
    "forward-backward": SectionKind.WRAPPER,
    "cuda/comm/loss": SectionKind.COMM,
}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_section_kind_comes_from_its_path(name: str) -> None:
    assert load_vocabulary().classify(name).kind is KINDS[name]


def test_a_section_timed_beside_its_dash_named_parts_is_not_scored_twice() -> None:
    chosen, _ = load_vocabulary().scored(
        ["optimizer", "optimizer-inner-step", "optimizer-clip-main-grad", "forward-compute"]
    )
    assert chosen == ["optimizer-inner-step", "forward-compute"]
    # alone, it is the optimizer's own work
    assert load_vocabulary().scored(["optimizer", "forward"])[0] == ["optimizer", "forward"]


@pytest.mark.parametrize("loss_name", ["comm/loss", "sync/loss", "comm/loss_allreduce"])
@pytest.mark.parametrize("replicas", [2, 3])
def test_a_pipeline_stage_waiting_in_a_named_wait_is_not_slow(
    tmp_path: Path, loss_name: str, replicas: int
) -> None:
    """Both stages compute alike; stage 1 waits ~35 ms a step for stage 0 in the loss all_reduce
    (the issue's medians)."""
    rng = random.Random(replicas)

    def sections(rank: int, step: int) -> dict[str, float]:
        stage = rank % 2
        return {
            "forward": 0.051 * rng.uniform(0.95, 1.05),
            "backward": 0.026 * rng.uniform(0.95, 1.05),
            "wait_act" if stage else "wait_grad": 0.01 * rng.uniform(0.5, 1.5),
            loss_name: (0.035 if stage else 0.003) * rng.uniform(0.8, 1.2),
            "comm/grads": 0.004 * rng.uniform(0.8, 1.2),
        }

    world = 2 * replicas
    write(tmp_path, "ranks", ranks_rows("job-1", 0, world, 2, pp_size=2))
    write(
        tmp_path,
        "steps",
        steps_rows(
            "job-1", 0, world, 2, range(60), start=1.0, comm_absorbs=False, sections=sections
        ),
    )
    assert attribute(str(tmp_path)) == []
