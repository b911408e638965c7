"""What srun says about the node tasks it launched, as the supervisor's lifecycle rows.

srun is the job's launcher on Slurm, as `faultlens run` is under its own supervisor: it sees each
node task (`faultlens slurm node`, the node's torchrun agent) end, and it tears the step down
(`--kill-on-bad-exit`). `faultlens slurm run` reads srun's stderr line by line (passing every line
on) and writes, at the moment srun says it, the process_events rows the crash rules already read
for `faultlens run` (source "supervisor", attribution/detectors/crash/lifecycle.py):

    srun: error: NODE: task N: Killed                     agent_exit, signal SIGKILL
    srun: error: NODE: task N: Segmentation fault         agent_exit, that signal
    srun: error: NODE: task N: Exited with exit code C    agent_exit, exit code C
    srun: launch/slurm: _step_signal: Terminating ...     signal_sent SIGTERM (the step's teardown)
    srun: Job step aborted: ... / forcing job termination signal_sent SIGTERM (scancel, requeue)

So a node task killed by a signal nobody sent (its node lost: the task, torchrun and the ranks
killed together) is a lost agent, the same rule as under the supervisor, and what srun kills after
it began tearing the step down is a termination, never a failure. A task line that comes after the
teardown began is still written (it says how that task ended); the crash rules skip it as the
teardown's doing. Rows are written and flushed one by one; a store that cannot be written never
stops the job (one warning).
"""

from __future__ import annotations

import re
import signal as signal_module
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

#: a task (or tasks) of one node ended: "Exited with exit code N" or the C library's signal text
TASK_END = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)$")
EXIT_CODE = re.compile(r"^Exited with exit code (?P<code>\d+)$")
TEARDOWN = re.compile(
    r"^srun: (?:launch/slurm: _step_signal: Terminating|Job step aborted|forcing job termination"
    r"|Force Terminated)"
)


def _signal_texts() -> dict[str, int]:
    """The C library's text of every signal (strsignal: what srun prints) -> its number."""
    texts: dict[str, int] = {}
    for sig in signal_module.Signals:
        text = signal_module.strsignal(sig)
        if text and text not in texts:
            texts[text] = int(sig)
    return texts


SIGNAL_TEXTS = _signal_texts()


@dataclass(frozen=True)
class TaskEnd:
    """A node task srun saw end: by `signal` (a number) or with `exit_code`."""

    node: str
    exit_code: int | None
    signal: int | None
    line: str

    @property
    def returncode(self) -> int:
        """As Popen gives it: negative, the signal's number, when killed by one."""
        return -self.signal if self.signal is not None else int(self.exit_code or 0)


@dataclass(frozen=True)
class Teardown:
    """srun began stopping the step."""

    line: str


def parse_line(line: str) -> TaskEnd | Teardown | None:
    """One line of srun's stderr: a task's end, the step's teardown, or nothing of either."""
    text = line.strip()
    if TEARDOWN.match(text):
        return Teardown(text)
    match = TASK_END.match(text)
    if match is None:
        return None
    what = match.group("what").strip()
    code = EXIT_CODE.match(what)
    if code is not None:
        return TaskEnd(match.group("node"), int(code.group("code")), None, text)
    signum = SIGNAL_TEXTS.get(what.removesuffix(" (core dumped)").strip())
    if signum is None:
        return None  # a line srun may print that says no end we know how to read
    return TaskEnd(match.group("node"), None, signum, text)


class SrunWatch:
    """Reads srun's stderr lines and records each task end and the teardown (process_events rows
    of source "supervisor") into the job's store through `recorder` (None: nothing recorded)."""

    def __init__(
        self,
        recorder: object | None,
        attempt: int,
        srun_pid: int,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.recorder = recorder
        self.attempt = attempt
        self.srun_pid = srun_pid
        self.clock = clock
        self.tore_down = False
        self.ends: list[TaskEnd] = []

    def line(self, line: str) -> None:
        event = parse_line(line)
        if event is None:
            return
        if isinstance(event, Teardown):
            if self.tore_down:
                return
            self.tore_down = True
            if self.recorder is not None:
                self.recorder.signal_sent(  # type: ignore[attr-defined]
                    node=None,
                    attempt=self.attempt,
                    pid=self.srun_pid,
                    signal="SIGTERM",
                    message=f"srun stops the step: {event.line}",
                )
            return
        self.ends.append(event)
        if self.recorder is not None:
            self.recorder.agent_exit(  # type: ignore[attr-defined]
                node=event.node,
                attempt=self.attempt,
                returncode=event.returncode,
                pid=None,
                message=event.line,
                by_us=self.tore_down,
            )


def open_recorder(store: str | None, job_id: str) -> object | None:
    """The supervisor's EventRecorder over the job's store (rows flushed at once); None when no
    store was given or it cannot be opened (one warning: the job runs on)."""
    if not store:
        return None
    try:
        from faultlens.collectors.store.sink import SegmentSink
        from faultlens.controller.supervisor.processes import EventRecorder

        sink = SegmentSink(store, flush_rows=1, flush_age_s=0.0)
        return EventRecorder(sink, job_id=job_id)
    except Exception as exc:  # the job's own run matters more than its lifecycle rows
        print(f"faultlens slurm: srun's reports not stored: {exc}", file=sys.stderr, flush=True)
        return None
