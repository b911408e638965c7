"""Real torchrun jobs for the live-judgment tests: each simulated node is one torchrun agent (its
own node name, heartbeat directory and log dir, as `faultlens run` lays them out), watched by the
node-side collectors (process events from the agent's stderr and --log-dir, heartbeats) writing into
one store. The runner plays the supervisor's part of the process_events contract itself (kinds
`start`, `agent_exit`, `signal_sent`, source "supervisor"), from what it really saw of its agents.

    run_job(store, workdir, job_id=..., attempt=0, scenario="healthy", nodes=["node-0", "node-1"],
    nproc=2)

`kill` (optional) is called every tick with the job's heartbeats and may kill processes (a node
loss); `stop_at` (optional) tells when the runner stops the attempt itself (SIGTERM to every agent's
process group after writing signal_sent rows).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from faultlens.collectors.sources.agent import NodeAgent
from faultlens.collectors.sources.process_events import ProcessSource
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.schema import rows_to_table
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.heartbeat import HeartbeatSource, read_heartbeat

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "train_live.py"


@dataclass
class Agent:
    node: str
    process: subprocess.Popen
    heartbeat_dir: Path
    stderr: Path
    log_dir: Path
    exit_code: int | None = None
    killed: bool = False  # died by a signal this runner sent as a fault
    stopped: bool = False  # stopped by this runner as the supervisor


@dataclass
class AttemptResult:
    attempt: int
    nodes: tuple[str, ...]
    exit_codes: dict[str, int | None]
    events: list[str] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def heartbeat_pids(agent: Agent) -> dict[int, int]:
    """rank -> pid of the agent's workers, from their heartbeat records."""
    pids = {}
    for path in agent.heartbeat_dir.glob("hb-*.bin"):
        with contextlib.suppress(OSError, ValueError):
            beat = read_heartbeat(path)
            if beat.pid and beat.identity.get("rank") is not None:
                pids[int(beat.identity["rank"])] = beat.pid
    return pids


def heartbeat_step(agent: Agent) -> int:
    """The newest step any worker of the agent completed (-1: none yet)."""
    best = -1
    for path in agent.heartbeat_dir.glob("hb-*.bin"):
        with contextlib.suppress(OSError, ValueError):
            beat = read_heartbeat(path)
            if beat.last_step is not None:
                best = max(best, beat.last_step)
    return best


def _supervisor_row(sink: SegmentSink, **row: object) -> None:
    row.setdefault("ts", time.time_ns())
    sink.write("process_events", rows_to_table("process_events", [{"source": "supervisor", **row}]))
    sink.flush("process_events")


