"""Receive faultlens decisions in a Kubernetes cluster (the operator-hook sketch of
docs/operations.md, runnable).

faultlens' webhook hook POSTs each decision (JSON, schema faultlens.decision/1) signed with
HMAC-SHA256. This receiver refuses what is not signed with a timestamp inside its window
(X-Faultlens-Timestamp and X-Faultlens-Signature-V2 = HMAC of "<timestamp>." + body: a captured
request cannot be replayed later), acknowledges a decision it has already handled (delivery is
at-least-once; handled ids and a digest of each decision are kept in a state file, fsynced, so a
restart forgets nothing), refuses a known decision_id with other content (409), and acts through
kubectl:

- failover: cordon every excluded node; write the restore choice into the ConfigMap
  `<job>-faultlens-restore` (keys tier, step, uri, attempt, decision_id) that the job's pods read at
  start; delete the job's pods (label `faultlens.io/job=<job>`) so the job's own controller (JobSet,
  PyTorchJob, a Job with a pod failure policy) recreates them, on other nodes, from that checkpoint.
- drain: cordon the nodes (a proactive decision: no pod is touched; evict them with `kubectl drain`
  when due).
- escalate: annotate the job's pods with the reason and touch nothing else: a human takes it from
  here.

    FAULTLENS_WEBHOOK_SECRET=... python webhook_receiver.py --port 8080 --namespace training \
        --state-file /var/lib/faultlens-receiver/handled.jsonl

Hostile clients: the body is at most --max-body bytes (Content-Length required: 411 without it, 400
when it is not a number, 413 when too large); one gatherer thread reads each request whole, headers
included, within --request-timeout (408) before any of the --workers threads sees it, so slow or
idle connections hold no worker; at most --workers + --backlog connections wait, and a new one
drops the one waiting longest (a flood of trickling clients cannot keep a fresh request out).

Run it as a Deployment with a ServiceAccount allowed to patch nodes, apply ConfigMaps and
delete/annotate pods in the namespace; point the webhook hook's url at its Service
(docs/deploy/kubernetes/hooks.yaml).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import queue
import re
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from faultlens.controller.hooks.webhook import (
    DECISION_ID_HEADER,
    DEFAULT_WINDOW_S,
    SIGNATURE_HEADER,
    SIGNATURE_V2_HEADER,
    TIMESTAMP_HEADER,
    verify_signature,
    verify_timestamped,
)

log = logging.getLogger("faultlens.k8s-receiver")
JOB_LABEL = "faultlens.io/job"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DEFAULT_STATE_FILE = Path(
    os.environ.get("FAULTLENS_RECEIVER_STATE", "/var/lib/faultlens-receiver/handled.jsonl")
)
MAX_BODY = 1024 * 1024  # a decision document is a few KB
READ_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 15.0  # the whole request, headers included
WORKERS = 8
BACKLOG = 64

Kubectl = Callable[[Sequence[str], str | None], None]


class ConflictError(ValueError):
    """A decision_id this receiver handled before, with other content: refused (409), never taken as
    a duplicate.
    """


def run_kubectl(args: Sequence[str], stdin: str | None = None) -> None:
    """The real boundary: kubectl with the pod's service account (or $KUBECONFIG)."""
    subprocess.run(
        ["kubectl", *args], input=stdin, text=True, check=True, capture_output=True, timeout=60
    )


