"""torchrun --log-dir trees: the worker directories under one, and one worker directory (error.json,
the tail of stderr.log) into rows."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlens.collectors.sources.process_events.error_file import rows_from_error_file
from faultlens.collectors.sources.process_events.rows import (
    EventContext,
    ProcessEventsError,
    mtime_ns,
)
from faultlens.collectors.sources.process_events.stderr import (
    WorkerStream,
    rows_from_stream,
    split_worker_streams,
)
from faultlens.collectors.sources.process_events.torchrun import run_id_from_dir
from faultlens.collectors.sources.process_rules import ProcessRules, load_process_rules

#: how much of a worker's stderr.log is read (its tail: the end is where the failure is)
STDERR_TAIL_BYTES = 256 * 1024
_ATTEMPT_DIR_RE = re.compile(r"^attempt_(\d+)$")


@dataclass(frozen=True)
class WorkerLogDir:
    """<log dir>/<run id>_<suffix>/attempt_<n>/<local rank>/"""

    path: Path
    run_id: str
    attempt: int
    local_rank: int


def find_worker_dirs(root: str | Path) -> list[WorkerLogDir]:
    """Every worker directory under a torchrun --log-dir (the base, a run directory or an attempt
    directory).
    """
    root = Path(root)
    found = []
    for attempt_dir in sorted(
        {*root.glob("attempt_*"), *root.glob("*/attempt_*"), *root.glob("*/*/attempt_*")}
        | ({root} if _ATTEMPT_DIR_RE.match(root.name) else set())
    ):
        match = _ATTEMPT_DIR_RE.match(attempt_dir.name)
        if not match or not attempt_dir.is_dir():
            continue
        for worker in sorted(attempt_dir.iterdir()):
            if worker.is_dir() and worker.name.isdigit():
                found.append(
                    WorkerLogDir(
                        worker,
                        run_id_from_dir(attempt_dir.parent.name),
                        int(match.group(1)),
                        int(worker.name),
                    )
                )
    return found


def _read_tail(path: Path, limit: int = STDERR_TAIL_BYTES) -> str:
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - limit))
        data = handle.read()
    text = data.decode("utf-8", errors="replace")
    return text.split("\n", 1)[1] if size > limit and "\n" in text else text


def rows_from_worker_dir(worker: WorkerLogDir, context: EventContext | None = None,
                         rules: ProcessRules | None = None) -> list[dict[str, Any]]:
    """One worker directory: its error.json row and its stderr tail's rows (a traceback already in
    error.json is not repeated). The global rank comes from torch's '[rankN]:' prefixes in stderr
    when they are there."""
    context = context or EventContext()
    rules = rules or load_process_rules()
    row_context = EventContext(
        context.node,
        context.cluster,
        context.job_id or worker.run_id,
        context.attempt if context.attempt is not None else worker.attempt,
        context.tz,
    )
    stderr_path = worker.path / "stderr.log"
    streams: list[WorkerStream] = []
    if stderr_path.is_file():
        try:
            text = _read_tail(stderr_path)
        except OSError as exc:
            raise ProcessEventsError(f"{stderr_path}: cannot read: {exc.strerror or exc}") from None
        streams, _ = split_worker_streams(text.splitlines(), default_local_rank=worker.local_rank)
    ranks = {s.rank for s in streams if s.rank is not None}
    rank = ranks.pop() if len(ranks) == 1 else None
    rows: list[dict[str, Any]] = []
    error_path = worker.path / "error.json"
    if error_path.is_file():
        rows.extend(
            rows_from_error_file(
                error_path, row_context, rank=rank, local_rank=worker.local_rank, rules=rules
            )
        )
    known = frozenset(r["fingerprint"] for r in rows if r.get("fingerprint"))
    fallback = mtime_ns(stderr_path)
    for stream in streams:
        rows.extend(
            rows_from_stream(
                stream.lines,
                row_context,
                rank=stream.rank if stream.rank is not None else rank,
                local_rank=worker.local_rank,
                fallback_ts=fallback,
                rules=rules,
                skip_fingerprints=known,
            )
        )
    return rows
