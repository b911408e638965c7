"""The job's remaining time for the slowdown policy: the length the job declares
(StepTimer(total_steps=), $FAULTLENS_TOTAL_STEPS, `faultlens run --total-steps`) reaches the ranks
rows of a real store, and the detector's figure (steps left x the recent step time; unknown when
nothing declares it). The real torch jobs of tests/test_straggler_torch.py carry it to the policy's
decision."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import pytest

from faultlens.attribution.detectors.straggler import remaining_time
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.step_timer import RankIdentity, StepTimer


def ranks_rows(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, **kwargs
) -> list[dict]:
    if env is None:
        monkeypatch.delenv("FAULTLENS_TOTAL_STEPS", raising=False)
    else:
        monkeypatch.setenv("FAULTLENS_TOTAL_STEPS", env)
    identity = RankIdentity(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node="node-0",
        job_id="job-r",
        attempt=0,
        pid=1,
        hostname="node-0",
    )
    timer = StepTimer(SegmentSink(str(store_dir)), identity=identity, heartbeat=False, **kwargs)
    with timer.step(0):
        pass
    timer.close()
    with Store(str(store_dir)) as store:
        return store.query("SELECT * FROM ranks").to_pylist()


@pytest.mark.parametrize("env,kwargs,declared", [
    ("250000", {}, 250_000),  # what `faultlens run --total-steps` sets for the ranks
    (None, {"total_steps": 1200}, 1200),  # the training code's own figure
    ("250000", {"total_steps": 1200}, 1200),  # the code wins over the environment
    (None, {}, None),  # nothing declared: unknown
    ("many", {}, None),  # not a number: unknown, never an error in the training process
    ("0", {}, None),
])
def test_the_declared_length_reaches_the_ranks_rows(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: str | None,
    kwargs: dict,
    declared: int | None,
) -> None:
    (row,) = ranks_rows(tmp_path / "store", monkeypatch, env, **kwargs)
    assert row.get("total_steps") == declared


def test_remaining_time_from_the_declared_length() -> None:
    ranks = pd.DataFrame(
        {"rank": [0, 1, 0, 1], "attempt": [0, 0, 1, 1], "total_steps": [1000, 1000, 1000, 900]}
    )
    found = remaining_time(ranks, 1, last_step=399, recent_step_s=0.5)
    assert found is not None and found.total_steps == 900  # ranks that disagree: the least
    assert found.seconds == pytest.approx((900 - 400) * 0.5)
    # past its declared end
    assert remaining_time(ranks, 0, last_step=2000, recent_step_s=0.5).seconds == 0.0
    assert (
        remaining_time(ranks.drop(columns="total_steps"), 1, last_step=1, recent_step_s=0.5) is None
    )
    assert remaining_time(ranks.assign(total_steps=None), 1, last_step=1, recent_step_s=0.5) is None
    assert remaining_time(ranks, 1, last_step=1, recent_step_s=float("nan")) is None


def test_faultlens_run_passes_total_steps_to_the_ranks() -> None:
    from faultlens.controller.cli.run_cmds import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["run", "--nnodes", "1", "--nproc-per-node", "1", "--total-steps", "5000", "--", "train.py"]
    )
    assert args.total_steps == 5000
    plain = parser.parse_args(["run", "--nnodes", "1", "--nproc-per-node", "1", "--", "t.py"])
    assert plain.total_steps is None and plain.assume_remaining is None
