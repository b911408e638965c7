"""End to end on the real Slurm cluster: `sbatch -N 2` of a tiny gloo DDP job launched by
`faultlens slurm run` (torchrun per node with srun); one rank SIGKILLs itself; the node task stores
torchrun's report; `faultlens serve` (follower, decider, deliverer) with the packaged Slurm hook
requeues the job excluding the culprit node; the job finishes on the other nodes from its newest
checkpoint, attempt 1 (SLURM_RESTART_COUNT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
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


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s")


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_sigkill_of_a_rank_requeues_excluding_its_node_and_the_job_finishes(slurm, tmp_path):
    from tests.slurm_cluster import free_ports

    work = tmp_path / "job"
    work.mkdir()
    culprit = "node-1"
    rdzv_port, metrics_port = free_ports(2)
    hooks = work / "hooks.yaml"
    hooks.write_text(
        textwrap.dedent(f"""\
        format_version: 1
        hooks:
          - {{type: slurm, name: slurm, state_dir: {work}/state, slurm_conf: {slurm.conf}}}
          - {{type: alertmanager, name: page, url: "{slurm.alertmanager_url}"}}
        """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SLURM_CONF": str(slurm.conf)}
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "serve",
            "--store",
            str(work / "store"),
            "--hooks",
            str(hooks),
            "--interval",
            "0.5",
            "--metrics-port",
            str(metrics_port),
        ],
        env=env,
        stdout=(work / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        # the job lands on node-0 and node-1 (the first idle nodes); node-1's local rank 1 dies
        script = batch_script(work, f"sigkill:{culprit}:1:12", rdzv_port)
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
        fault_file = work / "fault.txt"
        wait_for(fault_file.exists, 180, "the fault")
        fault_ts = float(fault_file.read_text().split()[0])

        def requeued():
            assert serve.poll() is None, (work / "serve.log").read_text()[-3000:]
            return slurm.job(job_id)["Restarts"] == "1"

        wait_for(requeued, 180, "the requeue")
        action_s = time.time() - fault_ts
        record = slurm.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=240)
        output = "\n".join(p.read_text() for p in work.glob("out-*.txt"))
        assert record["JobState"] == "COMPLETED", output[-3000:]
        assert record["Restarts"] == "1" and record["ExcNodeList"] == culprit
        done = json.loads((work / "done.json").read_text())
        assert done["attempt"] == 1 and culprit not in done["nodes"] and len(done["nodes"]) == 2
        assert done["start"] == 10  # the newest checkpoint before the fault at step 12
        node = slurm.node(culprit)
        assert "DRAIN" in node["State"] and "faultlens failover" in node["Reason"]
        # no healthy node drained
        assert [n for n in slurm.nodes if "DRAIN" in slurm.node(n)["State"]] == [culprit]
        text = metrics(metrics_port)
        assert 'faultlens_serve_decisions_total{action="failover"} 1.0' in text
        assert 'faultlens_serve_deliveries_total{hook="slurm",status="delivered"} 1.0' in text
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    print(f"fault -> Slurm action: {action_s:.1f}s")
