"""One torchrun agent per simulated node, on loopback: start, watch, stop.

Each node is a `python -m torch.distributed.run` process with its own node name (FAULTLENS_NODE), its own local
checkpoint tier, its own --log-dir, and its stderr in a file the process source reads. The agents of one attempt
rendezvous statically on 127.0.0.1:<port> (--nnodes N --node-rank i), so a lost node stops the whole attempt, as
on a real cluster without elastic membership.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class TorchrunAgent:
    """A running torchrun agent for one simulated node."""

    node: str
    node_rank: int
    process: subprocess.Popen
    stderr_path: Path
    log_dir: Path
    started_at: float
    exit_code: int | None = None
    exited_at: float | None = None
    stopped_by_us: bool = False

    def poll(self) -> int | None:
        if self.exit_code is None:
            code = self.process.poll()
            if code is not None:
                self.exit_code = code
                self.exited_at = time.monotonic()
        return self.exit_code


@dataclass(frozen=True)
class LaunchSpec:
    """What every agent of an attempt shares."""

    script: Sequence[str]  # the training command after torchrun's options: a path or `-m module`, then its args
    nnodes: int
    nproc_per_node: int
    master_port: int
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = sys.executable


def torchrun_command(spec: LaunchSpec, node_rank: int, log_dir: Path) -> list[str]:
    return [spec.python, "-m", "torch.distributed.run", f"--nnodes={spec.nnodes}",
            f"--nproc-per-node={spec.nproc_per_node}", f"--node-rank={node_rank}", "--master-addr=127.0.0.1",
            f"--master-port={spec.master_port}", "--max-restarts=0", f"--log-dir={log_dir}", "--redirects=3",
            "--tee=3", *spec.script]


def start_agent(spec: LaunchSpec, node: str, node_rank: int, node_env: Mapping[str, str]) -> TorchrunAgent:
    log_dir = spec.workdir / "logs" / node
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = spec.workdir / f"torchrun-{node}.stderr"
    env = {**os.environ, **spec.env, **node_env, "FAULTLENS_NODE": node, "PYTHONUNBUFFERED": "1"}
    with open(stderr_path, "wb") as stderr, open(spec.workdir / f"torchrun-{node}.stdout", "wb") as stdout:
        process = subprocess.Popen(torchrun_command(spec, node_rank, log_dir), env=env, stdout=stdout,
                                   stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True)
    return TorchrunAgent(node, node_rank, process, stderr_path, log_dir, time.monotonic())


def stop_agents(agents: Sequence[TorchrunAgent], grace_s: float = 5.0) -> None:
    """SIGTERM every agent's process group (torchrun forwards it to its workers), then SIGKILL stragglers."""
    for agent in agents:
        if agent.poll() is None:
            agent.stopped_by_us = True
            _signal_group(agent.process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for agent in agents:
        while agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    for agent in agents:
        if agent.poll() is None:
            _signal_group(agent.process, signal.SIGKILL)
            agent.process.wait(timeout=10)
            agent.poll()
        else:
            _signal_group(agent.process, signal.SIGKILL)  # workers left behind by an agent that exited


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
