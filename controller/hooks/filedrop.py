"""File drop hook: write `<directory>/<decision_id>.json` atomically (temporary name, then rename).
Writing the same decision again replaces the file with identical content: idempotent by decision_id.
Once dropped, the decision id is recorded in `<directory>/.delivered/<decision_id>`: a redelivery
after a consumer took the file away (applied it, removed it) is not dropped again.
"""

from __future__ import annotations

from pathlib import Path

from faultlens.attribution.decision import Decision
from faultlens.collectors.store.atomic import atomic_write
from faultlens.controller.hooks.base import HookError, RetryPolicy

LEDGER = ".delivered"  # under the drop directory: one empty file per decision id dropped


class FileDropHook:
    def __init__(
        self, directory: str | Path, *, name: str = "file", retry: RetryPolicy | None = None
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.retry = retry

    def path_for(self, decision_id: str) -> Path:
        return self.directory / f"{decision_id}.json"

    def marker_for(self, decision_id: str) -> Path:
        return self.directory / LEDGER / decision_id

    def deliver(self, decision: Decision, document: str) -> None:
        target = self.path_for(decision.decision_id)
        marker = self.marker_for(decision.decision_id)
        try:
            if marker.exists():
                return  # dropped before; its consumer may have applied and removed it
            atomic_write(target, document + "\n")
            marker.parent.mkdir(exist_ok=True)
            marker.touch()
        except OSError as exc:
            raise HookError(f"{target}: {exc.strerror or exc}") from None
