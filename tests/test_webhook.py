"""Webhook delivery against a real HTTP server on 127.0.0.1 (http.server in a thread): retry with
backoff, HMAC signature, duplicates recognisable by decision_id, persisted before delivery, never
lost."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Decision, DeliveryStatus, Restore
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.controller.delivery import DecisionLog, Deliverer
from faultlens.controller.hooks import (
    PermanentHookError,
    RetryPolicy,
    WebhookHook,
    sign,
    verify_signature,
)
from faultlens.controller.hooks.webhook import DECISION_ID_HEADER, SIGNATURE_HEADER

SECRET = "s3cret-for-tests"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def make_decision(n: int = 1) -> Decision:
    incident = Incident(
        f"inc-{n}",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        T0,
        T0,
        0.97,
        "xid-79",
        "x",
        job_id="job-1",
        attempt=0,
        culprit_nodes=("node-1",),
        culprit_ranks=(2,),
        evidence=(Evidence("gpu_events", T0, "Xid 79"),),
    )
    return Decision.for_incident(
        incident,
        action=Action.FAILOVER,
        policy_rule="hardware-failover",
        reason="xid",
        issued_at=T0,
        exclude_nodes=("node-1",),
        restore=Restore("durable", 100, None),
    )


class Receiver:
    """A job controller's endpoint: verifies the signature, answers from a script of status codes,
    and keeps the decision ids it has already acted on (a duplicate is recognised by
    X-Faultlens-Decision-Id)."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = store_dir
        self.script: list[int] = []
        self.default_status = 200
        self.requests: list[dict] = []
        self.acted_on: set[str] = set()
        self.duplicates: list[str] = []
        self.lock = threading.Lock()

    def handle(self, handler: BaseHTTPRequestHandler) -> int:
        body = handler.rfile.read(int(handler.headers["Content-Length"]))
        decision_id = handler.headers[DECISION_ID_HEADER]
        # what is in the store at the moment the request arrives
        with Store(str(self.store_dir)) as store:
            persisted = store.query("SELECT count(*) AS n FROM decisions WHERE decision_id = ?",
                                    [decision_id]).to_pylist()[0]["n"]
        with self.lock:
            status = self.script.pop(0) if self.script else self.default_status
            self.requests.append(
                {
                    "body": body,
                    "headers": dict(handler.headers),
                    "status": status,
                    "persisted_rows": persisted,
                    "signature_ok": verify_signature(
                        SECRET, body, handler.headers[SIGNATURE_HEADER]
                    ),
                }
            )
            if status == 200:
                if decision_id in self.acted_on:
                    self.duplicates.append(decision_id)
                self.acted_on.add(decision_id)
        return status