def run_job(
    store: Path,
    workdir: Path,
    *,
    job_id: str,
    attempt: int,
    scenario: str,
    nodes: Sequence[str],
    nproc: int,
    env: Mapping[str, str] | None = None,
    kill: Callable[[list[Agent]], str | None] | None = None,
    stop_at: Callable[[list[Agent]], bool] | None = None,
    timeout_s: float = 150.0,
) -> AttemptResult:
    workdir = workdir / f"attempt-{attempt}"
    workdir.mkdir(parents=True, exist_ok=True)
    sink = SegmentSink(str(store), flush_rows=10_000, flush_age_s=0.2)
    port = _free_port()
    agents: list[Agent] = []
    collectors: list[NodeAgent] = []
    base_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "FAULTLENS_STORE": str(store),
        "FAULTLENS_JOB_ID": job_id,
        "FAULTLENS_ATTEMPT": str(attempt),
        **(env or {}),
    }
    base_env.pop("FAULTLENS_FR_DIR", None)
    result = AttemptResult(attempt, tuple(nodes), {})
    for node_rank, node in enumerate(nodes):
        log_dir = workdir / "logs" / node
        log_dir.mkdir(parents=True, exist_ok=True)
        beats = workdir / "heartbeats" / node
        stderr = workdir / f"torchrun-{node}.stderr"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(nodes)}",
            f"--nproc-per-node={nproc}",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "--max-restarts=0",
            "--monitor-interval=0.5",
            f"--log-dir={log_dir}",
            "--redirects=3",
            "--tee=3",
            str(SCRIPT),
            scenario,
        ]
        with open(stderr, "wb") as err, open(workdir / f"torchrun-{node}.stdout", "wb") as out:
            process = subprocess.Popen(
                command,
                env={**base_env, "FAULTLENS_NODE": node, "FAULTLENS_HEARTBEAT_DIR": str(beats)},
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        agents.append(Agent(node, process, beats, stderr, log_dir))
        identity = NodeIdentity(node=node, job_id=job_id, attempt=attempt)
        source = ProcessSource(identity, paths=[stderr, log_dir])
        collectors.append(
            NodeAgent(
                [source, HeartbeatSource(beats, identity, min_interval_s=0.0, keepalive_s=0.5)],
                sink,
                interval_s=0.2,
            )
        )
        _supervisor_row(
            sink, kind="start", node=node, job_id=job_id, attempt=attempt, pid=process.pid
        )
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            for collector in collectors:
                collector.tick()
            stop.wait(0.2)

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for agent in agents:
                if agent.exit_code is None and agent.process.poll() is not None:
                    agent.exit_code = agent.process.returncode
                    died_by = -agent.exit_code if agent.exit_code < 0 else None
                    _supervisor_row(
                        sink,
                        kind="agent_exit",
                        node=agent.node,
                        job_id=job_id,
                        attempt=attempt,
                        exit_code=None if died_by else agent.exit_code,
                        signal=signal.Signals(died_by).name if died_by else None,
                        pid=agent.process.pid,
                        message=f"torchrun agent exited ({agent.exit_code})",
                    )
            if all(a.exit_code is not None for a in agents):
                break
            if kill is not None:
                said = kill(agents)
                if said:
                    result.events.append(said)
                    kill = None
            if stop_at is not None and stop_at(agents):
                stop_at = None
                for agent in agents:
                    if agent.exit_code is None:
                        agent.stopped = True
                        _supervisor_row(
                            sink,
                            kind="signal_sent",
                            node=agent.node,
                            job_id=job_id,
                            attempt=attempt,
                            pid=agent.process.pid,
                            signal="SIGTERM",
                            message="stopping the attempt (test supervisor)",
                        )
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(agent.process.pid, signal.SIGTERM)
                        for pid in heartbeat_pids(agent).values():  # workers in their own session
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGTERM)
                result.events.append("stopped by the test supervisor")
            time.sleep(0.1)
        else:
            result.events.append("timed out")
    finally:
        for agent in agents:
            if agent.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.process.pid, signal.SIGKILL)
                agent.process.wait()
            for pid in heartbeat_pids(agent).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        stop.set()
        thread.join(timeout=10)
        for collector in collectors:
            collector.tick()
        sink.flush()
        sink.close()
    result.exit_codes = {a.node: a.exit_code for a in agents}
    return result


def kill_node_at(node: str, step: int, *, agent_only: bool = False,
                 workers: int | None = None) -> Callable[[list[Agent]], str | None]:
    """A fault: once `node`'s workers completed `step`, SIGKILL its agent (and its workers, unless
    agent_only).
    workers: SIGKILL only that many of them (lowest ranks first) with the agent; the rest of the
    node then dies of its lost node-mates, unwatched (a node that goes process by process: its last
    ranks echo the loss, and no agent reports how they ended)."""

    def kill(agents: list[Agent]) -> str | None:
        agent = next(a for a in agents if a.node == node)
        if heartbeat_step(agent) < step:
            return None
        pids = heartbeat_pids(agent)
        agent.killed = True
        os.kill(agent.process.pid, signal.SIGKILL)
        doomed = [] if agent_only else [pids[rank] for rank in sorted(pids)][:workers]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        what = (
            ""
            if agent_only
            else " and workers"
            if len(doomed) == len(pids)
            else f" and {len(doomed)} worker(s)"
        )
        return f"{node}: SIGKILL agent{what} at step {step} ({dt.datetime.now(dt.UTC).isoformat()})"

    return kill
