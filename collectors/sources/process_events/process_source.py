"""ProcessSource: the node agent's Source of process_events (supervisor-recorded starts and exits,
watched paths re-read when they change, each row emitted once)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from faultlens.collectors.sources.process_events.collect import collect_paths
from faultlens.collectors.sources.process_events.rows import (
    TABLE,
    EventContext,
    Source,
    exit_row,
    start_row,
)
from faultlens.collectors.sources.process_rules import ProcessRules, load_process_rules
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.schema import rows_to_table

log = logging.getLogger("faultlens.collectors.sources.process_events")  # its name as one module


class ProcessSource:
    """A Source of process_events: supervisor-recorded starts and exits, plus the rows of watched
    paths (log dirs, torchrun stderr files, error files), re-read when they change; each row is
    emitted once. Never raises."""

    name = "process"

    def __init__(
        self,
        identity: NodeIdentity,
        *,
        paths: Sequence[str | Path] = (),
        rules: ProcessRules | None = None,
        clock: Callable[[], int] = time.time_ns,
        tz: dt.tzinfo | None = None,
    ) -> None:
        self.context = EventContext.from_identity(identity, tz)
        self.paths = [Path(p) for p in paths]
        self.rules = rules or load_process_rules()
        self._clock = clock
        self._pending: list[dict[str, Any]] = []
        self._seen_files: dict[str, tuple[int, int]] = {}
        self._emitted: set[tuple] = set()
        self.errors = 0
        self.last_error: str | None = None

    def record_start(self, *, rank: int | None, local_rank: int | None, pid: int | None,
                     attempt: int | None = None) -> None:
        context = self._context(attempt)
        self._pending.append(
            start_row(context, self._clock(), rank=rank, local_rank=local_rank, pid=pid)
        )

    def record_exit(
        self,
        *,
        rank: int | None,
        local_rank: int | None,
        pid: int | None,
        returncode: int,
        attempt: int | None = None,
        terminated_by_us: bool = False,
    ) -> None:
        """An exit seen by the supervisor (Popen returncode: negative for a signal).
        terminated_by_us: the supervisor itself sent the signal (a survivor being shut down): the
        row is secondary."""
        context = self._context(attempt)
        self._pending.append(
            exit_row(
                context,
                self._clock(),
                source=Source.SUPERVISOR,
                exit_code=returncode,
                is_secondary=terminated_by_us,
                rank=rank,
                local_rank=local_rank,
                pid=pid,
            )
        )

    def _context(self, attempt: int | None) -> EventContext:
        c = self.context
        return EventContext(
            c.node, c.cluster, c.job_id, attempt if attempt is not None else c.attempt, c.tz
        )

    def poll(self) -> Mapping[str, pa.RecordBatch]:
        rows, self._pending = self._pending, []
        for path in self.paths:
            try:
                if self._changed(path):
                    found = collect_paths([path], self.context, self.rules)
                    rows.extend(found.rows)
                    for error in found.errors:
                        self._failed(error)
            except Exception as exc:
                self._failed(f"{path}: {type(exc).__name__}: {exc}")
        fresh = []
        for row in rows:
            key = tuple(sorted((k, v) for k, v in row.items() if k != "traceback"))
            if key not in self._emitted:
                self._emitted.add(key)
                fresh.append(row)
        if not fresh:
            return {}
        try:
            return {TABLE: rows_to_table(TABLE, fresh).to_batches()[0]}
        except Exception as exc:
            self._failed(f"rows: {type(exc).__name__}: {exc}")
            return {}

    def _changed(self, path: Path) -> bool:
        try:
            stats = [path.stat()] + (
                [p.stat() for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
            )
        except OSError:
            return False
        if path.is_dir() and len(stats) == 1:
            # a watched log dir torchrun has not filled yet: nothing to read, nothing wrong
            return False
        signature = (sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats))
        key = str(path)
        if self._seen_files.get(key) == signature:
            return False
        self._seen_files[key] = signature
        return True

    def _failed(self, message: str) -> None:
        self.errors += 1
        self.last_error = message
        if self.errors <= 10:
            log.warning("process source: %s", message)

    def close(self) -> None:
        self._pending.clear()
