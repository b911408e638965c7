"""Progress for long commands (simulate, eval, batch attribute): a rich bar or spinner on stderr
when stderr is a terminal, nothing at all otherwise (pipes, log files, CI). FAULTLENS_PROGRESS=0/1
forces it off/on."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from faultlens import environment


def enabled(stream: Any = None) -> bool:
    forced = environment.PROGRESS.get(default="")
    if forced in ("0", "1"):
        return forced == "1"
    stream = stream or sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Task:
    """One bar (total known) or spinner (total None); all methods do nothing when progress is off.
    """

    def __init__(self, progress: Any = None, task_id: Any = None) -> None:
        self._progress, self._id = progress, task_id

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        if self._progress is not None:
            kwargs: dict[str, Any] = {}
            if completed is not None:
                kwargs["completed"] = completed
            if total is not None:
                kwargs["total"] = total
            if description is not None:
                kwargs["description"] = description
            self._progress.update(self._id, **kwargs)

    def advance(self, amount: float = 1.0) -> None:
        if self._progress is not None:
            self._progress.advance(self._id, amount)


@contextmanager
def progress(description: str, total: float | None = None, *, stream: Any = None) -> Iterator[Task]:
    """`with progress("simulating", total=1.0) as task: task.update(completed=0.4)`; transient (the
    bar is gone when the block ends, the command's own output stays)."""
    if not enabled(stream):
        yield Task()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
    if total is not None:
        columns += [BarColumn(), TaskProgressColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=Console(file=stream or sys.stderr), transient=True) as bar:
        yield Task(bar, bar.add_task(description, total=total))
