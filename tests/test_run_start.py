"""`faultlens run` says why a job failed to start (the first error line of the worker or agent log,
and the log's path) and that its GPU samples are simulated. The logs are real: a real `faultlens
run` with a typo in the script path, and real interpreters failing the ways a start fails (torch
missing, a syntax error, a bad import, an argparse error), their stderr laid out as torchrun writes
it."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

from faultlens.controller.cli.startup import first_error, start_failure_lines
from tests.faultlens_cli import cli_env, run_command


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A clean venv's interpreter: no torch, no faultlens."""
    root = tmp_path_factory.mktemp("bare") / "venv"
    venv.create(root, with_pip=False, system_site_packages=False)
    return str(root / "bin" / "python")


def _worker_log(attempt_dir: Path, local_rank: int) -> Path:
    path = (
        attempt_dir / "logs" / "node-0" / "none_abc" / "attempt_0" / str(local_rank) / "stderr.log"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_torch_missing_is_found_in_the_agent_log(tmp_path, bare_python):
    attempt = tmp_path / "attempt-0"
    attempt.mkdir()
    agent_log = attempt / "torchrun-node-0.stderr"
    with open(agent_log, "wb") as err:
        subprocess.run(
            [bare_python, "-m", "torch.distributed.run", "--nnodes=1", "train.py"],
            stderr=err,
            timeout=60,
        )
    found = first_error(attempt)
    assert found is not None and found.path == agent_log
    assert "No module named 'torch'" in found.line
    lines = start_failure_lines(tmp_path, 0)
    assert "failed to start" in lines[0] and str(agent_log) in lines[1]


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("def broken(:\n    pass\n", "SyntaxError"),
        ("import no_such_module_xyz\n", "No module named 'no_such_module_xyz'"),
        (
            "import argparse\nargparse.ArgumentParser(prog='train.py').parse_args(['--lr'])\n",
            "train.py: error:",
        ),
        (
            "raise RuntimeError('CUDA error: no kernel image is available')\n",
            "RuntimeError: CUDA error",
        ),
    ],
)
def test_first_error_of_a_worker_that_died_at_start(tmp_path, bare_python, script, expected):
    attempt = tmp_path / "attempt-0"
    source = tmp_path / "train.py"
    source.write_text(script)
    quiet = _worker_log(attempt, 0)  # a survivor torchrun killed: nothing in its log but the signal
    quiet.write_text("")
    log = _worker_log(attempt, 1)
    with open(log, "wb") as err:
        subprocess.run([bare_python, str(source)], stderr=err, timeout=60)
    (attempt / "torchrun-node-0.stderr").write_text(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n  traceback : To "
        "enable traceback\n")
    found = first_error(attempt)
    assert found is not None and found.path == log, found
    assert expected in found.line


def test_no_log_at_all_still_points_at_the_directory(tmp_path):
    (tmp_path / "attempt-2" / "logs").mkdir(parents=True)
    lines = start_failure_lines(tmp_path, 2)
    assert lines == ["attempt 2 ended before its first step; its logs: "
                     f"{tmp_path / 'attempt-2' / 'logs'}"]


def test_faultlens_run_with_a_typo_in_the_script_path(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run(
        run_command(
            tmp_path, nnodes=1, nproc=2, options=("--max-attempts", "1"), command=["trian.py"]
        ),
        cwd=tmp_path,
        env=cli_env(columns=80),
        capture_output=True,
        text=True,
        timeout=240,
    )
    # refused before launch (controller/supervisor/preflight.py): a job error naming no node, in
    # one line, and nothing started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "faultlens run: job error (no node to blame): the training script cannot run: "
        "trian.py: no such file"
    )
    assert proc.stdout == "" and not (tmp_path / "work").exists()
