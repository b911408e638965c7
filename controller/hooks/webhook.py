"""HTTP webhook hook: POST the decision JSON, signed with HMAC-SHA256.

Headers: `X-Faultlens-Signature: sha256=<hex HMAC-SHA256 of the body with the shared secret>`,
`X-Faultlens-Decision-Id` (a receiver recognises a duplicate delivery by it: deliveries are at-least-once),
`X-Faultlens-Delivery-Attempt`, `Content-Type: application/json`. 2xx is delivered; 408, 425, 429 and 5xx or a
connection error are retried with backoff; other 4xx are permanent for this pass.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import urllib.error
import urllib.request

from attribution.decision import Decision
from controller.hooks.base import HookError, PermanentHookError, RetryPolicy

SIGNATURE_HEADER = "X-Faultlens-Signature"
DECISION_ID_HEADER = "X-Faultlens-Decision-Id"
ATTEMPT_HEADER = "X-Faultlens-Delivery-Attempt"
RETRYABLE_STATUS = {408, 425, 429}


def sign(secret: bytes | str, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes | str, body: bytes, header: str | None) -> bool:
    """For receivers: does `header` (X-Faultlens-Signature) sign `body` with `secret`? Constant-time compare."""
    if not header:
        return False
    return hmac.compare_digest(sign(secret, body), header.strip())


class WebhookHook:
    def __init__(self, url: str, *, secret: str | bytes | None = None, secret_env: str | None = None,
                 name: str = "webhook", timeout_s: float = 10.0, headers: dict[str, str] | None = None,
                 retry: RetryPolicy | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook {name}: url {url!r}: expected http:// or https://")
        if secret is None and secret_env:
            secret = os.environ.get(secret_env)
            if not secret:
                raise ValueError(f"webhook {name}: secret_env {secret_env}: the variable is not set")
        if not secret:
            raise ValueError(f"webhook {name}: a secret (or secret_env) is required to sign deliveries")
        self.url = url
        self.secret = secret
        self.name = name
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.retry = retry
        self.attempts = 0

    def deliver(self, decision: Decision, document: str) -> None:
        body = document.encode()
        self.attempts += 1
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "User-Agent": "faultlens-webhook/1",
            SIGNATURE_HEADER: sign(self.secret, body),
            DECISION_ID_HEADER: decision.decision_id,
            ATTEMPT_HEADER: str(self.attempts),
        }
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            message = f"{self.url}: HTTP {exc.code} {exc.reason}"
            if exc.code in RETRYABLE_STATUS or exc.code >= 500:
                raise HookError(message) from None
            raise PermanentHookError(message) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise HookError(f"{self.url}: {reason}") from None
