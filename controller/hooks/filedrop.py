"""File drop hook: write `<directory>/<decision_id>.json` atomically (temporary name, then rename). Writing the
same decision again replaces the file with identical content: idempotent by decision_id."""

from __future__ import annotations

import os
from pathlib import Path

from faultlens.attribution.decision import Decision
from faultlens.controller.hooks.base import HookError, RetryPolicy


class FileDropHook:
    def __init__(self, directory: str | Path, *, name: str = "file", retry: RetryPolicy | None = None) -> None:
        self.directory = Path(directory)
        self.name = name
        self.retry = retry

    def path_for(self, decision_id: str) -> Path:
        return self.directory / f"{decision_id}.json"

    def deliver(self, decision: Decision, document: str) -> None:
        target = self.path_for(decision.decision_id)
        temporary = self.directory / f".{decision.decision_id}.json.tmp-{os.getpid()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(document + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except OSError as exc:
            raise HookError(f"{target}: {exc.strerror or exc}") from None
        finally:
            if temporary.exists():
                temporary.unlink()
