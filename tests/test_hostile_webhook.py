"""Webhook delivery under attack (issue 16), over real HTTP on 127.0.0.1: the attempt header counts
per decision; the example Kubernetes receiver refuses replays (signed timestamp), keeps handled ids
durably by default, refuses a known decision_id with other content, answers hostile requests with a
clean 4xx before the signature check, and 300 idle connections hold no thread each. kubectl is the
boundary (recorded, not run)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib.util
import json
import logging
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.controller.hooks import HookError, PermanentHookError, WebhookHook
from faultlens.controller.hooks.webhook import (
    ATTEMPT_HEADER,
    DECISION_ID_HEADER,
    verify_timestamped,
)
from tests.conftest import REPO_ROOT

SECRET = "s3cret"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
RECEIVER = REPO_ROOT / "docs" / "deploy" / "kubernetes" / "webhook_receiver.py"


def decision(n: int) -> Decision:
    incident = Incident(
        f"inc-{n}",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        T0,
        T0,
        0.97,
        "xid-79",
        "x",
        job_id="llm-7b",
        attempt=0,
        culprit_nodes=("node-07",),
        culprit_ranks=(2,),
        evidence=(Evidence("gpu_events", T0, "Xid 79"),),
    )
    return Decision.for_incident(
        incident,
        action=Action.FAILOVER,
        policy_rule="hardware-failover",
        reason="xid",
        issued_at=T0,
        exclude_nodes=("node-07",),
        restore=Restore("durable", 1200, "s3://ckpt/llm-7b/step-1200"),
    )


# -- the sender's attempt header
# ------------------------------------------------------------------------------------
def test_attempt_header_counts_per_decision_not_per_hook_object():
    seen: list[tuple[str, str]] = []
    script = [503, 503, 200, 200, 503, 200]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers[DECISION_ID_HEADER], self.headers[ATTEMPT_HEADER]))
            self.send_response(script.pop(0))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hook = WebhookHook(f"http://127.0.0.1:{server.server_address[1]}/x", secret=SECRET)
        first, second, third = decision(1), decision(2), decision(3)
        for item in (first, first, first, second, third, third):
            with contextlib.suppress(HookError):
                hook.deliver(item, item.to_json())
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [(first.decision_id, "1"), (first.decision_id, "2"), (first.decision_id, "3"),
                    (second.decision_id, "1"), (third.decision_id, "1"), (third.decision_id, "2")]
    assert hook.attempt_of(first.decision_id) == 3 and hook.attempts == 6


# -- the example receiver
# --------------------------------------------------------------------------------------------
def _module(monkeypatch, state_path):
    monkeypatch.setenv("FAULTLENS_RECEIVER_STATE", str(state_path))
    spec = importlib.util.spec_from_file_location("webhook_receiver_hostile", RECEIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def k8s(tmp_path, monkeypatch):
    module = _module(monkeypatch, tmp_path / "state" / "handled.jsonl")
    calls: list = []
    receiver = module.DecisionReceiver(
        "training", kubectl=lambda args, stdin: calls.append(list(args))
    )
    server = module.make_server(
        receiver, SECRET, host="127.0.0.1", port=0, read_timeout_s=0.5, workers=4, backlog=8
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/faultlens/decisions"
    yield url, calls, module, server
    server.shutdown()
    server.server_close()


def _captured(hook: WebhookHook, item: Decision) -> urllib.request.Request:
    """The request the real hook sends (what an attacker on the path would capture)."""
    captured: dict = {}
    original = hook.signed_request

    def capture(decision, document):
        captured["parts"] = original(decision, document)
        return captured["parts"]

    hook.signed_request = capture
    hook.deliver(item, item.to_json())
    body, headers = captured["parts"]
    return urllib.request.Request(hook.url, data=body, headers=headers, method="POST")


def _send(request: urllib.request.Request) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_captured_request_is_not_replayable_later(k8s):
    url, calls, _, _ = k8s
    item = decision(1)
    request = _captured(WebhookHook(url, secret=SECRET), item)
    assert len(calls) == 3
    assert _send(request) == (200, "duplicate")  # a replay inside the window changes nothing
    assert len(calls) == 3
    # a request signed an hour ago (captured then, replayed now) is refused, even for a new decision
    old = WebhookHook(url, secret=SECRET, clock=lambda: time.time() - 3600)
    with pytest.raises(PermanentHookError, match="401"):
        old.deliver(decision(2), decision(2).to_json())
    # the timestamp is signed: moving it forward breaks the signature
    fresh = urllib.request.Request(
        url,
        data=request.data,
        method="POST",
        headers={**request.headers, "X-faultlens-timestamp": str(int(time.time()) + 7)},
    )
    status, text = _send(fresh)
    assert (status, text) == (401, "bad signature")
    # without a signed timestamp (an old sender's body-only signature): refused unless explicitly
    # allowed
    legacy = urllib.request.Request(
        url,
        data=decision(3).to_json().encode(),
        method="POST",
        headers={
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("x-faultlens-timestamp", "x-faultlens-signature-v2")
        },
    )
    assert _send(legacy)[0] == 401
    assert len(calls) == 3


def test_verify_timestamped_refuses_every_hostile_header():
    body = b"{}"
    for timestamp, signature in [
        (None, None),
        ("abc", "sha256=00"),
        ("-1", "sha256=00"),
        ("1" * 40, "sha256=00"),
        ("１２３", "sha256=00"),
        (str(int(time.time())), "sha256=ÿÿ"),
        (str(int(time.time())), "sha256=" + "0" * 64),
    ]:
        assert verify_timestamped(SECRET, body, timestamp, signature) is not None


def test_handled_ids_survive_a_restart_by_default(k8s, monkeypatch, tmp_path):
    url, calls, module, _ = k8s
    item = decision(1)
    WebhookHook(url, secret=SECRET).deliver(item, item.to_json())
    restarted = module.DecisionReceiver(
        "training", kubectl=lambda args, stdin: calls.append(list(args))
    )
    assert restarted.state_file == tmp_path / "state" / "handled.jsonl"
    assert restarted.handle(json.loads(item.to_json())) == "duplicate"
    assert len(calls) == 3  # the cordon did not run again


def test_a_known_decision_id_with_other_content_is_refused_not_duplicate(k8s):
    url, calls, _, _ = k8s
    item = decision(1)
    hook = WebhookHook(url, secret=SECRET)
    hook.deliver(item, item.to_json())
    other = dataclasses.replace(item, exclude_nodes=("node-01",), reason="not what was decided")
    assert other.decision_id == item.decision_id
    with pytest.raises(PermanentHookError, match="409"):
        hook.deliver(other, other.to_json())
    assert len(calls) == 3 and ["cordon", "node-01"] not in calls


def _raw(url: str, head: bytes, body: bytes = b"", wait_s: float = 10.0) -> tuple[int, bytes]:
    port = int(url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(head + body)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data


HOSTILE = {
    "content_length_abc": (b"Content-Length: abc\r\n", 400),
    "content_length_huge": (b"Content-Length: 1000000000000\r\n", 413),
    "content_length_negative": (b"Content-Length: -1\r\n", 400),
    "content_length_missing": (b"", 411),
    "content_length_unicode_digits": ("Content-Length: ４２\r\n".encode(), 400),
    "non_ascii_signature": (
        b"Content-Length: 2\r\nX-Faultlens-Signature: sha256=\xff\xfe\r\n"
        b"X-Faultlens-Timestamp: 1\r\nX-Faultlens-Signature-V2: \xc3\xa9\r\n",
        401,
    ),
    "body_never_sent": (b"Content-Length: 100\r\n", 408),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_requests_get_a_clean_4xx_before_the_signature_check(k8s, case, caplog):
    url, calls, _, _ = k8s
    headers, expected = HOSTILE[case]
    head = b"POST /faultlens/decisions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    body = b"{}" if case == "non_ascii_signature" else b""
    before = threading.active_count()
    with caplog.at_level(logging.DEBUG):
        status, _ = _raw(url, head, body)
    assert status == expected
    assert calls == []
    assert not any(r.exc_info for r in caplog.records)  # no traceback
    time.sleep(0.2)
    # nothing left holding a thread beyond the fixed pool
    assert threading.active_count() <= before + 4


def test_300_idle_connections_hold_no_thread_each(k8s):
    url, calls, _, server = k8s
    port = server.server_address[1]
    before = threading.active_count()
    idle = []
    started = time.monotonic()
    for _ in range(300):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    print(f"300 connections in {time.monotonic() - started:.1f} s")
    time.sleep(0.5)
    during = threading.active_count()
    for sock in idle:
        sock.close()
    assert len(idle) == 300
    assert during - before <= 4  # the pool's workers, not one thread per connection
    time.sleep(1.5)  # the idle ones time out (0.5 s per read) and the pool is free again
    item = decision(9)
    WebhookHook(url, secret=SECRET).deliver(item, item.to_json())
    assert len(calls) == 3


def _trickle(port: int, stop: threading.Event, every_s: float, statuses: list) -> None:
    """A client that sends its request headers one byte at a time and never finishes."""
    head = b"POST /faultlens/decisions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 10_000
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        return
    with sock:
        for byte in head:
            if stop.wait(every_s):
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
        with contextlib.suppress(OSError):
            answer = sock.recv(100)
            statuses.append(int(answer.split()[1]) if answer else None)


@pytest.mark.parametrize("trickling", [2, 4, 12, 40])
def test_more_trickling_clients_than_workers_cannot_starve_a_decision(k8s, trickling):
    url, calls, _, server = k8s  # 4 workers, backlog 8, a whole request within 1.5 s
    port = server.server_address[1]
    stop = threading.Event()
    statuses: list = []
    threads = [
        threading.Thread(target=_trickle, args=(port, stop, 0.2, statuses), daemon=True)
        for _ in range(trickling)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # they all hold a connection now
    item = decision(20 + trickling)
    started = time.monotonic()
    WebhookHook(url, secret=SECRET, timeout_s=5).deliver(item, item.to_json())
    assert time.monotonic() - started < 3.0  # not behind the trickling clients
    assert len(calls) == 3  # acted on once (cordon, ConfigMap, delete pods)
    time.sleep(2.0)  # past the whole-request deadline: every trickler has been answered
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    assert statuses and set(statuses) <= {408, 503}  # deadline passed, or dropped as oldest
    # the same decision again (its answer lost): recognised, not acted on twice
    WebhookHook(url, secret=SECRET, timeout_s=5).deliver(item, item.to_json())
    assert len(calls) == 3
