"""Broken scripts are job errors in seconds (issue 33; controller/supervisor/preflight.py and
watch.py):

- a module the script imports first that exists nowhere is refused before launch, with its line,
  as Python would say it; imports the check cannot be sure of (after a sys.path change, after a
  module of the script's own directory, in a try) are left to the start judgment;
- a node's start is over as soon as torchrun's failure report for it is complete (a real torchrun's
  stderr), not when its agent has finished tearing down; a report still being written is not;
- end to end, a real `faultlens run` of a script that exits 1 at once on every rank: a job error
  naming no node, the script's own stderr shown, rc 1, no decision, nothing excluded; its job
  state is failed at once (its agents stopped by the supervisor), not running.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faultlens.controller.supervisor.preflight import check_command, node_start_over
from tests.faultlens_cli import cli_env, job_state, run_command


def _env() -> dict[str, str]:
    return cli_env()


@pytest.mark.parametrize(
    ("source", "line", "missing"),
    [
        ("import torch\nimport no_such_package_xyz\n", 2, "no_such_package_xyz"),
        ('"""Train."""\nimport os, json\nfrom apex.optimizers import FusedAdam\n', 3, "apex"),
        ("from __future__ import annotations\nimport nvidia_dali.fn as fn\n", 2, "nvidia_dali"),
        ("import no_pkg_xyz.sub.mod\n", 1, "no_pkg_xyz"),
    ],
)
def test_a_leading_import_found_nowhere_is_refused_before_launch(tmp_path, source, line, missing):
    (tmp_path / "train.py").write_text(source)
    problem = check_command(["train.py", "--lr", "0.1"], tmp_path)
    assert problem is not None
    assert problem.error == (
        f"train.py: line {line}: ModuleNotFoundError: No module named '{missing}'"
    )
    assert problem.stderr == (source.splitlines()[line - 1],)


@pytest.mark.parametrize(
    "source",
    [
        # the path changes first: the module may be found then
        "import sys\nsys.path.insert(0, '/opt/libs')\nimport no_such_package_xyz\n",
        # a module of the script's own directory may change the path when imported
        "import _paths\nimport no_such_package_xyz\n",
        # an optional dependency
        "try:\n    import no_such_package_xyz\nexcept ImportError:\n    pass\n",
        # imported late, or only on one branch
        "def main():\n    import no_such_package_xyz\n",
        "import os\nif os.environ.get('X'):\n    import no_such_package_xyz\n",
        # everything there: stdlib, builtins, site-packages, a namespace of this repo's path
        "import os, sys, time, _thread\nimport torch.distributed as dist\nimport yaml\n",
    ],
)
def test_imports_the_check_cannot_be_sure_of_pass(tmp_path, source):
    (tmp_path / "_paths.py").write_text("import sys\nsys.path.insert(0, '/opt/libs')\n")
    (tmp_path / "train.py").write_text(source)
    assert check_command(["train.py"], tmp_path) is None


def test_a_module_next_to_the_script_is_found(tmp_path):
    (tmp_path / "model_def.py").write_text("X = 1\n")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("")
    (tmp_path / "train.py").write_text("import model_def\nfrom utils import x\n")
    assert check_command(["train.py"], tmp_path) is None


def _torchrun(tmp_path: Path, script: Path, nproc: int) -> Path:
    """A real torchrun of `script`, its stderr where the supervisor keeps a node's."""
    stderr = tmp_path / "torchrun-node-0.stderr"
    with open(stderr, "wb") as err:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=1",
                f"--nproc-per-node={nproc}",
                "--max-restarts=0",
                f"--log-dir={tmp_path / 'logs'}",
                "--redirects=3",
                str(script),
            ],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env=_env(),
            timeout=120,
            check=False,
        )
    return stderr


def test_a_nodes_start_is_over_when_torchruns_report_is_complete(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nprint('config not found: cfg.yaml', file=sys.stderr)\nsys.exit(1)\n"
    )
    stderr = _torchrun(tmp_path, script, 2)
    assert node_start_over(stderr)
    text = stderr.read_text()
    # being written: the report cut before its closing line, or only the agent's first line
    cut = tmp_path / "cut.stderr"
    cut.write_text(text.rstrip().rsplit("\n", 1)[0] + "\n")
    assert not node_start_over(cut)
    first = next(line for line in text.splitlines() if "failed (exitcode: 1)" in line)
    cut.write_text(first + "\n")
    assert not node_start_over(cut)
    # a torchrun that is starting, and no file at all
    cut.write_text("*****\nSetting OMP_NUM_THREADS environment variable for each process\n")
    assert not node_start_over(cut)
    assert not node_start_over(tmp_path / "none.stderr")


def test_a_script_exiting_1_at_once_is_a_job_error_naming_no_node(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nprint('loading ./cfg.yaml', file=sys.stderr)\n"
        "print('config not found: ./cfg.yaml', file=sys.stderr)\nsys.exit(1)\n"
    )
    proc = subprocess.run(
        run_command(tmp_path, nnodes=2, nproc=1, job="exit1", command=[str(script)]),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "job error (no node to blame)" in out and "config not found: ./cfg.yaml" in out
    assert "  | loading ./cfg.yaml" in out  # the script's own stderr, shown
    assert "attempt 1" not in out and "failover" not in out and "decision:" not in out
    from faultlens.attribution.reading.store import Store

    with Store(tmp_path / "store") as store:
        made = store.query("SELECT count(*) AS n FROM decisions").to_pylist()
    assert made[0]["n"] == 0
    assert job_state(tmp_path / "store", "exit1") == "failed"


def test_a_job_error_judged_before_torchruns_teardown_is_failed_not_running():
    import datetime as dt

    from faultlens.attribution.goodput.jobstate import AgentExit, JobState, judge_job_state

    now = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)

    def judge(exits):
        return judge_job_state(
            last_attempt=0,
            last_ts=now,
            exits=exits,
            launched={0: {"node-0", "node-1"}},
            incidents=[],
            decisions=[],
            now=now,
            running_within_s=120.0,
        )

    # the supervisor stopped both agents (SIGTERM: no exit code) once every rank had failed
    stopped = [AgentExit(0, "node-0", None, True), AgentExit(0, "node-1", None, True)]
    assert judge(stopped) is JobState.FAILED
    # one node's agent still running, the other exited 0 by itself: still running
    assert judge([AgentExit(0, "node-0", 0, False)]) is JobState.RUNNING
