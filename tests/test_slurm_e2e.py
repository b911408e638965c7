"""End to end on the real Slurm cluster: `sbatch -N 2` of a tiny gloo DDP job launched by
`faultlens slurm run` (torchrun per node with srun); one rank SIGKILLs itself; the node task stores
torchrun's report; `faultlens attribute` and `faultlens decide` with the shipped Slurm hook kind
requeue the job excluding the culprit node; the job finishes on the other nodes from its newest
checkpoint, attempt 1 (SLURM_RESTART_COUNT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytest.importorskip("torch")
TRAIN = REPO_ROOT / "tests" / "slurm_jobs" / "ddp_train.py"


def faultlens(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def batch_script(work: Path, fault: str, port: int) -> Path:
    script = work / "train.sbatch"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        export PYTHONPATH={REPO_ROOT}
        export CKPT_DIR={work}/ckpt DONE_FILE={work}/done.json FAULT_FILE={work}/fault.txt
        export STEPS=24 CKPT_EVERY=5 STEP_S=0.1 FAULTLENS_TEST_FAULT={fault}
        exec {sys.executable} -m faultlens.controller.cli.main slurm run --store {work}/store \\
            --state-dir {work}/state --nproc-per-node 2 --work-dir {work}/logs \\
            --rdzv-port {port} -- {TRAIN}
        """)
    )
    return script


def test_sigkill_of_a_rank_requeues_excluding_its_node_and_the_job_finishes(slurm, tmp_path):
    from tests.slurm_cluster import free_ports

    work = tmp_path / "job"
    work.mkdir()
    culprit = "node-1"
    # the job lands on node-0 and node-1 (the first idle nodes); node-1's local rank 1 dies
    script = batch_script(work, f"sigkill:{culprit}:1:12", free_ports(1)[0])
    job_id = slurm.sbatch(
        script,
        "-J",
        "e2e-llm",
        "-N",
        "2",
        "--requeue",
        "-o",
        str(work / "out-%j.txt"),
        "--open-mode=append",
    )
    record = slurm.wait_job(job_id, {"FAILED", "COMPLETED"}, timeout=180)
    output = "\n".join(p.read_text() for p in work.glob("out-*.txt"))
    assert record["JobState"] == "FAILED", output[-3000:]
    assert culprit in slurm.run("scontrol", "show", "hostnames", record["NodeList"])
    fault_ts = float((work / "fault.txt").read_text().split()[0])

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SLURM_CONF": str(slurm.conf)}
    attributed = faultlens("attribute", "--store", str(work / "store"), "--json", env=env)
    assert attributed.returncode == 0, attributed.stderr
    hooks = work / "hooks.yaml"
    hooks.write_text(
        textwrap.dedent(f"""\
        format_version: 1
        hooks:
          - {{type: slurm, name: slurm, state_dir: {work}/state, slurm_conf: {slurm.conf}}}
          - {{type: alertmanager, name: page, url: "{slurm.alertmanager_url}"}}
        """)
    )
    decided = faultlens(
        "decide", "--store", str(work / "store"), "--hooks", str(hooks), "--json", env=env
    )
    assert decided.returncode == 0, decided.stderr
    action_s = time.time() - fault_ts
    (decision,) = json.loads(decided.stdout)
    assert decision["action"] == "failover", decision
    excluded = decision["exclude_nodes"]
    assert (json.loads(excluded) if isinstance(excluded, str) else excluded) == [culprit]

    node = slurm.node(culprit)
    assert "DRAIN" in node["State"] and "faultlens failover" in node["Reason"]
    record = slurm.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=240)
    output = "\n".join(p.read_text() for p in work.glob("out-*.txt"))
    assert record["JobState"] == "COMPLETED", output[-3000:]
    assert record["Restarts"] == "1" and culprit in record["ExcNodeList"]
    done = json.loads((work / "done.json").read_text())
    assert done["attempt"] == 1 and culprit not in done["nodes"] and len(done["nodes"]) == 2
    assert done["start"] == 10  # the newest checkpoint before the fault at step 12
    # no healthy node drained
    drained = [n for n in slurm.nodes if "DRAIN" in slurm.node(n)["State"]]
    assert drained == [culprit]
    print(f"fault -> Slurm action: {action_s:.1f}s")
