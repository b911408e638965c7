"""Faults the campaign carries out from outside the job: a signal to a rank's PID, a node lost (its
torchrun agent and its workers SIGKILLed together), an agent lost alone, a CPU hog beside the job;
and the clean-up of every process a scenario started. Processes are found through the pid files the
injected ranks write (plan.py) and checked to belong to this scenario (its lab directory in their
environment) before any signal is sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from faultlens import environment
from faultlens.controller.lab.plan import FaultSpec, log_injection

HOG_CODE = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n"


def ours(pid: int, lab_dir: Path) -> bool:
    """Is `pid` alive and a process of this scenario (FAULTLENS_LAB_DIR=<lab_dir> in its
    environment)?
    """
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{environment.LAB_DIR.name}={lab_dir}".encode() in environ.split(b"\0")


def _kill(pid: int, signum: int, lab_dir: Path) -> bool:
    if not ours(pid, lab_dir):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)
        return True
    return False


def pid_records(lab_dir: Path, attempt: int | None = None) -> list[dict]:
    rows = []
    for path in sorted((lab_dir / "pids").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if attempt is None or doc.get("attempt") == attempt:
            rows.append(doc)
    return rows


class ExternalActions:
    """Polls triggers/ and carries out the external faults of a scenario, logging the moment each
    one lands.
    """

    def __init__(self, faults: Sequence[FaultSpec], lab_dir: Path, poll_s: float = 0.05) -> None:
        self.faults = {f.id: f for f in faults}
        self.lab_dir = lab_dir
        self.poll_s = poll_s
        self.done: set[str] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lab-actions", daemon=True)

    def start(self) -> ExternalActions:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        triggers = self.lab_dir / "triggers"
        while not self._stop.is_set():
            for path in sorted(triggers.glob("*.json")) if triggers.exists() else ():
                if path.name in self.done:
                    continue
                try:
                    doc = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                self.done.add(path.name)
                fault = self.faults.get(doc.get("fault"))
                if fault is not None:
                    try:
                        self.act(fault, doc)
                    except Exception as exc:  # reported in the scenario's result, never silently
                        self.errors.append(f"{fault.id}: {type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    def act(self, fault: FaultSpec, trigger: dict) -> None:
        attempt, node = trigger.get("attempt"), trigger.get("node")
        if fault.kind == "external_signal":
            signum = getattr(signal, str(fault.params.get("signal", "SIGTERM")))
            log_injection(self.lab_dir, fault, attempt=attempt, node=node, rank=trigger.get("rank"),
                          step=trigger.get("step"), by="campaign", detail=f"{signum.name} to pid "
                                                                          f"{trigger['pid']}")
            if not _kill(int(trigger["pid"]), signum, self.lab_dir):
                self.errors.append(f"{fault.id}: pid {trigger['pid']} is gone")
            return
        agent = int(trigger["agent_pid"])
        workers = [
            int(r["pid"]) for r in pid_records(self.lab_dir, attempt) if r.get("node") == node
        ]
        victims = [agent] if fault.kind == "agent_loss" else [agent, *workers]
        log_injection(
            self.lab_dir,
            fault,
            attempt=attempt,
            node=node,
            rank=None,
            step=trigger.get("step"),
            by="campaign",
            detail=f"SIGKILL to {'agent' if fault.kind == 'agent_loss' else 'agent+workers'} "
            f"{victims}",
        )
        for pid in victims:  # as one machine going away: every process at once
            _kill(pid, signal.SIGKILL, self.lab_dir)


class CpuHog:
    """`processes` busy Python loops beside the job, at the job's own nice level."""

    def __init__(self, processes: int = 1) -> None:
        self.processes = max(1, int(processes))
        self.procs: list[subprocess.Popen] = []

    def start(self) -> CpuHog:
        env = environment.without_faultlens(os.environ)
        for _ in range(self.processes):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG_CODE],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def reap(lab_dir: Path, grace_s: float = 2.0) -> int:
    """SIGKILL every process of this scenario still alive (workers and their agents; stopped ones
    included).
    """
    pids: set[int] = set()
    for record in pid_records(lab_dir):
        pids.update(int(p) for p in (record.get("pid"), record.get("agent_pid")) if p)
    killed = 0
    for pid in sorted(pids):
        if _kill(pid, signal.SIGKILL, lab_dir):
            killed += 1
    deadline = time.monotonic() + grace_s
    while killed and time.monotonic() < deadline and any(ours(p, lab_dir) for p in pids):
        time.sleep(0.05)
    return killed
