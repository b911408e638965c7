"""The crash attribution's public types: failure kinds, one rank's failure, a hang trigger, the
result.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum

from faultlens.attribution.incident import Evidence, Incident

FAILURE_KINDS = {"exit", "exception", "oom", "comm_error", "watchdog_timeout", "signal"}
SIGNALS_BY_NUMBER = {
    1: "SIGHUP",
    2: "SIGINT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}


class FailureKind(StrEnum):
    OOM = "oom"
    EXCEPTION = "exception"
    KILLED = "killed"  # died of a signal nobody in the job sent (SIGKILL, SIGSEGV, ...)
    EXITED = "exited"  # non-zero exit with no explanation
    TERMINATED = "terminated"  # stopped by the supervisor (SIGTERM, ...)
    SECONDARY = "secondary"  # echoed someone else's failure
    UNKNOWN = "unknown"


PRIMARY_KINDS = (FailureKind.OOM, FailureKind.EXCEPTION, FailureKind.KILLED)


@dataclass(frozen=True)
class RankFailure:
    """What one rank of one attempt went through, condensed from its process_events rows."""

    rank: int | None
    node: str | None
    kind: FailureKind
    ts: dt.datetime
    signal: str | None = None
    exit_code: int | None = None
    exception_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    fingerprint: str | None = None
    step: int | None = None
    rows: int = 0
    secondary_rows: int = 0
    timeout_rows: int = 0
    first_timeout: dt.datetime | None = None  # when this rank first reported a collective timeout
    # ts came from a source that stamps whole seconds (torchrun's error files): the failure happened
    # somewhere in that second
    whole_second: bool = False
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class HangTrigger:
    """An attempt whose error signals say a collective timed out, with no primary failure: a hang to
    analyse.
    """

    job_id: str | None
    attempt: int | None
    ts: dt.datetime
    evidence: tuple[Evidence, ...]


WAIT = object()  # an attempt whose attribution waits for a report still to come


@dataclass
class CrashResult:
    incidents: list[Incident] = field(default_factory=list)
    hang_triggers: list[HangTrigger] = field(default_factory=list)
    # attempts not settled yet
    pending: list[tuple[str | None, int | None]] = field(default_factory=list)
