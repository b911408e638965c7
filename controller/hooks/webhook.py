"""HTTP webhook hook: POST the decision JSON, signed with HMAC-SHA256.

Headers: `X-Faultlens-Signature: sha256=<hex HMAC-SHA256 of the body with the shared secret>`,
`X-Faultlens-Timestamp: <unix seconds when sent>` and `X-Faultlens-Signature-V2: sha256=<hex
HMAC-SHA256 of "<timestamp>." + body>` (a receiver refuses a signed timestamp outside its window, so
a captured request cannot be replayed later), `X-Faultlens-Decision-Id` (a receiver recognises a
duplicate delivery by it: deliveries are at-least-once), `X-Faultlens-Delivery-Attempt` (1, 2, ...
for each decision, counted per decision by this hook object), `Content-Type: application/json`. 2xx
is delivered; 408, 425, 429 and 5xx or a connection error are retried with backoff; other 4xx are
permanent for this pass.

Transport rules: `timeout_s` is one deadline for the whole exchange (connect, send, status line,
headers, body), not per read: at the deadline the socket is shut down. At most `max_response_bytes`
of the response body are read (a 200 with a huge body is delivered: the status decides).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable

from faultlens.attribution.decision import Decision
from faultlens.controller.hooks.base import HookError, PermanentHookError, RetryPolicy

SIGNATURE_HEADER = "X-Faultlens-Signature"
DECISION_ID_HEADER = "X-Faultlens-Decision-Id"
ATTEMPT_HEADER = "X-Faultlens-Delivery-Attempt"
TIMESTAMP_HEADER = "X-Faultlens-Timestamp"
SIGNATURE_V2_HEADER = "X-Faultlens-Signature-V2"
RETRYABLE_STATUS = {408, 425, 429}
DEFAULT_WINDOW_S = 300.0  # how far a signed timestamp may be from the receiver's clock
# decisions whose attempt count a hook object keeps (oldest forgotten first)
_ATTEMPTS_REMEMBERED = 10_000
MAX_RESPONSE_BYTES = 64 * 1024  # of a response body, read at most (the status decides)


def sign(secret: bytes | str, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes | str, body: bytes, header: str | None) -> bool:
    """For receivers: does `header` (X-Faultlens-Signature) sign `body` with `secret`? Constant-time
    compare. A header that is not ASCII is simply not a signature (never an exception)."""
    if not header or not isinstance(header, str) or not header.isascii():
        return False
    return hmac.compare_digest(sign(secret, body).encode(), header.strip().encode())


def sign_timestamped(secret: bytes | str, timestamp: int, body: bytes) -> str:
    """X-Faultlens-Signature-V2: HMAC-SHA256 of `<timestamp>.` + body."""
    key = secret.encode() if isinstance(secret, str) else secret
    return (
        "sha256="
        + hmac.new(key, str(int(timestamp)).encode() + b"." + body, hashlib.sha256).hexdigest()
    )


def verify_timestamped(
    secret: bytes | str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    *,
    now: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
) -> str | None:
    """For receivers: None when X-Faultlens-Signature-V2 signs `<timestamp>.body` and the timestamp
    is within `window_s` of `now`; else the reason to refuse (one line). Never raises on hostile
    headers."""
    if not timestamp or not signature:
        return "missing signed timestamp"
    if not (
        isinstance(timestamp, str)
        and timestamp.isascii()
        and timestamp.strip().isdigit()
        and len(timestamp.strip()) <= 12
    ):
        return "timestamp is not unix seconds"
    if not isinstance(signature, str) or not signature.isascii():
        return "bad signature"
    value = int(timestamp.strip())
    expected = sign_timestamped(secret, value, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        return "bad signature"
    skew = abs((time.time() if now is None else now) - value)
    if skew > window_s:
        return (
            f"timestamp outside the {window_s:g} s window (off by {skew:.0f} s): a replay or a "
            "wrong clock"
        )
    return None


class WebhookHook:
    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes | None = None,
        secret_env: str | None = None,
        name: str = "webhook",
        timeout_s: float = 10.0,
        headers: dict[str, str] | None = None,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.time,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook {name}: url {url!r}: expected http:// or https://")
        if secret is None and secret_env:
            secret = os.environ.get(secret_env)
            if not secret:
                raise ValueError(
                    f"webhook {name}: secret_env {secret_env}: the variable is not set"
                )
        if not secret:
            raise ValueError(
                f"webhook {name}: a secret (or secret_env) is required to sign deliveries"
            )
        self.url = url
        self.secret = secret
        self.name = name
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.retry = retry
        self.max_response_bytes = max_response_bytes
        self.attempts = 0  # deliveries made by this hook object, all decisions together
        self._clock = clock
        self._per_decision: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def attempt_of(self, decision_id: str) -> int:
        """How many deliveries of this decision this hook object has made."""
        with self._lock:
            return self._per_decision.get(decision_id, 0)

    def _next_attempt(self, decision_id: str) -> int:
        with self._lock:
            self.attempts += 1
            attempt = self._per_decision.pop(decision_id, 0) + 1
            self._per_decision[decision_id] = attempt
            while len(self._per_decision) > _ATTEMPTS_REMEMBERED:
                self._per_decision.popitem(last=False)
            return attempt

    def deliver(self, decision: Decision, document: str) -> None:
        body, headers = self.signed_request(decision, document)
        status, reason = self._exchange(body, headers)
        message = f"{self.url}: HTTP {status} {reason}"
        if 200 <= status < 300:
            return
        if status in RETRYABLE_STATUS or status >= 500:
            raise HookError(message)
        raise PermanentHookError(message)

    def signed_request(self, decision: Decision, document: str) -> tuple[bytes, dict[str, str]]:
        """The body and headers of the next delivery of `decision` (counts an attempt)."""
        body = document.encode()
        attempt = self._next_attempt(decision.decision_id)
        timestamp = int(self._clock())
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "User-Agent": "faultlens-webhook/1",
            SIGNATURE_HEADER: sign(self.secret, body),
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_V2_HEADER: sign_timestamped(self.secret, timestamp, body),
            DECISION_ID_HEADER: decision.decision_id,
            ATTEMPT_HEADER: str(attempt),
        }
        return body, headers

    def _exchange(self, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        """POST under one deadline; the status and reason. HookError on a transport failure."""
        parts = urllib.parse.urlsplit(self.url)
        deadline = time.monotonic() + self.timeout_s
        connection_type = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        try:
            connection = connection_type(parts.hostname or "", parts.port, timeout=self.timeout_s)
        except (ValueError, http.client.HTTPException) as exc:
            raise PermanentHookError(f"{self.url}: {exc}") from None
        expired = threading.Event()

        def cut() -> None:  # the deadline: whatever the exchange is waiting for, it ends now
            expired.set()
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout_s, cut)
        timer.daemon = True
        timer.start()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            if expired.is_set():  # the headers were cut short by the deadline: no answer
                raise TimeoutError("deadline")
            left = self.max_response_bytes
            try:  # the status decides: a body cut short (deadline, hang-up) changes nothing
                while left > 0 and time.monotonic() < deadline:
                    chunk = response.read1(min(left, 65536))
                    if not chunk:
                        break
                    left -= len(chunk)
            except (OSError, http.client.HTTPException):
                pass
            return response.status, response.reason
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if expired.is_set():
                raise HookError(
                    f"{self.url}: no complete answer within {self.timeout_s:g}s"
                ) from None
            raise HookError(f"{self.url}: {type(exc).__name__}: {exc}"[:400]) from None
        finally:
            timer.cancel()
            connection.close()
