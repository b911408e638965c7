"""How the demo's job runs under the reference supervisor: one RunConfig for `faultlens demo` and
for the bench that sets the demo beside plain torchrun (bench/bench_demo_vs_torchrun.py), so the two
never drift apart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from faultlens.controller.supervisor.run import RunConfig
from faultlens.resources import rule_file

NNODES, NPROC, SPARES = 2, 2, 4  # two simulated nodes of two ranks on loopback, four spare nodes
# the length the demo job declares: a long run, of which the demo runs the start
DEMO_DECLARED_STEPS = 100_000


def demo_run_config(*, steps: int, store: str, workdir: Path, job_id: str, max_attempts: int,
                    train_args: Sequence[str] = ()) -> RunConfig:
    """The demo's run: controller/demo/train.py for `steps` steps (`train_args`: more of its
    options), the demo's thresholds (rules/thresholds-demo.yaml), and the length it declares (its
    ranks rows' total_steps), so that live and a later batch pass weigh a slowdown against the same
    remaining time."""
    return RunConfig(
        script=("-m", "faultlens.controller.demo.train", "--steps", str(steps), *train_args),
        nnodes=NNODES,
        nproc_per_node=NPROC,
        spares=SPARES,
        store=store,
        workdir=workdir,
        job_id=job_id,
        max_attempts=max_attempts,
        thresholds_path=rule_file("thresholds-demo.yaml"),
        attempt_timeout_s=120.0,
        hang_grace_s=3.0,
        checkpoint_wait_s=60.0,
        total_steps=DEMO_DECLARED_STEPS,
    )
