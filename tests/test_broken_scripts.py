"""Broken scripts as users write them (issue 33): each a real `faultlens run` on 2 simulated nodes x
2 ranks (torchrun, loopback) whose every rank fails the same way before step 0. Each is a job error
naming no node: rc 1, the script's own error line and its stderr shown, no incident acted on, no
decision, no node excluded.

Shapes: exit 1 at once after a message, `raise` at top level, an ImportError of a missing module
inside main() (found only at run time: the pre-launch check reads the leading imports), argparse
refusing a missing argument (exit 2), an assert on an environment variable, a data file that is
not there. None imports torch (seconds each: the cost is torchrun's own start); the timing figures
are bench/bench_restart.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.faultlens_cli import cli_env, run_command

SHAPES = {
    "exit-1": (
        "import sys\n\nprint('reading cfg/train.yaml', file=sys.stderr)\n"
        "print('config not found: cfg/train.yaml', file=sys.stderr)\nsys.exit(1)\n",
        "config not found: cfg/train.yaml",
    ),
    "raise-top-level": (
        "import os\n\nWORLD = int(os.environ['WORLD_SIZE'])\n"
        "raise RuntimeError(f'this model needs 8 ranks, got {WORLD}')\n",
        "RuntimeError: this model needs 8 ranks, got 4",
    ),
    "import-in-main": (
        "import os\n\n\ndef main():\n    from apex.normalization import FusedLayerNorm\n\n"
        "    print(FusedLayerNorm, os.getpid())\n\n\nif __name__ == '__main__':\n    main()\n",
        "ModuleNotFoundError: No module named 'apex'",
    ),
    "argparse-exit-2": (
        "import argparse\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, required=True)\nargs = parser.parse_args()\n",
        "error: the following arguments are required: --lr",
    ),
    "assert-env": (
        "import os\n\nassert os.environ.get('DATA_DIR'), 'set DATA_DIR to the dataset'\n",
        "AssertionError: set DATA_DIR to the dataset",
    ),
    "missing-data-file": (
        "import json\n\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n"
        "\n\nmeta = load('data/meta.json')\n",
        "FileNotFoundError: [Errno 2] No such file or directory: 'data/meta.json'",
    ),
}


def _env() -> dict[str, str]:
    env = cli_env()
    env.pop("DATA_DIR", None)
    return env


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_broken_script_is_a_job_error_naming_no_node(tmp_path, shape):
    pytest.importorskip("torch")
    source, error = SHAPES[shape]
    script = tmp_path / "train.py"
    script.write_text(source)
    store = tmp_path / "store"
    proc = subprocess.run(
        run_command(tmp_path, nnodes=2, nproc=2, job=shape, command=["train.py"]),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,  # a bound, not a figure: the machine may be loaded
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    verdicts = [line for line in proc.stderr.splitlines() if "job error (no node to blame)" in line]
    assert verdicts and error in verdicts[-1], out[-3000:]
    shown = [line for line in out.splitlines() if "  | " in line]
    assert any(error in line for line in shown), out[-3000:]  # the script's own stderr, shown
    assert "attempt 1" not in out and "decision:" not in out and "failover" not in out
    assert "excluded" not in out
    _assert_nothing_decided(store, shape)


def _assert_nothing_decided(store: Path, job: str) -> None:
    from faultlens.attribution.reading.store import Store

    with Store(store) as reader:
        decided = reader.query(
            "SELECT count(*) AS n FROM decisions WHERE job_id = ?", [job]
        ).to_pylist()
    assert decided[0]["n"] == 0
