"""Collecting: rows from any mix of log directories, torchrun stderr files and error files, with the
ranks and job ids one input knows filled into the rows of another, and repeats dropped."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from faultlens.collectors.sources.process_events.error_file import rows_from_error_file
from faultlens.collectors.sources.process_events.log_dirs import (
    find_worker_dirs,
    rows_from_worker_dir,
)
from faultlens.collectors.sources.process_events.rows import (
    TABLE,
    EventContext,
    ProcessEventsError,
    Source,
    mtime_ns,
)
from faultlens.collectors.sources.process_events.torchrun import rows_from_torchrun_output
from faultlens.collectors.sources.process_rules import ProcessRules, load_process_rules
from faultlens.collectors.store.schema import rows_to_table


@dataclass
class CollectResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line each, naming the file
    files: int = 0
    run_ids: set[str] = field(default_factory=set)  # runs whose log directories were read

    def table(self) -> pa.Table:
        return rows_to_table(TABLE, self.rows)


def looks_like_error_file(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b"{")


def collect_paths(paths: Iterable[str | Path], context: EventContext | None = None,
                  rules: ProcessRules | None = None) -> CollectResult:
    """Rows from any mix of log directories, torchrun stderr files and error files. A file that
    cannot be read is an error naming it; the other files' rows are still returned. Ranks missing in
    log-dir rows are filled from a torchrun report given alongside (its error_file paths name
    attempt and local rank)."""
    context = context or EventContext()
    rules = rules or load_process_rules()
    result = CollectResult()
    for raw in paths:
        path = Path(raw)
        try:
            if path.is_dir():
                workers = find_worker_dirs(path)
                if not workers:
                    raise ProcessEventsError(f"{path}: no torchrun log directory inside "
                                             "(expected <run>/attempt_<n>/<local rank>/)")
                result.run_ids.update(worker.run_id for worker in workers)
                for worker in workers:
                    try:
                        result.rows.extend(rows_from_worker_dir(worker, context, rules))
                        result.files += 1
                    except ProcessEventsError as exc:
                        result.errors.append(str(exc))
            elif path.is_file():
                if looks_like_error_file(path):
                    result.rows.extend(rows_from_error_file(path, context, rules=rules))
                else:
                    result.rows.extend(_rows_from_text_file(path, context, rules))
                result.files += 1
            else:
                raise ProcessEventsError(f"{path}: no such file or directory")
        except ProcessEventsError as exc:
            result.errors.append(str(exc))
    _fill_ranks_from_reports(result.rows)
    _fill_job_from_log_dirs(result.rows, result.run_ids)
    result.rows = _without_repeats(result.rows)
    return result


def _rows_from_text_file(
    path: Path, context: EventContext, rules: ProcessRules
) -> list[dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProcessEventsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in raw[:4096]:
        raise ProcessEventsError(f"{path}: binary data, not torchrun output")
    text = raw.decode("utf-8", errors="replace")
    rows = rows_from_torchrun_output(
        text, context, source_name=str(path), fallback_ts=mtime_ns(path), rules=rules
    )
    if not rows and text.strip() and not _mentions_torchrun(text):
        raise ProcessEventsError(f"{path}: neither a torchrun failure report nor worker output (no "
                                 "traceback, "
                                 "no recognised error line)")
    return rows


def _mentions_torchrun(text: str) -> bool:
    """Output of a torchrun run that went well: its own lines or its workers' teed lines."""
    return ("torch.distributed" in text or "torch/distributed" in text or "OMP_NUM_THREADS" in text
            or bool(re.search(r"^\[default\d+\]:", text, re.MULTILINE)))


def _fill_job_from_log_dirs(rows: list[dict[str, Any]], run_ids: set[str]) -> None:
    """A report whose failures all died by signal names no error file, hence no run id: when exactly
    one run's log directory was given too, that run is the report's."""
    jobs = set(run_ids) | {row["job_id"] for row in rows
                           if row.get("source") == Source.ERROR_JSON and row.get("job_id")}
    if len(jobs) != 1:
        return
    job = jobs.pop()
    for row in rows:
        if row.get("job_id") is None and row.get("source") in (
            Source.TORCHRUN_REPORT,
            Source.STDERR,
        ):
            row["job_id"] = job


def _without_repeats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same worker traceback seen in its stderr.log and again in torchrun's teed output, or
    already in its error.json, is kept once (the error.json row, which has the exact time)."""
    def key(row: dict[str, Any]) -> tuple:
        return (
            row.get("job_id"),
            row.get("attempt"),
            row.get("rank"),
            row.get("kind"),
            row.get("fingerprint"),
        )

    structured = {key(row) for row in rows if row.get("source") == Source.ERROR_JSON}
    kept, seen = [], set()
    for row in rows:
        if row.get("source") == Source.STDERR:
            if key(row) in structured or key(row) in seen:
                continue
            seen.add(key(row))
        kept.append(row)
    return kept


def _fill_ranks_from_reports(rows: list[dict[str, Any]]) -> None:
    """error.json rows of a log dir know attempt and local rank; a torchrun report row with the same
    error file knows the global rank."""
    by_file = {
        row["error_file"]: row["rank"]
        for row in rows
        if row.get("source") == Source.TORCHRUN_REPORT
        and row.get("error_file")
        and row.get("rank") is not None
    }
    if not by_file:
        return
    resolved = {os.path.realpath(path): rank for path, rank in by_file.items()}
    for row in rows:
        if row.get("rank") is None and row.get("error_file"):
            rank = by_file.get(row["error_file"], resolved.get(os.path.realpath(row["error_file"])))
            if rank is not None:
                row["rank"] = rank
