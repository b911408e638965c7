"""docs/slurm.md works as written, end to end on the real Slurm cluster: its batch script
(`faultlens slurm run`, torchrun per node with srun) submitted with its sbatch command for a tiny
gloo DDP job on two nodes; one rank SIGKILLs itself; its `faultlens serve` with its hooks file
(the packaged Slurm hook and the Alertmanager pager) requeues the job excluding the culprit node;
the job finishes on the other nodes from its newest checkpoint, attempt 1 (SLURM_RESTART_COUNT).
The page's /shared is a temporary directory, its slurm.conf and Alertmanager the test cluster's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytest.importorskip("torch")
DOC = REPO_ROOT / "docs" / "slurm.md"
TRAIN = REPO_ROOT / "tests" / "slurm_jobs" / "ddp_train.py"


def example(name: str) -> str:
    """The fenced block right after `<!-- example: NAME -->` in docs/slurm.md."""
    match = re.search(
        rf"<!-- example: {re.escape(name)} -->\s*```\w*\n(.*?)\n```", DOC.read_text(), re.S
    )
    assert match, f"docs/slurm.md has no example {name!r}"
    return match.group(1)


def on_cluster(text: str, slurm, shared: Path) -> str:
    """The page's text for the test cluster: /shared, slurm.conf, Alertmanager, the script."""
    return (
        text.replace("/shared/", f"{shared}/")
        .replace("/etc/slurm/slurm.conf", str(slurm.conf))
        .replace("http://alertmanager:9093", slurm.alertmanager_url)
        .replace(" train.py", f" {TRAIN}")
    )


def cli_on_path(directory: Path) -> Path:
    """A `faultlens` command, as an install gives it."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "faultlens"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m faultlens.controller.cli.main "$@"\n')
    script.chmod(0o755)
    return directory


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s")


def test_the_page_sigkill_of_a_rank_requeues_excluding_its_node_and_the_job_finishes(
    slurm, tmp_path
):
    from tests.slurm_cluster import free_ports

    shared = tmp_path / "shared"
    (shared / "faultlens").mkdir(parents=True)
    work = tmp_path / "job"
    work.mkdir()
    bin_dir = cli_on_path(tmp_path / "bin")
    culprit = "node-1"
    (metrics_port,) = free_ports(1)
    (shared / "faultlens" / "hooks.yaml").write_text(on_cluster(example("hooks"), slurm, shared))
    batch = work / "train.sbatch"
    batch.write_text(on_cluster(example("sbatch"), slurm, shared) + "\n")
    env = {
        **slurm.env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO_ROOT),
        # the training script's own knobs: the job lands on node-0 and node-1 (the first idle
        # nodes); node-1's local rank 1 kills itself at step 12 of the first attempt
        "CKPT_DIR": str(work / "ckpt"),
        "DONE_FILE": str(work / "done.json"),
        "FAULT_FILE": str(work / "fault.txt"),
        "STEPS": "24",
        "CKPT_EVERY": "5",
        "STEP_S": "0.1",
        "DDP_TEST_FAULT": f"sigkill:{culprit}:1:12",
    }
    serve_cmd = (
        on_cluster(example("serve"), slurm, shared)
        .replace("9465", str(metrics_port))
        .replace("\\\n", " ")
    )
    serve = subprocess.Popen(
        [*serve_cmd.split(), "--interval", "0.5"],
        env=env,
        cwd=work,
        stdout=(work / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        submit = on_cluster(example("submit"), slurm, shared).split()
        out = subprocess.run(
            [*submit[:-1], "--parsable", str(batch)],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        job_id = out.stdout.strip().split(";")[0]
        fault_file = work / "fault.txt"
        wait_for(fault_file.exists, 180, "the fault")
        fault_ts = float(fault_file.read_text().split()[0])

        def requeued():
            assert serve.poll() is None, (work / "serve.log").read_text()[-3000:]
            return slurm.job(job_id)["Restarts"] == "1"

        wait_for(requeued, 180, "the requeue")
        action_s = time.time() - fault_ts
        record = slurm.wait_job(job_id, {"COMPLETED", "FAILED"}, timeout=240)
        output = "\n".join(p.read_text() for p in (shared / "faultlens").glob("*.out"))
        assert record["JobState"] == "COMPLETED", output[-3000:]
        resumed_s = float(json.loads((work / "done.json").read_text())["started"]) - fault_ts
        assert record["Restarts"] == "1" and record["ExcNodeList"] == culprit
        assert record["JobName"] == "llm-7b"
        done = json.loads((work / "done.json").read_text())
        assert done["attempt"] == 1 and culprit not in done["nodes"] and len(done["nodes"]) == 2
        assert done["start"] == 10  # the newest checkpoint before the fault at step 12
        node = slurm.node(culprit)
        assert "DRAIN" in node["State"] and "faultlens failover" in node["Reason"]
        # no healthy node drained
        assert [n for n in slurm.nodes if "DRAIN" in slurm.node(n)["State"]] == [culprit]
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        assert 'faultlens_serve_decisions_total{action="failover"} 1.0' in text
        assert 'faultlens_serve_deliveries_total{hook="slurm",status="delivered"} 1.0' in text
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    print(f"fault -> Slurm action: {action_s:.1f}s; fault -> training resumed: {resumed_s:.1f}s")
