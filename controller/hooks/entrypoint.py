"""Hooks provided by other packages through the entry-point group `faultlens.hooks`.

A distribution declares e.g. `[project.entry-points."faultlens.hooks"] k8s =
"myop.faultlens:OperatorHook"`; the loaded object is either a hook (has `deliver`) or a factory
(class or function) called with the configured options, returning one.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from faultlens.controller.hooks.base import Hook, RetryPolicy
from faultlens.errors import FaultlensError

GROUP = "faultlens.hooks"


class EntryPointHookError(LookupError, FaultlensError):
    """The named entry point is not installed or does not give a hook."""


def available() -> dict[str, str]:
    """Installed hook entry points: name -> 'module:attr'."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def load_entry_point_hook(
    entry_point: str,
    options: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
) -> Hook:
    matches = [ep for ep in entry_points(group=GROUP) if ep.name == entry_point]
    if not matches:
        known = ", ".join(sorted(available())) or "none installed"
        raise EntryPointHookError(f"entry point {entry_point!r} not found in group {GROUP} (known: "
                                  f"{known})")
    try:
        target = matches[0].load()
    except Exception as exc:
        raise EntryPointHookError(f"entry point {entry_point!r} ({matches[0].value}): cannot load: "
                                  f"{type(exc).__name__}: {exc}") from None
    hook = (
        target
        if hasattr(target, "deliver") and not isinstance(target, type)
        else target(**dict(options or {}))
    )
    if not callable(getattr(hook, "deliver", None)):
        raise EntryPointHookError(f"entry point {entry_point!r} ({matches[0].value}) gives no "
                                  "object with deliver()")
    hook_name = name or getattr(hook, "name", None) or entry_point
    try:
        hook.name = hook_name
        if retry is not None:
            hook.retry = retry
    except AttributeError:
        hook = _Named(hook, hook_name, retry)
    return hook


class _Named:
    def __init__(self, inner: Any, name: str, retry: RetryPolicy | None) -> None:
        self.inner = inner
        self.name = name
        self.retry = retry

    def deliver(self, decision: Any, document: str) -> None:
        self.inner.deliver(decision, document)
