"""What the supervisor does to processes, recorded before it is done: agent exits and the signals it
sends.

- `EventRecorder` writes process_events rows of source "supervisor" straight into the store (flushed
  at once): `agent_exit` when a torchrun agent exits, `signal_sent` just BEFORE the supervisor
  signals any process, so a death by that signal is never read as a primary failure
  (collectors/sources/process_events/rows.py, SupervisorKind).
- `WorkerTracker` knows the worker processes of one agent. torchrun (2.13) starts every worker in
  its own session, so signalling the agent's process group never reaches them, and an agent that
  dies leaves them training unwatched. The tracker records the agent's descendants while it lives
  and adds the pids the ranks table names for the node (checked against the process's own
  environment, so a reused pid is never hit), and kills what is left when the agent is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal as signal_module
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from faultlens import environment
from faultlens.collectors.sources.process_events import (
    EventContext,
    agent_exit_row,
    signal_sent_row,
)
from faultlens.collectors.store.sink import SegmentSink

log = logging.getLogger(__name__)
TABLE = "process_events"


class EventRecorder:
    """process_events rows of the supervisor, each flushed into a visible segment before the call
    returns.
    """

    def __init__(self, sink: SegmentSink, *, job_id: str, cluster: str | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.sink = sink
        self.job_id = job_id
        self.cluster = cluster
        self.clock = clock

    def _context(self, node: str | None, attempt: int | None) -> EventContext:
        return EventContext(node=node, cluster=self.cluster, job_id=self.job_id, attempt=attempt)

    def _write(self, row: dict) -> None:
        try:
            self.sink.write(TABLE, [row])
            self.sink.flush(TABLE)
        except Exception as exc:  # telemetry must never stop the supervisor from acting
            log.warning("cannot record %s row: %s", row.get("kind"), exc)

    def agent_exit(self, *, node: str, attempt: int, returncode: int, pid: int | None, message: str,
                   by_us: bool) -> dict:
        row = agent_exit_row(
            self._context(node, attempt),
            self.clock(),
            returncode=returncode,
            pid=pid,
            message=message,
            is_secondary=by_us,
        )
        self._write(row)
        return row

    def signal_sent(
        self,
        *,
        node: str | None,
        attempt: int | None,
        pid: int,
        signal: str,
        message: str,
        rank: int | None = None,
        local_rank: int | None = None,
    ) -> dict:
        row = signal_sent_row(
            self._context(node, attempt),
            self.clock(),
            pid=pid,
            signal=signal,
            message=message,
            rank=rank,
            local_rank=local_rank,
        )
        self._write(row)
        return row


def signal_name(signum: int) -> str:
    try:
        return signal_module.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclass
class Worker:
    process: psutil.Process
    rank: int | None = None
    local_rank: int | None = None


class WorkerTracker:
    """The worker processes (and their children) of one torchrun agent."""

    def __init__(self, agent_pid: int, node: str, attempt: int) -> None:
        self.agent_pid = agent_pid
        self.node = node
        self.attempt = attempt
        self.workers: dict[int, Worker] = {}
        try:
            self._agent: psutil.Process | None = psutil.Process(agent_pid)
        except psutil.Error:
            self._agent = None

    def refresh(self) -> None:
        """Add the agent's current descendants (cheap: one scan of the agent's process tree)."""
        if self._agent is None:
            return
        try:
            children = self._agent.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if child.pid not in self.workers:
                rank, local_rank = _rank_of(child)
                self.workers[child.pid] = Worker(child, rank, local_rank)

    def add_ranks(self, ranks: Iterable[tuple[int, int | None, int | None]]) -> None:
        """(pid, rank, local_rank) from the ranks table of this node and attempt. A pid not yet
        known is taken only when the process is one of this node's workers of this attempt by its
        own environment."""
        for pid, rank, local_rank in ranks:
            worker = self.workers.get(pid)
            if worker is None:
                try:
                    process = psutil.Process(pid)
                    env = process.environ()
                except psutil.Error:
                    continue
                if environment.NODE.raw(env) != self.node or environment.ATTEMPT.raw(env) != str(
                    self.attempt
                ):
                    continue
                worker = self.workers[pid] = Worker(process)
            worker.rank = rank if rank is not None else worker.rank
            worker.local_rank = local_rank if local_rank is not None else worker.local_rank

    def alive(self) -> list[Worker]:
        alive = []
        for worker in self.workers.values():
            try:
                if worker.process.is_running() and worker.process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(worker)
            except psutil.Error:
                continue
        return alive

    def kill(
        self, recorder: EventRecorder, reason: str, signum: int = signal_module.SIGKILL
    ) -> list[int]:
        """Signal every live worker (recording each signal first); returns the pids signalled."""
        sent = []
        for worker in self.alive():
            recorder.signal_sent(node=self.node, attempt=self.attempt, pid=worker.process.pid,
                                 signal=signal_name(signum), message=reason, rank=worker.rank,
                                 local_rank=worker.local_rank)
            with contextlib.suppress(psutil.Error):
                worker.process.send_signal(signum)  # psutil checks the pid is still this process
                sent.append(worker.process.pid)
        return sent

    def wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()


def _rank_of(process: psutil.Process) -> tuple[int | None, int | None]:
    """RANK and LOCAL_RANK torchrun gave the worker, from its environment."""
    try:
        env = process.environ()
    except psutil.Error:
        return None, None
    return _int(env.get("RANK")), _int(env.get("LOCAL_RANK"))


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
