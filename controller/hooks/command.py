"""Command hook: run a program with the decision JSON on stdin (and FAULTLENS_DECISION_ID /
FAULTLENS_DECISION_ACTION in its environment). Exit 0 is delivered; anything else is a failure to
retry.

Transport rules: the program starts in its own process group (session); `timeout_s` covers the
whole call (stdin, output, exit); at the deadline the whole group is killed (SIGKILL), children
included. The verdict is the program's own exit: a background child that still holds its stdout
(`sleep 20 &`) never turns an exit 0 into a timeout (its pipes are closed, the child left running).
Output is bounded: only the last `output_tail_bytes` of stdout and of stderr are kept.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from faultlens.attribution.decision import Decision
from faultlens.controller.hooks.base import HookError, PermanentHookError, RetryPolicy

OUTPUT_TAIL_BYTES = 64 * 1024  # kept of each stream: the end, where the error is
_POLL_S = 0.05  # how often the exit is checked while a child keeps the pipes open
_CHUNK = 65536


@dataclass(frozen=True)
class CommandResult:
    """One run: the exit status (None: killed at the deadline), the kept tails, the bytes seen."""

    returncode: int | None
    stdout_tail: bytes
    stderr_tail: bytes
    stdout_bytes: int
    stderr_bytes: int


class _Tail:
    """The last `limit` bytes of a stream, and how many bytes it had."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.buffer += chunk
        if len(self.buffer) > 2 * self.limit:
            del self.buffer[: len(self.buffer) - self.limit]

    def value(self) -> bytes:
        return bytes(self.buffer[-self.limit :]) if self.limit else b""


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        process.kill()


def run_bounded(
    argv: Sequence[str],
    stdin: bytes,
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    tail_bytes: int = OUTPUT_TAIL_BYTES,
) -> CommandResult:
    """Run `argv` in its own process group, `stdin` fed to it, under one deadline for the whole
    call. Returns when the program itself exits (not when its pipes close); at the deadline kills
    the group and returns returncode None. Raises OSError when the program cannot start."""
    deadline = time.monotonic() + timeout_s
    process = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
    )
    tails = {process.stdout: _Tail(tail_bytes), process.stderr: _Tail(tail_bytes)}
    pending = memoryview(stdin)
    selector = selectors.DefaultSelector()
    try:
        for stream in tails:
            os.set_blocking(stream.fileno(), False)
            selector.register(stream, selectors.EVENT_READ)
        if pending:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        returncode = None
        while True:
            returncode = process.poll()
            if returncode is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill_group(process)
                process.wait()
                returncode = None
                break
            if not selector.get_map():
                try:
                    returncode = process.wait(timeout=min(remaining, _POLL_S))
                    break
                except subprocess.TimeoutExpired:
                    continue
            for key, _ in selector.select(min(remaining, _POLL_S)):
                stream = key.fileobj
                if stream is process.stdin:
                    try:
                        written = os.write(stream.fileno(), pending[:_CHUNK])
                    except BlockingIOError:
                        continue
                    except OSError:  # the program closed its stdin (EPIPE): it read what it wanted
                        written = len(pending)
                    pending = pending[written:]
                    if not pending:
                        selector.unregister(stream)
                        stream.close()
                    continue
                try:
                    chunk = os.read(stream.fileno(), _CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    tails[stream].add(chunk)
                else:
                    selector.unregister(stream)
        # the program has exited (or was killed): take what is already in the pipes, never wait for
        # EOF (a background child may hold them open)
        for stream, tail in tails.items():
            for _ in range(max(1, 4 * tail_bytes // _CHUNK)):
                try:
                    chunk = os.read(stream.fileno(), _CHUNK)
                except (BlockingIOError, OSError, ValueError):
                    break
                if not chunk:
                    break
                tail.add(chunk)
    finally:
        selector.close()
        for stream in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        if process.returncode is None:
            _kill_group(process)
            process.wait()
    out, err = tails[process.stdout], tails[process.stderr]
    return CommandResult(returncode, out.value(), err.value(), out.total, err.total)


class CommandHook:
    def __init__(
        self,
        command: str | Sequence[str],
        *,
        name: str = "command",
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        retry: RetryPolicy | None = None,
        output_tail_bytes: int = OUTPUT_TAIL_BYTES,
    ) -> None:
        self.argv = (
            shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
        )
        if not self.argv:
            raise ValueError(f"command hook {name}: empty command")
        self.name = name
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.cwd = cwd
        self.retry = retry
        self.output_tail_bytes = output_tail_bytes
        self.last_result: CommandResult | None = None

    def deliver(self, decision: Decision, document: str) -> None:
        env = {
            **os.environ,
            **self.env,
            "FAULTLENS_DECISION_ID": decision.decision_id,
            "FAULTLENS_DECISION_ACTION": decision.action.value,
        }
        try:
            result = run_bounded(
                self.argv,
                document.encode(),
                timeout_s=self.timeout_s,
                env=env,
                cwd=self.cwd,
                tail_bytes=self.output_tail_bytes,
            )
        except FileNotFoundError:
            raise PermanentHookError(f"{self.argv[0]}: no such program") from None
        except PermissionError:
            raise PermanentHookError(f"{self.argv[0]}: not executable") from None
        except OSError as exc:
            raise HookError(f"{self.argv[0]}: cannot start: {exc.strerror or exc}") from None
        self.last_result = result
        if result.returncode is None:
            raise HookError(
                f"{self.argv[0]}: no exit within {self.timeout_s}s (process group killed)"
            )
        if result.returncode != 0:
            lines = result.stderr_tail.decode("utf-8", "replace").strip().splitlines()
            tail = lines[-1] if lines else ""
            raise HookError(f"{self.argv[0]}: exit {result.returncode}: {tail[:300]}")
