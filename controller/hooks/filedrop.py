"""File drop hook: write `<directory>/<decision_id>.json` atomically (temporary name, then rename).
Writing the same decision again replaces the file with identical content: idempotent by decision_id.
"""

from __future__ import annotations

from pathlib import Path

from faultlens.attribution.decision import Decision
from faultlens.collectors.store.atomic import atomic_write
from faultlens.controller.hooks.base import HookError, RetryPolicy


class FileDropHook:
    def __init__(
        self, directory: str | Path, *, name: str = "file", retry: RetryPolicy | None = None
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.retry = retry

    def path_for(self, decision_id: str) -> Path:
        return self.directory / f"{decision_id}.json"

    def deliver(self, decision: Decision, document: str) -> None:
        target = self.path_for(decision.decision_id)
        try:
            atomic_write(target, document + "\n")
        except OSError as exc:
            raise HookError(f"{target}: {exc.strerror or exc}") from None
