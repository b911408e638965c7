"""torchrun's failure report, parsed from its stderr: the `Failures:` and `Root Cause (first
observed failure):` blocks of a ChildFailedError, plus the agent's `failed (exitcode: ...)` and
`Sending process N closing signal` lines.

    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2026-11-30_04:32:41
      host      : node-3
      rank      : 2 (local_rank: 2)
      exitcode  : -9 (pid: 13971)  (SIGKILL)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 13971
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...
    ============================================================

The report is recorded as torchrun wrote it: its root cause is the earliest timestamp it saw, which
can be a survivor (a SIGKILLed rank is stamped when torchrun noticed it). `time` is the torchrun
host's local time with second resolution; pass `tz` when the report comes from a host in another
zone.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from faultlens.errors import FaultlensError

NOT_AVAILABLE = "<N/A>"
_BORDER_RE = re.compile(r"^={10,}\s*$")
_SECTION_RE = re.compile(r"^-{10,}\s*$")
_ENTRY_RE = re.compile(r"^\[(\d+)\]:\s*$")
_FIELD_RE = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK_RE = re.compile(r"^(-?\d+) \(local_rank: (-?\d+)\)\s*$")
_EXITCODE_RE = re.compile(r"^(-?\d+) \(pid: (\d+)\)\s*(?:\((\w+)\))?\s*$")
_SIGTERM_SENT_RE = re.compile(r"Sending process (\d+) closing signal (SIG\w+)")
_FAILED_RE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of "
                        r"(?:binary|fn): (.*)$")
_ATTEMPT_RE = re.compile(r"/attempt_(\d+)/(\d+)/[^/]*$")


class TorchrunReportError(ValueError, FaultlensError):
    """A report block that does not have torchrun's shape: the message names the source and the
    line.
    """


@dataclass(frozen=True)
class TorchrunFailure:
    """One `[n]:` entry of a report."""

    index: int
    time: dt.datetime | None
    host: str | None
    rank: int | None
    local_rank: int | None
    exit_code: int | None
    pid: int | None
    signal: str | None
    error_file: str | None  # None when torchrun wrote <N/A>
    traceback: str  # the traceback (or message) as reported, torchrun's two-space indent removed
    is_root_cause: bool

    @property
    def attempt(self) -> int | None:
        """The restart count, when the error file path tells it (<log dir>/<run>/attempt_<n>/<local
        rank>/).
        """
        match = _ATTEMPT_RE.search(self.error_file or "")
        return int(match.group(1)) if match else None

    @property
    def run_dir(self) -> str | None:
        if not self.error_file or not _ATTEMPT_RE.search(self.error_file):
            return None
        return str(Path(self.error_file).parents[2])


@dataclass(frozen=True)
class AgentFailureLine:
    """`failed (exitcode: 1) local_rank: 0 (pid: 8205) of binary: /usr/bin/python`: one per failed
    round.
    """

    exit_code: int
    local_rank: int
    pid: int
    binary: str
    line_number: int


@dataclass(frozen=True)
class TorchrunReport:
    title: str
    failures: tuple[TorchrunFailure, ...]  # every entry, the root cause included
    line_number: int  # where the block starts (1-based)

    @property
    def root_cause(self) -> TorchrunFailure | None:
        return next((f for f in self.failures if f.is_root_cause), None)

    @property
    def attempt(self) -> int | None:
        attempts = {f.attempt for f in self.failures if f.attempt is not None}
        return max(attempts) if attempts else None


@dataclass(frozen=True)
class TorchrunOutput:
    """Everything torchrun's own lines say in one stderr text."""

    reports: tuple[TorchrunReport, ...]
    agent_failures: tuple[AgentFailureLine, ...]
    signals_sent: tuple[tuple[int, str], ...]  # (pid, signal name) torchrun sent to its workers

    @property
    def sigterm_pids(self) -> frozenset[int]:
        return frozenset(pid for pid, name in self.signals_sent if name == "SIGTERM")


def parse_report_time(text: str, tz: dt.tzinfo | None = None) -> dt.datetime | None:
    """torchrun's `2026-11-30_04:32:41` (local time of its host) as an aware datetime; None if it is
    not one.
    """
    try:
        naive = dt.datetime.fromisoformat(text.strip().replace("_", "T", 1))
    except ValueError:
        return None
    if naive.tzinfo is not None:
        return naive
    return naive.replace(tzinfo=tz) if tz is not None else naive.astimezone()


