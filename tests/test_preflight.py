"""A job that cannot start is not a node failure (controller/supervisor/preflight.py): the checks
before launch on real files (exists, compiles with py_compile, `-m` modules found without importing
them), and the judgment of a start that failed on every node from worker logs real interpreters
wrote (laid out as torchrun --log-dir writes them) and a real torchrun's report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultlens.controller.supervisor.preflight import check_command, job_start_error
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize(
    ("name", "source", "expected"),
    [
        ("train.py", None, "train.py: no such file"),
        (
            "syntax.py",
            "import os\ndef main(:\n    pass\n",
            "syntax.py: SyntaxError: invalid syntax",
        ),
        ("indent.py", "def main():\nreturn 1\n", "indent.py: IndentationError"),
        ("tabs.py", "if True:\n\tx = 1\n        y = 2\n", "TabError"),
        ("nul.py", "x = 1\x00\n", "nul.py: SyntaxError"),
    ],
)
def test_a_script_that_cannot_run_is_found_before_launch(tmp_path, name, source, expected):
    if source is not None:
        (tmp_path / name).write_text(source)
    problem = check_command([name, "--lr", "0.1"], tmp_path)
    assert problem is not None and problem.error.startswith(name.split(".")[0])
    assert expected in problem.error
    assert "\n" not in problem.error  # one line


def test_a_directory_is_not_a_script(tmp_path):
    (tmp_path / "train").mkdir()
    assert check_command(["train"], tmp_path).error == "train: not a file"


def test_scripts_that_compile_pass(tmp_path):
    (tmp_path / "ok.py").write_text("print('start')\nimport no_such_module_at_runtime\n")
    # an import after another statement is the script's at run time (judged after the start)
    assert check_command(["ok.py"], tmp_path) is None
    assert check_command([str(REPO_ROOT / "controller/lab/jobs/ddp_train.py")], tmp_path) is None
    assert check_command(["-m", "faultlens.controller.demo.train", "--steps", "3"]) is None
    assert check_command(["-m", "json.tool"]) is None


def test_modules_are_found_without_importing_them(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    # importing it would fail: the check must not import
    (package / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (package / "train.py").write_text("print('train')\n")
    (package / "broken.py").write_text("def f(:\n")
    assert check_command(["-m", "mypkg.train"], tmp_path) is None
    assert "SyntaxError" in check_command(["-m", "mypkg.broken"], tmp_path).error
    # not on the file system: looked up as python -m would, whose import of mypkg fails
    assert "imported!" in check_command(["-m", "mypkg.nope"], tmp_path).error
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "__init__.py").write_text("")
    missing = check_command(["-m", "other.nope"], tmp_path)
    assert missing.error == "-m other.nope: No module named 'other.nope'"
    assert "cannot be directly executed" in check_command(["-m", "mypkg"], tmp_path).error
    assert "No module named" in check_command(["-m", "no_such_top_level_xyz"], tmp_path).error


def _worker_log(attempt: Path, node: str, local_rank: int) -> Path:
    path = attempt / "logs" / node / "none_x1" / "attempt_0" / str(local_rank) / "stderr.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _fail(script: Path, log: Path) -> None:
    with open(log, "wb") as err:
        subprocess.run([sys.executable, str(script)], stderr=err, timeout=60, check=False)


def test_the_same_error_on_every_node_is_the_jobs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import json\nconfig = json.loads('{}')\nconfig['model']['hidden']\n")
    attempt = tmp_path / "attempt-0"
    for node in ("node-0", "node-1"):
        _fail(script, _worker_log(attempt, node, 0))
        _worker_log(attempt, node, 1).write_text("")  # a sibling torchrun stopped: silent
    error = job_start_error(attempt, ["node-0", "node-1"])
    assert error is not None and error.error == "KeyError: 'model'"
    assert error.stderr[0].startswith("Traceback") and error.stderr[-1] == "KeyError: 'model'"


def test_one_nodes_own_error_is_not_the_jobs(tmp_path):
    broken = tmp_path / "gpu.py"
    broken.write_text("raise RuntimeError('CUDA error: uncorrectable ECC error encountered')\n")
    echo = tmp_path / "echo.py"
    echo.write_text("raise RuntimeError('Connection closed by peer [127.0.0.1]:29500')\n")
    attempt = tmp_path / "attempt-0"
    _fail(broken, _worker_log(attempt, "node-0", 0))
    _fail(echo, _worker_log(attempt, "node-1", 0))
    assert job_start_error(attempt, ["node-0", "node-1"]) is None
    # a node whose ranks wrote nothing (killed): not known to share the error
    attempt2 = tmp_path / "attempt-1"
    _fail(broken, _worker_log(attempt2, "node-0", 0))
    _worker_log(attempt2, "node-1", 0).write_text("")
    assert job_start_error(attempt2, ["node-0", "node-1"]) is None


def test_a_silent_exit_is_judged_by_torchruns_report(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "quiet.py"
    script.write_text("import sys\nsys.exit(3)\n")
    attempt = tmp_path / "attempt-0"
    attempt.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(attempt / "torchrun-node-0.stderr", "wb") as err:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=1",
                "--nproc-per-node=2",
                f"--log-dir={attempt / 'logs' / 'node-0'}",
                "--redirects=3",
                str(script),
            ],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env=env,
            timeout=120,
            check=False,
        )
    error = job_start_error(attempt, ["node-0"])
    assert error is not None and "exited with code 3" in error.error
