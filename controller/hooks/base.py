"""What a decision hook is: an object with a `name` and `deliver(decision, document)` that raises on
failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from faultlens.attribution.decision import Decision
from faultlens.errors import FaultlensError


class HookError(RuntimeError, FaultlensError):
    """A delivery failed and may succeed later (retried with backoff, then by a redelivery pass)."""


class PermanentHookError(HookError):
    """A delivery failed in a way a retry will not fix now (e.g. HTTP 400/401): no more attempts in
    this pass; the decision stays `failed` for that hook and a later redelivery pass tries again."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: attempts in total, the first delay, the growth factor, the longest
    delay.
    """

    attempts: int = 4
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0

    def delays(self) -> Iterator[float]:
        """The sleeps between attempts (attempts - 1 of them)."""
        delay = self.initial_s
        for _ in range(max(self.attempts - 1, 0)):
            yield min(delay, self.max_s)
            delay *= self.factor


@runtime_checkable
class Hook(Protocol):
    name: str

    def deliver(self, decision: Decision, document: str) -> None:
        """Hand over one decision (`document` is its canonical JSON). Must be idempotent by
        decision_id: it may be called again with the same decision (at-least-once delivery)."""
        ...