def parse_torchrun_output(
    text: str, *, source: str = "<stderr>", tz: dt.tzinfo | None = None
) -> TorchrunOutput:
    """Parse torchrun's stderr. Raises TorchrunReportError for a report block that is cut or
    malformed.
    """
    lines = text.splitlines()
    reports = []
    agent_failures = []
    signals_sent = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if (
            _BORDER_RE.match(line)
            and index + 1 < len(lines)
            and lines[index + 1].rstrip().endswith(" FAILED")
        ):
            report, index = _parse_block(lines, index, source, tz)
            reports.append(report)
            continue
        sent = _SIGTERM_SENT_RE.search(line)
        if sent:
            signals_sent.append((int(sent.group(1)), sent.group(2)))
        failed = _FAILED_RE.search(line)
        if failed:
            agent_failures.append(
                AgentFailureLine(
                    int(failed.group(1)),
                    int(failed.group(2)),
                    int(failed.group(3)),
                    failed.group(4).strip(),
                    index + 1,
                )
            )
        index += 1
    return TorchrunOutput(tuple(reports), tuple(agent_failures), tuple(signals_sent))


def _parse_block(
    lines: list[str], start: int, source: str, tz: dt.tzinfo | None
) -> tuple[TorchrunReport, int]:
    title = lines[start + 1].strip()
    index = start + 2
    failures: list[TorchrunFailure] = []
    in_root = False
    seen_root_header = False
    while index < len(lines):
        line = lines[index].rstrip("\n")
        if _BORDER_RE.match(line):
            if not failures:
                raise TorchrunReportError(f"{source}:{start + 1}: torchrun report '{title}' lists "
                                          "no failure")
            if not seen_root_header:
                raise TorchrunReportError(f"{source}:{index + 1}: torchrun report '{title}' has no "
                                          "Root Cause section")
            return TorchrunReport(title, tuple(failures), start + 1), index + 1
        stripped = line.strip()
        if stripped.startswith("Root Cause"):
            in_root = seen_root_header = True
        entry = _ENTRY_RE.match(line)
        if entry:
            failure, index = _parse_entry(lines, index, int(entry.group(1)), in_root, source, tz)
            failures.append(failure)
            continue
        index += 1
    raise TorchrunReportError(f"{source}:{start + 1}: torchrun report '{title}' is cut off (no "
                              "closing '=====' line)")


def _parse_entry(lines: list[str], start: int, number: int, is_root: bool, source: str,
                 tz: dt.tzinfo | None) -> tuple[TorchrunFailure, int]:
    fields: dict[str, str] = {}
    traceback_lines: list[str] = []
    index = start + 1
    while index < len(lines):
        line = lines[index]
        if _ENTRY_RE.match(line) or _SECTION_RE.match(line) or _BORDER_RE.match(line):
            break
        if "traceback" in fields:
            traceback_lines.append(line[2:] if line.startswith("  ") else line)
        else:
            match = _FIELD_RE.match(line)
            if match is None:
                if line.strip():
                    raise TorchrunReportError(f"{source}:{index + 1}: expected a '  key : value' "
                                              "line of failure "
                                              f"[{number}], got {line.strip()[:80]!r}")
            else:
                fields[match.group(1)] = match.group(2).strip()
                if match.group(1) == "traceback":
                    traceback_lines.append(match.group(2))
        index += 1
    missing = [key for key in ("rank", "exitcode") if key not in fields]
    if missing:
        raise TorchrunReportError(f"{source}:{start + 1}: failure [{number}] has no {missing[0]!r} "
                                  "field")
    rank_match = _RANK_RE.match(fields["rank"])
    exit_match = _EXITCODE_RE.match(fields["exitcode"])
    if rank_match is None:
        raise TorchrunReportError(f"{source}:{start + 1}: failure [{number}]: rank "
                                  f"{fields['rank']!r} is not "
                                  "'N (local_rank: M)'")
    if exit_match is None:
        raise TorchrunReportError(f"{source}:{start + 1}: failure [{number}]: exitcode "
                                  f"{fields['exitcode']!r} is not "
                                  "'CODE (pid: PID)'")
    error_file = fields.get("error_file")
    while traceback_lines and not traceback_lines[-1].strip():
        traceback_lines.pop()
    failure = TorchrunFailure(
        index=number,
        time=parse_report_time(fields["time"], tz) if "time" in fields else None,
        host=fields.get("host") or None,
        rank=int(rank_match.group(1)),
        local_rank=int(rank_match.group(2)),
        exit_code=int(exit_match.group(1)),
        pid=int(exit_match.group(2)),
        signal=exit_match.group(3),
        error_file=None if not error_file or error_file == NOT_AVAILABLE else error_file,
        traceback="\n".join(traceback_lines),
        is_root_cause=is_root,
    )
    return failure, index
