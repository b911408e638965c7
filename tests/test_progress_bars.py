"""Progress bars on long commands: on a terminal they draw on stderr; in a pipe or log file they
print nothing.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

from faultlens.controller.cli.main import main
from tests.conftest import REPO_ROOT

SIM = [
    "simulate",
    "--nodes",
    "2",
    "--gpus-per-node",
    "2",
    "--hours",
    "1",
    "--faults-per-day",
    "150",
]


def test_quiet_when_not_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FAULTLENS_PROGRESS", raising=False)
    assert main([*SIM, "--store", str(tmp_path / "s")]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "simulated 1 h" in captured.out
    assert main(["attribute", "--store", str(tmp_path / "s"), "--dry-run", "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_bar_on_a_terminal(tmp_path):
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "100", "TERM": "xterm"}
    env.pop("FAULTLENS_PROGRESS", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            *SIM,
            "--store",
            str(tmp_path / "s"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        cwd=REPO_ROOT,
        env=env,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0
    os.close(master)
    assert b"simulating 1 h on 2 nodes" in seen
