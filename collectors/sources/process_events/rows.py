"""process_events rows: the table's vocabularies (source, supervisor kinds), the identity rows carry
(EventContext), the error and the row builders every input of the process source goes through."""

from __future__ import annotations

import datetime as dt
import signal as signal_module
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faultlens.collectors.artifacts.fingerprint import ParsedTraceback, fingerprint
from faultlens.collectors.sources.process_rules import EventKind, ProcessRules, load_process_rules
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.errors import FaultlensError

TABLE = "process_events"


class Source:
    """process_events.source (interface 3)."""

    SUPERVISOR = "supervisor"
    TORCHRUN_REPORT = "torchrun_report"
    ERROR_JSON = "error_json"
    STDERR = "stderr"

    #: sources whose own times are whole seconds: torch's error files (`timestamp`, seconds since
    #: the epoch) and torchrun's failure report (`time`, to the second). A row of theirs stamped on
    #: a whole second happened at some moment within that second; one stamped otherwise carries a
    #: fallback time (the file's mtime) at full resolution.
    WHOLE_SECONDS = frozenset({ERROR_JSON, TORCHRUN_REPORT})


class SupervisorKind:
    """process_events.kind of rows only a supervisor writes (source "supervisor"), besides start and
    exit:

    - agent_exit: a node's launcher (torchrun agent) exited; rank null; exit_code null and signal
      set (SIGKILL) when it died by a signal, else exit_code set and signal null;
    - signal_sent: written just BEFORE the supervisor itself sends `signal` to process `pid` (rank
      when known), with `message` saying why; a death by that signal afterwards is the supervisor's
      doing, not a failure.
    """

    AGENT_EXIT = "agent_exit"
    SIGNAL_SENT = "signal_sent"


class ProcessEventsError(ValueError, FaultlensError):
    """An input that cannot be read as what it claims to be: the message names the file and the
    problem.
    """


@dataclass(frozen=True)
class EventContext:
    """Identity for rows: explicit values win over what the inputs say (run id from a log dir, host
    in a report).
    """

    node: str | None = None
    cluster: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    tz: dt.tzinfo | None = None  # of torchrun's report times; None: this machine's local zone

    @classmethod
    def from_identity(cls, identity: NodeIdentity, tz: dt.tzinfo | None = None) -> EventContext:
        return cls(identity.node, identity.cluster, identity.job_id, identity.attempt, tz)


def signal_name(exit_code: int | None) -> str | None:
    """SIGKILL for -9 (a Popen returncode); None for a normal exit."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal_module.Signals(-exit_code).name
    except ValueError:
        return f"SIG{-exit_code}"


def timestamp_ns(value: dt.datetime | int | float | None) -> int | None:
    """A row time in ns since the epoch: a datetime (naive: this machine's local zone) to the µs, a
    number as it is."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        return int(value.timestamp() * 1_000_000) * 1000
    return int(value)


def base_row(context: EventContext, ts: dt.datetime | int | None, **columns: Any) -> dict[str, Any]:
    """A row with the context's identity; a column given as None leaves an identity column as the
    context says.
    """
    row = {
        "ts": timestamp_ns(ts),
        "cluster": context.cluster,
        "node": context.node,
        "job_id": context.job_id,
        "attempt": context.attempt,
    }
    row.update({k: v for k, v in columns.items() if v is not None or k not in row})
    return row


def error_row(
    context: EventContext,
    ts: dt.datetime | int | None,
    *,
    source: str,
    exception_type: str | None,
    message: str,
    traceback: str | None,
    parsed: ParsedTraceback | None = None,
    rules: ProcessRules | None = None,
    **columns: Any,
) -> dict[str, Any]:
    """One exception / oom / comm_error / watchdog_timeout row, classified by the rules and
    fingerprinted.
    """
    rules = rules or load_process_rules()
    text = f"{exception_type}: {message}" if exception_type else message
    classified = rules.classify(text)
    frames = parsed.frames if parsed is not None else ()
    return base_row(
        context,
        ts,
        kind=classified.kind.value,
        source=source,
        exception_type=exception_type,
        message=message,
        traceback=traceback,
        fingerprint=fingerprint(exception_type, message, frames),
        is_secondary=classified.is_secondary,
        **columns,
    )


def exit_row(
    context: EventContext,
    ts: dt.datetime | int | None,
    *,
    source: str,
    exit_code: int | None,
    signal: str | None = None,
    is_secondary: bool = False,
    **columns: Any,
) -> dict[str, Any]:
    """One exit row; `signal` defaults to the one a negative exit code names."""
    return base_row(context, ts, kind=EventKind.EXIT.value, source=source, exit_code=exit_code,
                    signal=signal or signal_name(exit_code), is_secondary=is_secondary, **columns)


def start_row(
    context: EventContext,
    ts: dt.datetime | int | None,
    *,
    source: str = Source.SUPERVISOR,
    **columns: Any,
) -> dict[str, Any]:
    return base_row(
        context, ts, kind=EventKind.START.value, source=source, is_secondary=False, **columns
    )


def agent_exit_row(
    context: EventContext,
    ts: dt.datetime | int | None,
    *,
    returncode: int,
    pid: int | None = None,
    message: str | None = None,
    is_secondary: bool = False,
) -> dict[str, Any]:
    """One agent_exit row from a Popen returncode (negative: killed by that signal)."""
    signal = signal_name(returncode)
    return base_row(
        context,
        ts,
        kind=SupervisorKind.AGENT_EXIT,
        source=Source.SUPERVISOR,
        rank=None,
        local_rank=None,
        pid=pid,
        exit_code=None if signal else int(returncode),
        signal=signal,
        message=message,
        is_secondary=is_secondary,
    )


def signal_sent_row(
    context: EventContext,
    ts: dt.datetime | int | None,
    *,
    pid: int,
    signal: str,
    message: str,
    rank: int | None = None,
    local_rank: int | None = None,
) -> dict[str, Any]:
    """One signal_sent row: the supervisor is about to send `signal` (a name, e.g. SIGTERM) to
    `pid`.
    """
    return base_row(
        context,
        ts,
        kind=SupervisorKind.SIGNAL_SENT,
        source=Source.SUPERVISOR,
        pid=pid,
        rank=rank,
        local_rank=local_rank,
        signal=signal,
        message=message,
        is_secondary=True,
    )


def mtime_ns(path: Path) -> int:
    """A file's modification time (a row's fallback time); now when the file cannot be read."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return time.time_ns()
