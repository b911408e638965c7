"""Hook transport under hostile programs and endpoints (issue 37): a command hook's deadline covers
the whole call and kills its process group, its output is bounded, and a background child holding
its pipes never makes an exit 0 look like a timeout. Executions are counted on the receiving side
(each run of the hook appends one line to a file), through the real Deliverer and store."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from faultlens.attribution.decision import DeliveryStatus
from faultlens.controller.delivery import Deliverer
from faultlens.controller.hooks import (
    CommandHook,
    FileDropHook,
    HookError,
    RetryPolicy,
    WebhookHook,
)
from faultlens.controller.hooks.command import run_bounded
from tests.test_hooks import make_decision

# how a user writes a hook that starts something in the background and returns
BACKGROUND_SHAPES = [
    "sleep 20 &",
    "(sleep 20) &",
    "nohup sleep 20 > /dev/null 2>&1 < /dev/null & sleep 20 &",
    "{ sleep 20; echo late; } &",
    "sh -c 'sleep 20' &",
]


def _hook_script(tmp_path: Path, body: str, name: str = "hook.sh") -> tuple[Path, Path]:
    """A shell hook that records one line per execution (the receiving side) and then runs
    `body`."""
    runs = tmp_path / f"{name}.runs"
    script = tmp_path / name
    script.write_text(
        f'#!/bin/sh\ncat > /dev/null\necho "$FAULTLENS_DECISION_ID" >> {runs}\n{body}\n'
    )
    script.chmod(0o755)
    return script, runs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except OSError:
        return False
    return status != "Z"


@pytest.mark.parametrize("shape", BACKGROUND_SHAPES)
def test_background_child_holding_stdout_is_not_a_timeout(
    tmp_path: Path, store_dir: Path, shape: str
) -> None:
    script, runs = _hook_script(tmp_path, f"{shape}\nexit 0")
    hook = CommandHook(
        [str(script)], name="bg", timeout_s=4.0, retry=RetryPolicy(attempts=3, initial_s=0)
    )
    deliverer = Deliverer(store_dir, [hook], sleep=lambda s: None)
    decisions = [make_decision(n) for n in range(3)]
    results = [r for d in decisions for r in deliverer.submit(d)]
    deliverer.close()
    # delivered at the first attempt: the hook's own exit decided, not EOF on its pipes
    assert [(r.status, r.attempts) for r in results] == [(DeliveryStatus.DELIVERED, 1)] * 3
    lines = runs.read_text().splitlines()
    assert sorted(lines) == sorted(d.decision_id for d in decisions)  # each exactly once


@pytest.mark.parametrize(
    "body",
    [
        "yes",  # writes forever on stdout
        "yes 1>&2",  # on stderr
        "yes & yes 1>&2 & wait",  # children write, the hook waits
        "head -c 50000000 /dev/zero; sleep 30",  # a burst, then hangs
    ],
)
def test_endless_output_is_bounded_and_the_deadline_kills_the_group(
    tmp_path: Path, body: str
) -> None:
    script, runs = _hook_script(tmp_path, body)
    hook = CommandHook([str(script)], timeout_s=1.5, output_tail_bytes=4096)
    started = time.monotonic()
    with pytest.raises(HookError, match=r"no exit within 1\.5s"):
        hook.deliver(make_decision(), make_decision().to_json())
    assert time.monotonic() - started < 5.0
    result = hook.last_result
    assert result is not None and result.returncode is None
    assert len(result.stdout_tail) <= 4096 and len(result.stderr_tail) <= 4096
    assert result.stdout_bytes + result.stderr_bytes > 4096  # it did write more than was kept
    assert len(runs.read_text().splitlines()) == 1


def test_children_of_a_hung_hook_are_killed_at_the_deadline(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script, _ = _hook_script(tmp_path, f"sleep 60 & echo $! > {pids}\nsleep 60 & wait")
    hook = CommandHook([str(script)], timeout_s=1.0)
    with pytest.raises(HookError, match="process group killed"):
        hook.deliver(make_decision(), make_decision().to_json())
    child = int(pids.read_text())
    deadline = time.monotonic() + 3
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_the_tail_keeps_the_end_where_the_error_is(tmp_path: Path) -> None:
    script, _ = _hook_script(tmp_path, "seq 1 200000 1>&2; echo 'queue full' 1>&2; exit 4")
    hook = CommandHook([str(script)], timeout_s=10, output_tail_bytes=1024)
    with pytest.raises(HookError, match="exit 4: queue full"):
        hook.deliver(make_decision(), make_decision().to_json())
    assert hook.last_result is not None and len(hook.last_result.stderr_tail) <= 1024


def test_a_hook_that_never_reads_stdin_gets_a_large_document(tmp_path: Path) -> None:
    # 1 MB on stdin (more than a pipe holds), read by nobody: the exit decides
    result = run_bounded(["sh", "-c", "exit 0"], b"x" * 1_000_000, timeout_s=5)
    assert result.returncode == 0
    result = run_bounded(
        [sys.executable, "-c", "import sys; print(len(sys.stdin.read()))"],
        b"y" * 3_000_000,
        timeout_s=20,
    )
    assert result.returncode == 0 and result.stdout_tail.strip() == b"3000000"


def test_a_hook_killed_by_a_signal_is_a_failure(tmp_path: Path) -> None:
    script, runs = _hook_script(tmp_path, "kill -TERM $$")
    with pytest.raises(HookError, match=f"exit {-signal.SIGTERM}"):
        CommandHook([str(script)], timeout_s=5).deliver(make_decision(), make_decision().to_json())
    assert len(runs.read_text().splitlines()) == 1


class RawEndpoint:
    """A real HTTP endpoint on loopback that misbehaves after reading each request in full; counts
    the requests it received (the receiving side)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.received: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            headers = dict(
                line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
            )
            length = int(headers.get("Content-Length", "0"))
            while len(body) < length:
                body += conn.recv(65536)
            self.received.append(headers.get("X-Faultlens-Decision-Id", ""))
            with contextlib.suppress(OSError):  # the hook hung up
                self.answer(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def _trickle_status_then_bytes(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.wait(0.3):
        conn.sendall(b"X")  # one byte of a header line, forever


def _trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 503 Busy\r\nContent-Length: 1000000\r\n\r\n")
    while not stop.wait(0.3):
        conn.sendall(b"x")


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(30)


def _huge_ok_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3000000000\r\n\r\n")
    block = b"z" * (1 << 20)
    for _ in range(3000):  # 3 GB if the hook kept reading
        if stop.is_set():
            return
        conn.sendall(block)


def _huge_chunked_ok_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    block = b"100000\r\n" + b"z" * 0x100000 + b"\r\n"
    for _ in range(3000):
        if stop.is_set():
            return
        conn.sendall(block)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (_trickle_status_then_bytes, "no complete answer within 1s"),
        (_trickle_body, "HTTP 503 Busy"),  # the status decides; the body is cut at the deadline
        (_silent, "no complete answer within 1s"),
    ],
    ids=["status-then-trickled-header", "trickled-body", "silent"],
)
def test_webhook_deadline_covers_the_whole_exchange(answer, error: str) -> None:
    endpoint = RawEndpoint(answer)
    try:
        hook = WebhookHook(endpoint.url, secret="s", timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(HookError, match=error):
            hook.deliver(make_decision(), make_decision().to_json())
        assert time.monotonic() - started < 6.0  # one deadline, not one per read (those: 30 s+)
        waited = time.monotonic() + 3
        while not endpoint.received and time.monotonic() < waited:
            time.sleep(0.05)
        assert len(endpoint.received) == 1
    finally:
        endpoint.close()


@pytest.mark.parametrize("answer", [_huge_ok_body, _huge_chunked_ok_body], ids=lambda f: f.__name__)
def test_webhook_200_with_a_huge_body_is_delivered_once(answer, store_dir: Path) -> None:
    endpoint = RawEndpoint(answer)
    try:
        hook = WebhookHook(
            endpoint.url, secret="s", timeout_s=10.0, retry=RetryPolicy(attempts=3, initial_s=0)
        )
        deliverer = Deliverer(store_dir, [hook], sleep=lambda s: None)
        decisions = [make_decision(n) for n in range(2)]
        results = [r for d in decisions for r in deliverer.submit(d)]
        deliverer.close()
        assert [(r.status, r.attempts) for r in results] == [(DeliveryStatus.DELIVERED, 1)] * 2
        assert sorted(endpoint.received) == sorted(d.decision_id for d in decisions)
    finally:
        endpoint.close()


def test_file_drop_is_not_dropped_again_after_its_consumer_took_it(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    drop = FileDropHook(spool, name="spool")
    applied: list[str] = []
    decisions = [make_decision(n) for n in range(3)]
    for _ in range(3):  # at-least-once: every decision delivered three times
        for item in decisions:
            drop.deliver(item, item.to_json())
            for path in sorted(spool.glob("*.json")):  # the consumer applies and removes
                applied.append(path.stem)
                path.unlink()
    assert sorted(applied) == sorted(d.decision_id for d in decisions)  # each applied once
