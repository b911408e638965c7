"""One torchrun agent per simulated node, on loopback: start, watch, stop.

Each node is a `python -m torch.distributed.run` process with its own node name (FAULTLENS_NODE),
its own local checkpoint tier, its own --log-dir, and its stderr in a file the process source reads.
The agents of one attempt rendezvous statically on 127.0.0.1:<port> (--nnodes N --node-rank i), so a
lost node stops the whole attempt, as on a real cluster without elastic membership.

torchrun (2.13) starts each worker in its own session: a signal to the agent's process group never
reaches them. Each agent therefore carries a WorkerTracker, and stopping an attempt ends the workers
too, by pid. Every signal sent here is recorded first (signal_sent) when a recorder is given.
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

from faultlens.controller.supervisor.processes import (
    EventRecorder,
    WorkerTracker,
    group_exists,
    signal_name,
)


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
    attempt: int = 0
    tracker: WorkerTracker | None = None
    exit_recorded: bool = False

    @property
    def pid(self) -> int:
        return int(self.process.pid)

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

    # the training command after torchrun's options: a path or `-m module`, then its args
    script: Sequence[str]
    nnodes: int
    nproc_per_node: int
    master_port: int
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = sys.executable


def torchrun_command(spec: LaunchSpec, node_rank: int, log_dir: Path) -> list[str]:
    return [
        spec.python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={spec.nnodes}",
        f"--nproc-per-node={spec.nproc_per_node}",
        f"--node-rank={node_rank}",
        "--master-addr=127.0.0.1",
        f"--master-port={spec.master_port}",
        "--max-restarts=0",
        f"--log-dir={log_dir}",
        "--redirects=3",
        "--tee=3",
        *spec.script,
    ]


def start_agent(spec: LaunchSpec, node: str, node_rank: int, node_env: Mapping[str, str],
                attempt: int = 0) -> TorchrunAgent:
    log_dir = spec.workdir / "logs" / node
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = spec.workdir / f"torchrun-{node}.stderr"
    env = {**os.environ, **spec.env, **node_env, "FAULTLENS_NODE": node, "PYTHONUNBUFFERED": "1"}
    with (
        open(stderr_path, "wb") as stderr,
        open(spec.workdir / f"torchrun-{node}.stdout", "wb") as stdout,
    ):
        process = subprocess.Popen(
            torchrun_command(spec, node_rank, log_dir),
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return TorchrunAgent(
        node,
        node_rank,
        process,
        stderr_path,
        log_dir,
        time.monotonic(),
        attempt=attempt,
        tracker=WorkerTracker(process.pid, node, attempt),
    )


def stop_agents(
    agents: Sequence[TorchrunAgent],
    grace_s: float = 5.0,
    *,
    recorder: EventRecorder | None = None,
    reason: str = "the supervisor stops the attempt",
) -> None:
    """SIGTERM every live agent's process group (torchrun forwards it to its workers), then SIGKILL
    what is left after `grace_s`: agents, and workers by pid (their own sessions). Each signal is
    recorded before it is sent."""
    for agent in agents:
        if agent.tracker is not None and agent.poll() is None:
            agent.tracker.refresh()
    for agent in agents:
        if agent.poll() is None:
            agent.stopped_by_us = True
            signal_group(agent, signal.SIGTERM, recorder, reason)
    deadline = time.monotonic() + grace_s
    for agent in agents:
        while agent.poll() is None and time.monotonic() < deadline:
            if agent.tracker is not None:
                agent.tracker.refresh()
            time.sleep(0.05)
    for agent in agents:
        if agent.poll() is None:
            signal_group(agent, signal.SIGKILL, recorder, f"{reason}: the agent did not stop "
                                                          f"within {grace_s:.0f} s")
            agent.process.wait(timeout=10)
            agent.poll()
        elif group_exists(agent.pid):  # processes left in the agent's own group after it exited
            signal_group(agent, signal.SIGKILL, recorder, f"{reason}: processes left behind by the "
                                                          "agent")
    for agent in agents:
        kill_workers(agent, recorder, f"{reason}: workers left behind by the agent")


def kill_workers(agent: TorchrunAgent, recorder: EventRecorder | None, reason: str) -> list[int]:
    """SIGKILL the agent's workers that are still alive (an agent that died leaves them running)."""
    if agent.tracker is None:
        return []
    if recorder is None:
        recorder = _NullRecorder()
    sent = agent.tracker.kill(recorder, reason)
    if sent:
        agent.tracker.wait_gone(5.0)
    return sent


def signal_group(
    agent: TorchrunAgent, signum: int, recorder: EventRecorder | None, reason: str
) -> None:
    if recorder is not None:
        recorder.signal_sent(
            node=agent.node,
            attempt=agent.attempt,
            pid=agent.pid,
            signal=signal_name(signum),
            message=f"{reason} (to the agent's process group)",
        )
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(agent.pid, signum)


class _NullRecorder:
    def signal_sent(self, **_: object) -> dict:
        return {}
