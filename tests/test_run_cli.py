"""`faultlens run` supervises a healthy job to completion and says so; bad invocations are one-line
errors.
"""

import os
import subprocess
import sys

import pytest

from faultlens.attribution.reading.store import Store
from tests.conftest import REPO_ROOT

pytest.importorskip("torch")


def test_run_completes_a_healthy_job(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "run",
            "--store",
            str(tmp_path / "store"),
            "--workdir",
            str(tmp_path / "work"),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--job",
            "healthy",
            "--",
            "-m",
            "faultlens.controller.demo.train",
            "--steps",
            "12",
            "--step-sleep",
            "0.01",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "training completed" in proc.stdout
    with Store(tmp_path / "store") as store:
        steps = store.query("SELECT rank, max(step) AS last FROM steps WHERE job_id = 'healthy' "
                            "AND phase = 'train' "
                            "GROUP BY rank ORDER BY rank").to_pylist()
        assert store.query("SELECT count(*) AS n FROM incidents").to_pylist() == [{"n": 0}]
    assert steps == [{"rank": 0, "last": 11}, {"rank": 1, "last": 11}]


def test_run_without_a_command_is_a_one_line_error(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "1",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(
        "faultlens run: error: give the training command after --"
    )
