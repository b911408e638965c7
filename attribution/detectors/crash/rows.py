"""process_events rows one at a time: a column's value, the signal that ended a process, a death's identity, the
attempt a row belongs to, a row in words."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from faultlens.attribution.detectors.crash.failures import SIGNALS_BY_NUMBER


def _get(row: Any, key: str) -> Any:
    value = row.get(key) if isinstance(row, dict) else (row[key] if key in row.index else None)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value


def signal_of(row: Any) -> str | None:
    """The signal that ended a process: the row's `signal`, or decoded from exit codes -N and 128+N."""
    signal = _get(row, "signal")
    if signal:
        text = str(signal).upper()
        return text if text.startswith("SIG") else f"SIG{text}"
    return _signal_from_code(_get(row, "exit_code"), _get(row, "kind"))


def _matches(text: pd.Series, pattern: re.Pattern[str] | None) -> pd.Series:
    if pattern is None:
        return pd.Series(False, index=text.index)
    return text.map(lambda value: bool(value) and pattern.search(value) is not None).astype(bool)


def _signal_from_code(code: Any, kind: Any) -> str | None:
    if code is None or code != code:
        return None
    code = int(code)
    if code < 0:
        return SIGNALS_BY_NUMBER.get(-code, f"SIG{-code}")
    if 128 < code < 160 and kind == "exit":
        return SIGNALS_BY_NUMBER.get(code - 128)
    return None


def signal_identity(signal: Any, rank: Any) -> str | None:
    """The identity of a death by signal (it has no traceback fingerprint): `<signal>@rank<global rank>`."""
    if not signal or rank is None or rank is pd.NA:
        return None
    return f"{signal}@rank{int(rank)}"


def _attempt_keys(frame: pd.DataFrame) -> pd.Series:
    job = frame["job_id"].astype(object).where(frame["job_id"].notna(), "") if "job_id" in frame.columns else ""
    attempt = frame["attempt"].astype(object).where(frame["attempt"].notna(), -1) \
        if "attempt" in frame.columns else -1
    return pd.Series(list(zip(pd.Series(job, index=frame.index), pd.Series(attempt, index=frame.index),
                              strict=True)), index=frame.index, dtype=object)


def describe_process_event(row: Any) -> str:
    rank = _get(row, "rank")
    node = _get(row, "node")
    who = f"rank {int(rank)}" if rank is not None else "a process"
    if node:
        who += f" on {node}"
    kind = _get(row, "kind")
    if kind == "exit":
        signal = signal_of(row)
        what = f"exited with code {_get(row, 'exit_code')}" + (f" ({signal})" if signal else "")
    else:
        first = (_get(row, "message") or "").strip().splitlines()
        what = f"{kind}: " + (f"{_get(row, 'exception_type')}: " if _get(row, "exception_type") and not (
            first and first[0].startswith(str(_get(row, "exception_type")))) else "") + (first[0] if first else "")
    source = _get(row, "source")
    return f"{who} {what.strip()}" + (f" [{source}]" if source else "")
