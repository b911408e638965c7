"""A loss spike that does not come back (a divergence) is a numerics incident, cause
data_corruption, restarted in place from before the first bad step; a healthy job's ordinary loss
noise is nothing (a spike that comes back: tests/test_numerics_jobs.py).

Real torch jobs: the campaign's DDP script (controller/lab/jobs/ddp_train.py, gloo, one process,
world 1) with the in-job instrumentation writing a real store and real local-tier checkpoints; the
spike is the campaign's `loss_spike` injection (corrupt batches: the model's input scaled from
step k for DIVERGE_STEPS steps, through the injector the campaign loads with sitecustomize; the
script is not changed). Both jobs run in one test (one torch start each).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.engine import attribute
from faultlens.attribution.incident import Cause, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.attribution.reading.store import Store
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiers import Tier, TierKind
from faultlens.controller.lab.plan import FaultSpec, InjectionPlan
from faultlens.controller.lab.runner import SITE_DIR
from faultlens.controller.lab.scenarios import REPO_ROOT

SCRIPT = REPO_ROOT / "controller" / "lab" / "jobs" / "ddp_train.py"
SPIKE_STEP = 14
DIVERGE_STEPS = 6  # the loss stays up longer than rules/thresholds.yaml's recover_steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(root: Path, job: str, faults: tuple[FaultSpec, ...]) -> Path:
    lab = root / "lab"
    lab.mkdir(parents=True)
    plan = lab / "plan.json"
    plan.write_text(InjectionPlan(faults, {}, 1).to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLENS_")}
    env.update(
        PYTHONPATH=f"{SITE_DIR}{os.pathsep}{REPO_ROOT}",
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        FAULTLENS_STORE=str(root / "store"),
        FAULTLENS_JOB_ID=job,
        FAULTLENS_ATTEMPT="0",
        FAULTLENS_NODE="node-0",
        FAULTLENS_CKPT_LOCAL=str(root / "ckpt"),
        FAULTLENS_CKPT_DURABLE=str(root / "durable"),
        FAULTLENS_HEARTBEAT_DIR="",
        FAULTLENS_LAB_DIR=str(lab),
        FAULTLENS_LAB_PLAN=str(plan),
    )
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--steps",
            "24",
            "--compute-s",
            "0",
            "--ckpt-every",
            "4",
            "--durable-every",
            "4",
            "--flush-s",
            "0.5",
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_a_loss_spike_is_data_corruption_restored_from_before_it_and_noise_is_nothing(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    spiked = _train(
        tmp_path / "spike",
        "spike-job",
        (FaultSpec(id="spike", kind="loss_spike", step=SPIKE_STEP,
                    until_step=SPIKE_STEP + DIVERGE_STEPS, params={"factor": 1000}),),
    )
    healthy = _train(tmp_path / "healthy", "healthy-job", ())

    injected = [
        json.loads(line) for line in (spiked / "lab" / "injections.jsonl").read_text().splitlines()
    ]
    assert [(r["fault"], r["step"]) for r in injected] == [("spike", SPIKE_STEP)]

    with Store(str(healthy / "store")) as store:
        losses = store.query(
            "SELECT step, loss FROM steps WHERE phase = 'train' ORDER BY step"
        ).to_pylist()
        # real, noisy loss
        assert len(losses) == 24 and len({round(r["loss"], 6) for r in losses}) > 20
        assert attribute(store) == []

    with Store(str(spiked / "store")) as store:
        incidents = attribute(store)
    assert [(i.incident_class, i.cause, i.step) for i in incidents] == [
        (IncidentClass.NUMERICS, Cause.DATA_CORRUPTION, SPIKE_STEP)], [i.summary for i in incidents]
    (incident,) = incidents
    assert incident.rule == "numerics-loss-divergence" and not incident.culprit_nodes

    # the local tier keeps only its newest two (both after the spike): the durable tier holds the
    # older ones
    catalog = CheckpointCatalog(
        [
            Tier(TierKind.LOCAL, str(spiked / "ckpt"), node="node-0"),
            Tier(TierKind.DURABLE, str(spiked / "durable")),
        ],
        job_id="spike-job",
    )
    newest = catalog.choose([], world_size=1)
    # a checkpoint holding the spike's update exists
    assert newest is not None and newest.step > SPIKE_STEP
    decision = DecisionPolicy(load_policy(), restore_chooser=catalog).decide(
        incident, job_nodes=["node-0"]
    )
    assert decision.action is Action.RESTART and decision.restore is not None, decision.reason
    assert decision.restore.skip_steps == (SPIKE_STEP,)
    assert decision.restore.step < SPIKE_STEP
    # the newest complete one from before it (a durable copy still running when the next was due is
    # skipped, so which steps the durable tier holds depends on the machine's speed)
    complete = {int(commit.parent.name.removeprefix("step-")) for tier in ("ckpt", "durable")
                for commit in (spiked / tier).rglob("step-*/_commit")}
    assert decision.restore.step == max(s for s in complete if s < SPIKE_STEP), sorted(complete)