@pytest.fixture
def receiver(store_dir: Path) -> Iterator[tuple[Receiver, str]]:
    state = Receiver(store_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status = state.handle(self)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/faultlens"
    finally:
        server.shutdown()
        server.server_close()


def hook(url: str, attempts: int = 3) -> WebhookHook:
    return WebhookHook(url, secret=SECRET, name="controller", timeout_s=5,
                       retry=RetryPolicy(attempts=attempts, initial_s=0.01, factor=2.0, max_s=0.05))


def test_first_attempt_fails_retry_succeeds_signature_verifies(receiver, store_dir: Path) -> None:
    state, url = receiver
    state.script = [500]
    sleeps: list[float] = []
    deliverer = Deliverer(store_dir, [hook(url)], sleep=sleeps.append)
    decision = make_decision()
    results = deliverer.submit(decision)
    deliverer.close()

    assert [r.status for r in results] == [DeliveryStatus.DELIVERED]
    assert results[0].attempts == 2
    assert sleeps == [0.01]
    assert [r["status"] for r in state.requests] == [500, 200]
    for request in state.requests:
        assert request["signature_ok"]
        assert request["headers"][DECISION_ID_HEADER] == decision.decision_id
        assert request["headers"][SIGNATURE_HEADER] == sign(SECRET, request["body"])
        assert Decision.from_json(request["body"]) == decision
    assert state.requests[0]["body"] == state.requests[1]["body"]  # same bytes on every attempt
    assert [r["headers"]["X-Faultlens-Delivery-Attempt"] for r in state.requests] == ["1", "2"]
    # a wrong secret does not verify, a tampered body does not verify
    assert not verify_signature(
        "other", state.requests[0]["body"], state.requests[0]["headers"][SIGNATURE_HEADER]
    )
    tampered = state.requests[0]["body"].replace(b"failover", b"escalate")
    assert not verify_signature(SECRET, tampered, state.requests[0]["headers"][SIGNATURE_HEADER])


def test_decision_is_persisted_before_any_delivery(receiver, store_dir: Path) -> None:
    state, url = receiver
    deliverer = Deliverer(store_dir, [hook(url)], sleep=lambda s: None)
    deliverer.submit(make_decision())
    deliverer.close()
    # the row was visible when the first request arrived
    assert state.requests[0]["persisted_rows"] >= 1
    with Store(str(store_dir)) as store:
        rows = store.query("SELECT hook, delivery_status FROM decisions ORDER BY ts").to_pylist()
    assert rows[0] == {"hook": None, "delivery_status": "pending"}
    assert rows[-1] == {"hook": "controller", "delivery_status": "delivered"}


def test_duplicate_delivery_is_recognisable_by_decision_id(receiver, store_dir: Path) -> None:
    state, url = receiver
    decision = make_decision()
    webhook = hook(url)
    # at-least-once: the controller acted on it, but the answer was lost and the sender delivers
    # again
    webhook.deliver(decision, decision.to_json())
    webhook.deliver(decision, decision.to_json())
    assert state.duplicates == [decision.decision_id]
    assert len({r["headers"][DECISION_ID_HEADER] for r in state.requests}) == 1
    # the deliverer itself does not send a delivered decision again
    deliverer = Deliverer(store_dir, [webhook], sleep=lambda s: None)
    deliverer.submit(decision)
    before = len(state.requests)
    deliverer.submit(decision)
    assert deliverer.redeliver() == []
    deliverer.close()
    assert len(state.requests) == before


def test_a_failing_hook_never_loses_the_decision(receiver, store_dir: Path) -> None:
    state, url = receiver
    state.default_status = 503
    decision = make_decision(7)
    deliverer = Deliverer(store_dir, [hook(url, attempts=3)], sleep=lambda s: None)
    results = deliverer.submit(decision)
    deliverer.close()
    assert results[0].status is DeliveryStatus.FAILED and results[0].attempts == 3
    assert "HTTP 503" in results[0].error

    log = DecisionLog(store_dir)
    record = log.records()[decision.decision_id]
    assert record.decision == decision
    assert record.hooks == {"controller": DeliveryStatus.FAILED}
    assert "HTTP 503" in record.errors["controller"]
    log.close()

    # the controller comes back: a redelivery pass (a new process) gets it through
    state.default_status = 200
    again = Deliverer(store_dir, [hook(url)], sleep=lambda s: None)
    results = again.redeliver()
    assert [(r.decision_id, r.status) for r in results] == [
        (decision.decision_id, DeliveryStatus.DELIVERED)
    ]
    assert again.log.records()[decision.decision_id].status is DeliveryStatus.DELIVERED
    assert again.redeliver() == []
    again.close()


def test_client_errors_are_not_retried_but_kept(receiver, store_dir: Path) -> None:
    state, url = receiver
    state.default_status = 401
    with pytest.raises(PermanentHookError, match="HTTP 401"):
        hook(url).deliver(make_decision(), make_decision().to_json())
    deliverer = Deliverer(store_dir, [hook(url, attempts=5)], sleep=lambda s: None)
    results = deliverer.submit(make_decision(2))
    deliverer.close()
    assert results[0].status is DeliveryStatus.FAILED and results[0].attempts == 1


def test_unreachable_endpoint_fails_with_backoff_and_keeps_the_decision(store_dir: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps: list[float] = []
    webhook = WebhookHook(
        f"http://127.0.0.1:{port}/x",
        secret=SECRET,
        name="controller",
        timeout_s=2,
        retry=RetryPolicy(attempts=4, initial_s=0.01, factor=3.0, max_s=0.05),
    )
    deliverer = Deliverer(store_dir, [webhook], sleep=sleeps.append)
    results = deliverer.submit(make_decision(3))
    deliverer.close()
    assert results[0].status is DeliveryStatus.FAILED and results[0].attempts == 4
    assert sleeps == [0.01, 0.03, 0.05]  # exponential, capped at max_s
    log = DecisionLog(store_dir)
    assert log.records()[make_decision(3).decision_id].status is DeliveryStatus.FAILED
    log.close()


def test_webhook_requires_a_secret_and_an_http_url() -> None:
    with pytest.raises(ValueError, match="secret"):
        WebhookHook("http://127.0.0.1:1/x")
    with pytest.raises(ValueError, match="http"):
        WebhookHook("ftp://x/y", secret="s")
    with pytest.raises(ValueError, match="NOT_SET_FOR_TEST"):
        WebhookHook("http://127.0.0.1:1/x", secret_env="NOT_SET_FOR_TEST")


def test_payload_is_the_canonical_contract(receiver, store_dir: Path) -> None:
    state, url = receiver
    decision = make_decision(4)
    hook(url).deliver(decision, decision.to_json())
    document = json.loads(state.requests[0]["body"])
    assert document["schema"] == "faultlens.decision/1"
    assert document["decision_id"] == decision.decision_id


def test_decisions_written_by_an_older_schema_are_still_read(store_dir: Path) -> None:
    """A segment without the delivery_error/delivery_attempts columns (schema before they were
    added).
    """
    import pyarrow as pa

    from faultlens.collectors.store.layout import partition_dir, resolve_store, write_segment
    from faultlens.collectors.store.schema import TABLES

    decision = make_decision(11)
    old_schema = pa.schema(
        [f for f in TABLES["decisions"] if f.name not in ("delivery_error", "delivery_attempts")]
    )
    row = decision.to_row()
    table = pa.Table.from_pylist([{f.name: row.get(f.name) for f in old_schema}], schema=old_schema)
    location = resolve_store(str(store_dir))
    write_segment(
        location, partition_dir(location, "decisions", "job-1", "2026-11-30", "node-1"), table
    )
    log = DecisionLog(store_dir)
    assert log.records()[decision.decision_id].decision == decision
    log.close()