def decision_digest(decision: dict) -> str:
    """sha256 of the decision's canonical JSON (the form faultlens signs: sorted keys, compact)."""
    canonical = json.dumps(decision, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class DecisionReceiver:
    """Turns one decision into kubectl actions; remembers handled decision ids and their digests in
    `state_file` (JSON lines, fsynced before the reply; None keeps them in memory only, which a
    restart forgets)."""

    def __init__(
        self,
        namespace: str,
        kubectl: Kubectl = run_kubectl,
        state_file: Path | None = DEFAULT_STATE_FILE,
    ) -> None:
        self.namespace = namespace
        self.kubectl = kubectl
        self.state_file = state_file
        # decision id -> digest (None: an older state line, id only)
        self.handled: dict[str, str | None] = {}
        if state_file is not None:
            state_file.parent.mkdir(parents=True, exist_ok=True)
            if state_file.exists():
                self.handled = _read_state(state_file)
        self.lock = threading.Lock()

    def handle(self, decision: dict) -> str:
        if not isinstance(decision, dict):
            raise ValueError("a decision is a JSON object")
        decision_id, job, action = (
            decision.get("decision_id"),
            decision.get("job_id") or "",
            decision.get("action"),
        )
        if (
            not isinstance(decision_id, str)
            or not decision_id
            or len(decision_id) > 200
            or not decision_id.isprintable()
        ):
            raise ValueError("decision_id: expected a printable string")
        if not isinstance(job, str) or not isinstance(action, str):
            raise ValueError(f"decision {decision_id}: job_id and action must be strings")
        digest = decision_digest(decision)
        with self.lock:
            if decision_id in self.handled:
                known = self.handled[decision_id]
                if known is not None and known != digest:
                    raise ConflictError(
                        f"decision {decision_id}: already handled with other content; refused"
                    )
                return "duplicate"
            if not _NAME.match(job.lower()):
                raise ValueError(f"decision {decision_id}: job id {job!r} is not a Kubernetes name")
            nodes = [
                n
                for n in decision.get("exclude_nodes") or []
                if isinstance(n, str) and _NAME.match(n)
            ]
            selector = f"{JOB_LABEL}={job}"
            if action in ("failover", "drain"):
                for node in nodes:
                    self.kubectl(["cordon", node], None)
            if action == "failover":
                restore = decision.get("restore") or {}
                if not isinstance(restore, dict):
                    raise ValueError(f"decision {decision_id}: restore must be an object")
                attempt = decision.get("attempt") or 0
                if not isinstance(attempt, int):
                    raise ValueError(f"decision {decision_id}: attempt must be an integer")
                data = {
                    "decision_id": decision_id,
                    "attempt": str(attempt + 1),
                    "tier": str(restore.get("tier") or ""),
                    "uri": str(restore.get("uri") or ""),
                    "step": "" if restore.get("step") is None else str(restore["step"]),
                }
                configmap = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": f"{job.lower()}-faultlens-restore",
                        "namespace": self.namespace,
                        "labels": {JOB_LABEL: job},
                    },
                    "data": data,
                }
                self.kubectl(["apply", "-f", "-"], json.dumps(configmap))
                self.kubectl(
                    ["-n", self.namespace, "delete", "pods", "-l", selector, "--wait=false"], None
                )
            elif action == "escalate":
                reason = str(decision.get("reason") or "")[:200]
                self.kubectl(
                    [
                        "-n",
                        self.namespace,
                        "annotate",
                        "pods",
                        "-l",
                        selector,
                        "--overwrite",
                        f"faultlens.io/escalated={decision_id}: {reason}",
                    ],
                    None,
                )
            elif action != "drain":
                raise ValueError(f"decision {decision_id}: unknown action {action!r}")
            self._remember(decision_id, digest)
            return "handled"

    def _remember(self, decision_id: str, digest: str) -> None:
        self.handled[decision_id] = digest
        if self.state_file is None:
            return
        line = json.dumps({"decision_id": decision_id, "sha256": digest}) + "\n"
        with self.state_file.open("a", encoding="utf-8") as state:
            state.write(line)
            state.flush()
            os.fsync(state.fileno())


def _read_state(path: Path) -> dict[str, str | None]:
    handled: dict[str, str | None] = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        raw = raw.strip()
        if not raw:
            continue
        if raw.startswith("{"):
            try:
                entry = json.loads(raw)
                handled[str(entry["decision_id"])] = entry.get("sha256")
            except (ValueError, KeyError, TypeError):
                log.warning("state file %s: skipping an unreadable line", path)
            continue
        handled[raw] = None  # the older format: one id per line
    return handled


