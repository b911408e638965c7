"""process_events rows one at a time: a column's value, the signal that ended a process, a death's
identity, the attempt a row belongs to, a row in words."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from faultlens.attribution.detectors.crash.failures import SIGNALS_BY_NUMBER


def row_value(row: Any, key: str) -> Any:
    """A column's value in one row (a dict or a pandas row); None where it is missing, NA or NaN."""
    value = row.get(key) if isinstance(row, dict) else (row[key] if key in row.index else None)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value


def signal_of(row: Any) -> str | None:
    """The signal that ended a process: the row's `signal`, or decoded from exit codes -N and 128+N.
    """
    signal = row_value(row, "signal")
    if signal:
        text = str(signal).upper()
        return text if text.startswith("SIG") else f"SIG{text}"
    return signal_from_code(row_value(row, "exit_code"), row_value(row, "kind"))


def text_matches(text: pd.Series, pattern: re.Pattern[str] | None) -> pd.Series:
    """Per row, whether its text matches `pattern` (none: no row)."""
    if pattern is None:
        return pd.Series(False, index=text.index)
    return text.map(lambda value: bool(value) and pattern.search(value) is not None).astype(bool)


def signal_from_code(code: Any, kind: Any) -> str | None:
    """The signal an exit code says ended a process: -N, or 128+N on an exit row."""
    if code is None or code != code:
        return None
    code = int(code)
    if code < 0:
        return SIGNALS_BY_NUMBER.get(-code, f"SIG{-code}")
    if 128 < code < 160 and kind == "exit":
        return SIGNALS_BY_NUMBER.get(code - 128)
    return None


def signal_identity(signal: Any, rank: Any) -> str | None:
    """The identity of a death by signal (it has no traceback fingerprint): `<signal>@rank<global
    rank>`.
    """
    if not signal or rank is None or rank is pd.NA:
        return None
    return f"{signal}@rank{int(rank)}"


def attempt_keys(frame: pd.DataFrame) -> pd.Series:
    """Per row, its attempt's key (job or "", attempt or -1), as teardown_starts keys them."""
    job = (
        frame["job_id"].astype(object).where(frame["job_id"].notna(), "")
        if "job_id" in frame.columns
        else ""
    )
    attempt = frame["attempt"].astype(object).where(frame["attempt"].notna(), -1) \
        if "attempt" in frame.columns else -1
    return pd.Series(
        list(
            zip(
                pd.Series(job, index=frame.index),
                pd.Series(attempt, index=frame.index),
                strict=True,
            )
        ),
        index=frame.index,
        dtype=object,
    )


def describe_process_event(row: Any) -> str:
    rank = row_value(row, "rank")
    node = row_value(row, "node")
    who = f"rank {int(rank)}" if rank is not None else "a process"
    if node:
        who += f" on {node}"
    kind = row_value(row, "kind")
    if kind == "exit":
        signal = signal_of(row)
        what = (f"exited with code {row_value(row, 'exit_code')}"
                + (f" ({signal})" if signal else ""))
    else:
        first = (row_value(row, "message") or "").strip().splitlines()
        exception_type = row_value(row, "exception_type")
        named = exception_type and not (first and first[0].startswith(str(exception_type)))
        what = f"{kind}: " + (f"{exception_type}: " if named else "") + (first[0] if first else "")
    source = row_value(row, "source")
    return f"{who} {what.strip()}" + (f" [{source}]" if source else "")
