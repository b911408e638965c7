"""`faultlens slurm run` inside a real sbatch job: each rank gets faultlens' identity from Slurm's
(job name, SLURM_RESTART_COUNT, SLURMD_NODENAME) and the restore point the Slurm hook kept for the
job, on every node."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from faultlens.attribution.decision import Action, Restore
from faultlens.controller.hooks import SlurmHook
from faultlens.controller.slurm.launch import SlurmIdentity, SlurmLaunchError
from tests.conftest import REPO_ROOT
from tests.test_slurm_hook import decision

SHOW = REPO_ROOT / "tests" / "slurm_jobs" / "show_env.py"


def test_identity_and_restore_reach_every_rank_after_a_failover(slurm, tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "job.sbatch"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then sleep 600; fi
        export PYTHONPATH={REPO_ROOT} ENV_FILE={tmp_path}/env
        exec {sys.executable} -m faultlens.controller.cli.main slurm run --store {tmp_path}/store \\
            --state-dir {tmp_path}/state --work-dir {tmp_path}/logs --nproc-per-node 1 -- {SHOW}
        """)
    )
    job_id = slurm.sbatch(
        script,
        "-J",
        "id-job",
        "-N",
        "2",
        "--requeue",
        "-o",
        str(tmp_path / "out-%j.txt"),
        "--open-mode=append",
    )
    nodes = slurm.run(
        "scontrol", "show", "hostnames", slurm.wait_job(job_id, {"RUNNING"})["NodeList"]
    ).split()
    hook = SlurmHook(tmp_path / "state", slurm_env={"SLURM_CONF": str(slurm.conf)})
    dec = decision(
        1,
        Action.FAILOVER,
        job="id-job",
        nodes=(nodes[0],),
        restore=Restore("durable", 40, "s3://ckpt/id-job/step-40"),
    )
    hook.deliver(dec, dec.to_json())
    # the job was running; the new run starts at once, not after Slurm's 120 s requeue delay
    record = slurm.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=120)
    output = "\n".join(p.read_text() for p in tmp_path.glob("out-*.txt"))
    assert record["JobState"] == "COMPLETED", output[-3000:]
    ran_on = slurm.run("scontrol", "show", "hostnames", record["NodeList"]).split()
    seen = [json.loads((tmp_path / f"env.{rank}").read_text()) for rank in (0, 1)]
    assert sorted(s["FAULTLENS_NODE"] for s in seen) == sorted(ran_on)
    assert nodes[0] not in ran_on
    for env in seen:
        assert env == {
            **env,
            "FAULTLENS_JOB_ID": "id-job",
            "FAULTLENS_ATTEMPT": "1",
            "FAULTLENS_RESTORE_TIER": "durable",
            "FAULTLENS_RESTORE_STEP": "40",
            "FAULTLENS_RESTORE_URI": "s3://ckpt/id-job/step-40",
            "FAULTLENS_RESTORE_DECISION": dec.decision_id,
        }


def test_outside_a_slurm_job_the_launcher_says_so():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    with pytest.raises(SlurmLaunchError, match="not inside a Slurm job: SLURM_JOB_ID"):
        SlurmIdentity.from_env(env)


def test_identity_from_slurms_variables():
    ident = SlurmIdentity.from_env(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_NAME": "llm-7b",
            "SLURM_JOB_NODELIST": "node-[2-3]",
            "SLURM_RESTART_COUNT": "3",
            "SLURMD_NODENAME": "node-3",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NODEID": "1",
        }
    )
    assert (ident.job_id, ident.attempt, ident.node, ident.nnodes, ident.node_rank) == (
        "llm-7b",
        3,
        "node-3",
        2,
        1,
    )
    assert ident.env_vars() == {
        "FAULTLENS_JOB_ID": "llm-7b",
        "FAULTLENS_ATTEMPT": "3",
        "FAULTLENS_NODE": "node-3",
    }