class BoundedHTTPServer(HTTPServer):
    """An HTTPServer that hands a worker only a complete request.

    One gatherer thread reads every connection's request (headers and body) without blocking, under
    one deadline for the whole request (`request_timeout_s`, headers included: 408 when it passes);
    only a complete request goes to the fixed pool of `workers` threads. Slow or idle connections
    therefore never hold a worker, and at most `workers + backlog` of them are kept: when more
    arrive, the one that has been waiting longest is dropped, so a flood of trickling connections
    cannot keep a fresh, fast request out."""

    daemon_threads = True
    # the kernel's accept queue: connections are taken off it at once, see below
    request_queue_size = 128
    max_header_bytes = 64 * 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        workers: int = WORKERS,
        backlog: int = BACKLOG,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_body: int = MAX_BODY,
    ) -> None:
        super().__init__(address, handler)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="receiver")
        self._capacity = workers + backlog
        self._busy = threading.BoundedSemaphore(workers + backlog)  # complete, not yet answered
        self.request_timeout_s = request_timeout_s
        self.max_body = max_body
        self.buffered: dict[socket.socket, bytes] = {}  # complete requests handed to workers
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closed = threading.Event()
        self._gatherer = threading.Thread(
            target=self._gather, name="receiver-gatherer", daemon=True
        )
        self._gatherer.start()

    def process_request(self, request: socket.socket, client_address: object) -> None:
        self._incoming.put((request, client_address))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _gather(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        # socket -> [client address, bytes so far, deadline]; insertion order is arrival order
        pending: dict[socket.socket, list] = {}
        while not self._closed.is_set():
            for key, _ in selector.select(0.1):
                sock = key.fileobj
                if sock is self._wake_r:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                    continue
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # the client went away before its request was complete
                    selector.unregister(sock)
                    del pending[sock]
                    self.shutdown_request(sock)
                    continue
                pending[sock][1] += chunk
                status = self._complete(pending[sock][1])
                if status is None:
                    continue
                selector.unregister(sock)
                address, data, _ = pending.pop(sock)
                if status == 431:
                    self._refuse(sock, 431, "request headers too large")
                else:
                    self._dispatch(sock, address, bytes(data))
            while True:
                try:
                    sock, address = self._incoming.get_nowait()
                except queue.Empty:
                    break
                if len(pending) >= self._capacity:  # drop the one waiting longest
                    oldest = next(iter(pending))
                    selector.unregister(oldest)
                    del pending[oldest]
                    self._refuse(oldest, 503, "too many connections waiting; dropped")
                sock.setblocking(False)
                pending[sock] = [address, bytearray(), time.monotonic() + self.request_timeout_s]
                selector.register(sock, selectors.EVENT_READ)
            now = time.monotonic()
            for sock in [s for s, entry in pending.items() if entry[2] <= now]:
                selector.unregister(sock)
                del pending[sock]
                self._refuse(sock, 408, "request not received in time")
        for sock in pending:
            self.shutdown_request(sock)
        selector.close()

    def _complete(self, data: bytearray) -> int | None:
        """None while the request is incomplete; 200 when complete (headers, and the body its
        Content-Length announces when that is a byte count within max_body); 431 for headers too
        large. The handler judges everything else (411, 400, 413, a short body)."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return 431 if len(data) > self.max_header_bytes else None
        length = None
        for line in bytes(data[:end]).split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                text = value.strip()
                if text.isdigit() and len(text) <= 40 and int(text) <= self.max_body:
                    length = int(text)
                break
        if length is None or len(data) >= end + 4 + length:
            return 200
        return None

    def _refuse(self, sock: socket.socket, status: int, text: str) -> None:
        payload = text.encode()
        reply = (
            f"HTTP/1.0 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        ).encode() + payload
        with contextlib.suppress(OSError):
            sock.send(reply)  # best effort, never blocks (a client that reads nothing loses it)
        self.shutdown_request(sock)

    def _dispatch(self, sock: socket.socket, address: object, data: bytes) -> None:
        if not self._busy.acquire(blocking=False):
            self._refuse(sock, 503, "busy; retry")
            return
        sock.setblocking(True)
        self.buffered[sock] = data
        self._pool.submit(self._serve, sock, address)

    def _serve(self, request: socket.socket, client_address: object) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.buffered.pop(request, None)
            self.shutdown_request(request)
            self._busy.release()

    def handle_error(self, request: object, client_address: object) -> None:
        log.warning(
            "request from %s failed", client_address, exc_info=log.isEnabledFor(logging.DEBUG)
        )

    def server_close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        super().server_close()
        self._gatherer.join(timeout=2)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._wake_r.close()
        self._wake_w.close()


class _DecisionHandler(BaseHTTPRequestHandler):
    """One POSTed decision: size and time bounds, signature, then the receiver. make_server sets the
    class attributes below on a subclass per server."""

    receiver: DecisionReceiver
    secret: str
    path_served: str
    window_s: float
    accept_legacy_signature: bool
    max_body: int
    read_timeout_s: float
    timeout: float  # every socket read and write (headers too) is bounded
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive holding a worker

    def setup(self) -> None:
        super().setup()
        # the gatherer has read the whole request already: the handler reads it from memory
        self.rfile = io.BytesIO(self.server.buffered.get(self.request, b""))

    def do_POST(self) -> None:
        if self.path != self.path_served:
            self._reply(404, "not found")
            return
        length = self._content_length()
        if length is None:
            return
        body = self._read_body(length)
        if body is None:
            self._reply(408, "request body not received in time")
            return
        if len(body) != length:
            self._reply(400, "request body shorter than Content-Length")
            return
        reason = self._refusal(body)
        if reason is not None:
            self._reply(401, reason)
            return
        try:
            decision = json.loads(body)
            outcome = self.receiver.handle(decision)
        except ConflictError as exc:
            self._reply(409, str(exc))
            return
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            self._reply(422, str(exc)[:300] or type(exc).__name__)  # malformed: permanent (4xx)
            return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            log.warning(
                "decision %s: kubectl failed: %s",
                _printable(self.headers.get(DECISION_ID_HEADER)),
                exc,
            )
            self._reply(503, "kubectl failed; retry")  # faultlens retries 5xx with backoff
            return
        self._reply(200, outcome)

    def _read_body(self, length: int) -> bytes | None:
        """The body, read within 3 x read_timeout_s in all (a client trickling bytes cannot hold a
        worker).
        """
        deadline = time.monotonic() + 3 * self.read_timeout_s
        chunks, left = [], length
        try:
            while left > 0:
                if time.monotonic() > deadline:
                    return None
                chunk = (
                    self.rfile.read1(min(left, 65536))
                    if hasattr(self.rfile, "read1")
                    else self.rfile.read(min(left, 65536))
                )
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except (TimeoutError, OSError):
            return None
        return b"".join(chunks)

    def _content_length(self) -> int | None:
        raw = self.headers.get("Content-Length")
        if raw is None:
            self._reply(411, "Content-Length required")
            return None
        text = raw.strip()
        if not (text.isascii() and text.isdigit()):
            self._reply(400, "Content-Length is not a byte count")
            return None
        length = int(text[:40]) if len(text) <= 40 else self.max_body + 1
        if length > self.max_body:
            self._reply(413, f"body larger than {self.max_body} bytes")
            return None
        return length

    def _refusal(self, body: bytes) -> str | None:
        reason = verify_timestamped(
            self.secret,
            body,
            self.headers.get(TIMESTAMP_HEADER),
            self.headers.get(SIGNATURE_V2_HEADER),
            window_s=self.window_s,
        )
        if reason is None:
            return None
        if (
            self.accept_legacy_signature
            and self.headers.get(TIMESTAMP_HEADER) is None
            and verify_signature(self.secret, body, self.headers.get(SIGNATURE_HEADER))
        ):
            return None
        return reason

    def _reply(self, status: int, text: str) -> None:
        payload = text.encode("utf-8", "replace")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client went away

    def log_message(self, fmt: str, *args: object) -> None:
        log.info("%s " + fmt, self.address_string(), *args)


def make_server(
    receiver: DecisionReceiver,
    secret: str,
    host: str = "0.0.0.0",
    port: int = 8080,
    path: str = "/faultlens/decisions",
    *,
    window_s: float = DEFAULT_WINDOW_S,
    accept_legacy_signature: bool = False,
    max_body: int = MAX_BODY,
    read_timeout_s: float = READ_TIMEOUT_S,
    workers: int = WORKERS,
    backlog: int = BACKLOG,
    request_timeout_s: float | None = None,
) -> BoundedHTTPServer:
    attributes = {
        "receiver": receiver,
        "secret": secret,
        "path_served": path,
        "window_s": window_s,
        "accept_legacy_signature": accept_legacy_signature,
        "max_body": max_body,
        "read_timeout_s": read_timeout_s,
        "timeout": read_timeout_s,
    }
    handler = type("Handler", (_DecisionHandler,), attributes)
    if request_timeout_s is None:
        request_timeout_s = min(REQUEST_TIMEOUT_S, 3 * read_timeout_s)
    return BoundedHTTPServer(
        (host, port),
        handler,
        workers=workers,
        backlog=backlog,
        request_timeout_s=request_timeout_s,
        max_body=max_body,
    )


def _printable(value: object) -> str:
    return repr(value)[:100]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    parser.add_argument(
        "--state-file",
        type=Path,
        default=DEFAULT_STATE_FILE,
        help="handled decision ids (and digests) survive a restart here (default: "
        "%(default)s, or "
        "$FAULTLENS_RECEIVER_STATE)",
    )
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="keep handled ids in memory only (a restart forgets them: tests only)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        help="seconds a signed timestamp may be off (default: %(default)s)",
    )
    parser.add_argument(
        "--accept-legacy-signature",
        action="store_true",
        help="also accept body-only signatures without a timestamp (replayable; old senders)",
    )
    parser.add_argument(
        "--max-body", type=int, default=MAX_BODY, help="largest request body in bytes"
    )
    parser.add_argument(
        "--read-timeout", type=float, default=READ_TIMEOUT_S, help="seconds per socket read"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        help="seconds for a whole request, headers included (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=WORKERS, help="request worker threads")
    parser.add_argument(
        "--backlog", type=int, default=BACKLOG, help="connections waiting for a worker at most"
    )
    args = parser.parse_args()
    secret = os.environ.get("FAULTLENS_WEBHOOK_SECRET")
    if not secret:
        parser.error("set FAULTLENS_WEBHOOK_SECRET (the webhook hook's secret)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    receiver = DecisionReceiver(
        args.namespace, state_file=None if args.memory_only else args.state_file
    )
    server = make_server(
        receiver,
        secret,
        port=args.port,
        window_s=args.window,
        accept_legacy_signature=args.accept_legacy_signature,
        max_body=args.max_body,
        read_timeout_s=args.read_timeout,
        workers=args.workers,
        backlog=args.backlog,
        request_timeout_s=args.request_timeout,
    )
    log.info("listening on :%d", args.port)
    server.serve_forever()


if __name__ == "__main__":
    main()
