"""Error files: a worker's error.json (torch's @record) or torchrun's TORCHELASTIC_ERROR_FILE into
one error row.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from pathlib import Path
from typing import Any

from faultlens.collectors.artifacts.fingerprint import parse_traceback, split_exception_line
from faultlens.collectors.sources.process_events.rows import (
    EventContext,
    ProcessEventsError,
    Source,
    error_row,
    mtime_ns,
)
from faultlens.collectors.sources.process_rules import ProcessRules

#: a torch error file is a message and a traceback: KBs; a deep recursion's traceback ~1 MB
MAX_ERROR_FILE_BYTES = 16 * 1024 * 1024


def rows_from_error_file(
    path: str | Path,
    context: EventContext | None = None,
    *,
    rank: int | None = None,
    local_rank: int | None = None,
    rules: ProcessRules | None = None,
) -> list[dict[str, Any]]:
    """A worker's error.json (torch's @record) or torchrun's TORCHELASTIC_ERROR_FILE (which adds
    errorCode and is the root cause torchrun chose): one error row."""
    path = Path(path)
    context = context or EventContext()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with open(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ProcessEventsError(f"{path}: not a regular file: refused unread")
            data_bytes = handle.read(MAX_ERROR_FILE_BYTES + 1)
    except OSError as exc:
        raise ProcessEventsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data_bytes) > MAX_ERROR_FILE_BYTES:
        raise ProcessEventsError(
            f"{path}: larger than any torch error file (limit {MAX_ERROR_FILE_BYTES} bytes)"
        )
    raw = data_bytes.decode("utf-8", errors="replace")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ProcessEventsError(f"{path}: not a torch error file: nested too deep") from None
    except json.JSONDecodeError as exc:
        raise ProcessEventsError(f"{path}: not a torch error file: invalid JSON at line "
                                 f"{exc.lineno} "
                                 f"column {exc.colno}") from None
    if not isinstance(data, dict) or "message" not in data:
        raise ProcessEventsError(f"{path}: not a torch error file: expected an object with a "
                                 "'message' key")
    message_field = data["message"]
    error_code = None
    if isinstance(message_field, str):
        text, callstack, timestamp = message_field, None, data.get("timestamp")
    elif isinstance(message_field, dict):
        text = message_field.get("message")
        extra = message_field.get("extraInfo") or {}
        if not isinstance(text, str) or not isinstance(extra, dict):
            raise ProcessEventsError(f"{path}: not a torch error file: 'message.message' must be "
                                     "text and "
                                     "'message.extraInfo' an object")
        callstack, timestamp = extra.get("py_callstack"), extra.get("timestamp")
        error_code = message_field.get("errorCode")
    else:
        raise ProcessEventsError(f"{path}: not a torch error file: 'message' must be text or an "
                                 "object")
    try:
        ts: dt.datetime | int = (
            dt.datetime.fromtimestamp(int(timestamp), dt.UTC)
            if timestamp not in (None, "")
            else mtime_ns(path)
        )
    except (TypeError, ValueError, OverflowError, OSError):
        raise ProcessEventsError(
            f"{path}: timestamp {timestamp!r} is not seconds since the epoch"
        ) from None
    exception_type, message = split_exception_line(text)
    parsed = parse_traceback(callstack) if isinstance(callstack, str) else None
    row = error_row(
        context,
        ts,
        source=Source.ERROR_JSON,
        exception_type=exception_type,
        message=message,
        traceback=callstack if isinstance(callstack, str) else None,
        parsed=parsed,
        rules=rules,
        rank=rank,
        local_rank=local_rank,
        error_file=str(path),
        exit_code=int(error_code) if isinstance(error_code, int) else None,
        reported_root_cause=True if error_code is not None else None,
    )
    return [row]
