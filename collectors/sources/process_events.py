"""The process source: what happened to the rank processes of a job, as process_events rows (interface 3).

Inputs, each a function of values (no argparse, no store):
- exits and starts seen by a supervising process (`exit_row`, `start_row`; ProcessSource.record_exit/start),
- torchrun's stderr: its failure report (Failures / Root Cause) and the workers' lines it tees
  (`rows_from_torchrun_output`),
- torchrun's --log-dir tree: <run>_<suffix>/attempt_<n>/<local rank>/{error.json, stderr.log}
  (`rows_from_log_dir`),
- an error file: a worker's error.json or the TORCHELASTIC_ERROR_FILE torchrun writes (`rows_from_error_file`).

Error text is classified by rules/process_errors.yaml: CUDA OOM -> kind oom; gloo timeouts, "Connection closed by
peer" and NCCL watchdog lines -> comm_error / watchdog_timeout marked secondary (a survivor's echo). SIGTERM deaths
in a torchrun report are secondary (torchrun sent them). Exceptions carry a fingerprint
(faultlens.collectors.artifacts.fingerprint). Bad input raises ProcessEventsError naming the file; `collect_paths`
keeps the good
files' rows and lists errors.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import signal as signal_module
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from faultlens.collectors.artifacts.fingerprint import (
    LINE_PREFIX_RE,
    ParsedTraceback,
    fingerprint,
    iter_tracebacks,
    parse_traceback,
    split_exception_line,
    strip_prefixes,
)
from faultlens.collectors.artifacts.torchrun_report import TorchrunFailure, TorchrunReportError, parse_torchrun_output
from faultlens.collectors.errors import FaultlensError
from faultlens.collectors.sources.process_rules import EventKind, ProcessRules, load_process_rules
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.schema import rows_to_table

log = logging.getLogger(__name__)

TABLE = "process_events"
#: how much of a worker's stderr.log is read (its tail: the end is where the failure is)
STDERR_TAIL_BYTES = 256 * 1024
_GLOG_TS_RE = re.compile(r"^\[?[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})\b")
_HAS_PREFIX_RE = re.compile(r"^\[(?:default|rank)\d+\]:")
_ATTEMPT_DIR_RE = re.compile(r"^attempt_(\d+)$")
_RUN_SUFFIX_RE = re.compile(r"^(?P<run>.+)_[a-z0-9_]{8}$")


class Source:
    """process_events.source (interface 3)."""

    SUPERVISOR = "supervisor"
    TORCHRUN_REPORT = "torchrun_report"
    ERROR_JSON = "error_json"
    STDERR = "stderr"

    #: sources whose own times are whole seconds: torch's error files (`timestamp`, seconds since the epoch) and
    #: torchrun's failure report (`time`, to the second). A row of theirs stamped on a whole second happened at
    #: some moment within that second; one stamped otherwise carries a fallback time (the file's mtime) at full
    #: resolution.
    WHOLE_SECONDS = frozenset({ERROR_JSON, TORCHRUN_REPORT})


class SupervisorKind:
    """process_events.kind of rows only a supervisor writes (source "supervisor"), besides start and exit:

    - agent_exit: a node's launcher (torchrun agent) exited; rank null; exit_code null and signal set (SIGKILL)
      when it died by a signal, else exit_code set and signal null;
    - signal_sent: written just BEFORE the supervisor itself sends `signal` to process `pid` (rank when known),
      with `message` saying why; a death by that signal afterwards is the supervisor's doing, not a failure.
    """

    AGENT_EXIT = "agent_exit"
    SIGNAL_SENT = "signal_sent"


class ProcessEventsError(ValueError, FaultlensError):
    """An input that cannot be read as what it claims to be: the message names the file and the problem."""


@dataclass(frozen=True)
class EventContext:
    """Identity for rows: explicit values win over what the inputs say (run id from a log dir, host in a report)."""

    node: str | None = None
    cluster: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    tz: dt.tzinfo | None = None  # of torchrun's report times; None: this machine's local zone

    @classmethod
    def from_identity(cls, identity: NodeIdentity, tz: dt.tzinfo | None = None) -> EventContext:
        return cls(identity.node, identity.cluster, identity.job_id, identity.attempt, tz)


# ---------------------------------------------------------------------------------------------------- rows


def signal_name(exit_code: int | None) -> str | None:
    """SIGKILL for -9 (a Popen returncode); None for a normal exit."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal_module.Signals(-exit_code).name
    except ValueError:
        return f"SIG{-exit_code}"


def _ns(value: dt.datetime | int | float | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        return int(value.timestamp() * 1_000_000) * 1000
    return int(value)


def _base_row(context: EventContext, ts: dt.datetime | int | None, **columns: Any) -> dict[str, Any]:
    row = {"ts": _ns(ts), "cluster": context.cluster, "node": context.node, "job_id": context.job_id,
           "attempt": context.attempt}
    row.update({k: v for k, v in columns.items() if v is not None or k not in row})
    return row


def error_row(context: EventContext, ts: dt.datetime | int | None, *, source: str, exception_type: str | None,
              message: str, traceback: str | None, parsed: ParsedTraceback | None = None,
              rules: ProcessRules | None = None, **columns: Any) -> dict[str, Any]:
    """One exception / oom / comm_error / watchdog_timeout row, classified by the rules and fingerprinted."""
    rules = rules or load_process_rules()
    text = f"{exception_type}: {message}" if exception_type else message
    classified = rules.classify(text)
    frames = parsed.frames if parsed is not None else ()
    return _base_row(
        context, ts, kind=classified.kind.value, source=source, exception_type=exception_type, message=message,
        traceback=traceback, fingerprint=fingerprint(exception_type, message, frames),
        is_secondary=classified.is_secondary, **columns)


def exit_row(context: EventContext, ts: dt.datetime | int | None, *, source: str, exit_code: int | None,
             signal: str | None = None, is_secondary: bool = False, **columns: Any) -> dict[str, Any]:
    """One exit row; `signal` defaults to the one a negative exit code names."""
    return _base_row(context, ts, kind=EventKind.EXIT.value, source=source, exit_code=exit_code,
                     signal=signal or signal_name(exit_code), is_secondary=is_secondary, **columns)


def start_row(context: EventContext, ts: dt.datetime | int | None, *, source: str = Source.SUPERVISOR,
              **columns: Any) -> dict[str, Any]:
    return _base_row(context, ts, kind=EventKind.START.value, source=source, is_secondary=False, **columns)


def agent_exit_row(context: EventContext, ts: dt.datetime | int | None, *, returncode: int, pid: int | None = None,
                   message: str | None = None, is_secondary: bool = False) -> dict[str, Any]:
    """One agent_exit row from a Popen returncode (negative: killed by that signal)."""
    signal = signal_name(returncode)
    return _base_row(context, ts, kind=SupervisorKind.AGENT_EXIT, source=Source.SUPERVISOR, rank=None,
                     local_rank=None, pid=pid, exit_code=None if signal else int(returncode), signal=signal,
                     message=message, is_secondary=is_secondary)


def signal_sent_row(context: EventContext, ts: dt.datetime | int | None, *, pid: int, signal: str,
                    message: str, rank: int | None = None, local_rank: int | None = None) -> dict[str, Any]:
    """One signal_sent row: the supervisor is about to send `signal` (a name, e.g. SIGTERM) to `pid`."""
    return _base_row(context, ts, kind=SupervisorKind.SIGNAL_SENT, source=Source.SUPERVISOR, pid=pid, rank=rank,
                     local_rank=local_rank, signal=signal, message=message, is_secondary=True)


# ---------------------------------------------------------------------------------------------- error files


def rows_from_error_file(path: str | Path, context: EventContext | None = None, *, rank: int | None = None,
                         local_rank: int | None = None, rules: ProcessRules | None = None) -> list[dict[str, Any]]:
    """A worker's error.json (torch's @record) or torchrun's TORCHELASTIC_ERROR_FILE (which adds errorCode and is
    the root cause torchrun chose): one error row."""
    path = Path(path)
    context = context or EventContext()
    try:
        raw = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProcessEventsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProcessEventsError(f"{path}: not a torch error file: invalid JSON at line {exc.lineno} "
                                 f"column {exc.colno}") from None
    if not isinstance(data, dict) or "message" not in data:
        raise ProcessEventsError(f"{path}: not a torch error file: expected an object with a 'message' key")
    message_field = data["message"]
    error_code = None
    if isinstance(message_field, str):
        text, callstack, timestamp = message_field, None, data.get("timestamp")
    elif isinstance(message_field, dict):
        text = message_field.get("message")
        extra = message_field.get("extraInfo") or {}
        if not isinstance(text, str) or not isinstance(extra, dict):
            raise ProcessEventsError(f"{path}: not a torch error file: 'message.message' must be text and "
                                     "'message.extraInfo' an object")
        callstack, timestamp = extra.get("py_callstack"), extra.get("timestamp")
        error_code = message_field.get("errorCode")
    else:
        raise ProcessEventsError(f"{path}: not a torch error file: 'message' must be text or an object")
    try:
        ts: dt.datetime | int = (dt.datetime.fromtimestamp(int(timestamp), dt.UTC) if timestamp not in (None, "")
                                 else _mtime_ns(path))
    except (TypeError, ValueError, OverflowError):
        raise ProcessEventsError(f"{path}: timestamp {timestamp!r} is not seconds since the epoch") from None
    exception_type, message = split_exception_line(text)
    parsed = parse_traceback(callstack) if isinstance(callstack, str) else None
    row = error_row(context, ts, source=Source.ERROR_JSON, exception_type=exception_type, message=message,
                    traceback=callstack if isinstance(callstack, str) else None, parsed=parsed, rules=rules,
                    rank=rank, local_rank=local_rank, error_file=str(path),
                    exit_code=int(error_code) if isinstance(error_code, int) else None,
                    reported_root_cause=True if error_code is not None else None)
    return [row]


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return time.time_ns()


# ------------------------------------------------------------------------------------------- worker stderr


@dataclass
class _Stream:
    rank: int | None
    local_rank: int | None
    lines: list[str] = field(default_factory=list)


def split_worker_streams(lines: Iterable[str], default_rank: int | None = None,
                         default_local_rank: int | None = None) -> tuple[list[_Stream], list[str]]:
    """Group lines by the worker that wrote them ('[defaultN]:' from torchrun --tee, '[rankN]:' from torch).
    Lines with no prefix go to the default worker when one is given, else they are returned apart."""
    streams: dict[tuple[int | None, int | None], _Stream] = {}
    unprefixed: list[str] = []
    for line in lines:
        match = LINE_PREFIX_RE.match(line)
        local = int(match.group("local")) if match and match.group("local") else None
        rank = int(match.group("rank")) if match and match.group("rank") else None
        if local is None and rank is None:
            if default_rank is None and default_local_rank is None:
                unprefixed.append(line)
                continue
            rank, local = default_rank, default_local_rank
        else:
            rank = rank if rank is not None else default_rank
            local = local if local is not None else default_local_rank
        stream = streams.get((local, rank))
        if stream is None:
            stream = streams[(local, rank)] = _Stream(rank, local)
        stream.lines.append(strip_prefixes(line))
    # a worker whose lines carry only [defaultN]: before init_process_group and [rankM]: after is one worker
    by_local: dict[int, int] = {s.local_rank: s.rank for s in streams.values()
                                if s.local_rank is not None and s.rank is not None}
    merged: dict[tuple[int | None, int | None], _Stream] = {}
    for (local, rank), stream in streams.items():
        if rank is None and local in by_local:
            rank = by_local[local]
        target = merged.setdefault((local, rank), _Stream(rank, local))
        target.lines.extend(stream.lines)
    return list(merged.values()), unprefixed


def _glog_ts(line: str, year: int) -> dt.datetime | None:
    match = _GLOG_TS_RE.match(line.strip())
    if not match:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in match.groups())
    try:
        return dt.datetime(year, month, day, hour, minute, second, micro).astimezone()
    except ValueError:
        return None


def rows_from_stream(lines: Sequence[str], context: EventContext, *, rank: int | None, local_rank: int | None,
                     fallback_ts: dt.datetime | int, rules: ProcessRules | None = None,
                     skip_fingerprints: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Rows from one worker's stderr lines (prefixes already stripped): one per traceback, one per recognised
    error line outside a traceback (NCCL watchdog, OOM reports, ...), identical ones once."""
    rules = rules or load_process_rules()
    year = dt.datetime.fromtimestamp(_ns(fallback_ts) / 1e9).year  # type: ignore[operator]
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    consumed: set[int] = set()
    line_list = list(lines)
    for parsed in iter_tracebacks(line_list):
        start = _find_block(line_list, parsed, consumed)
        if parsed.exception_type is None and not parsed.message:
            continue
        ts = _nearest_glog_ts(line_list, start, year) or fallback_ts
        row = error_row(context, ts, source=Source.STDERR, exception_type=parsed.exception_type,
                        message=parsed.message, traceback=parsed.text, parsed=parsed, rules=rules,
                        rank=rank, local_rank=local_rank)
        key = (row["kind"], row["fingerprint"])
        if row["fingerprint"] in skip_fingerprints or key in seen:
            continue
        seen.add(key)
        rows.append(row)
    for number, line in enumerate(line_list):
        if number in consumed:
            continue
        found = rules.match(line)
        if found is None:
            continue
        text = _GLOG_PREFIX_STRIP_RE.sub("", line.strip())
        exception_type, message = split_exception_line(text)
        row = error_row(context, _glog_ts(line, year) or fallback_ts, source=Source.STDERR,
                        exception_type=exception_type, message=message, traceback=None, rules=rules,
                        rank=rank, local_rank=local_rank)
        key = (row["kind"], row["fingerprint"])
        if key in seen:
            continue
        seen.add(key)
        rows.append(row)
    return rows


_GLOG_PREFIX_STRIP_RE = re.compile(r"^\[?[IWEF]\d{4} [\d:.]+ \d+ [^\]]*\]\s*")


def _find_block(lines: list[str], parsed: ParsedTraceback, consumed: set[int]) -> int:
    """Mark the lines of a parsed traceback as consumed (so they do not count again as free lines)."""
    block = parsed.text.splitlines()
    if not block:
        return 0
    for start in range(len(lines)):
        if start in consumed or strip_prefixes(lines[start]) != block[0]:
            continue
        if [strip_prefixes(line) for line in lines[start:start + len(block)]] == block:
            consumed.update(range(start, start + len(block)))
            return start
    return 0


def _nearest_glog_ts(lines: list[str], start: int, year: int) -> dt.datetime | None:
    for line in reversed(lines[max(0, start - 20):start]):
        ts = _glog_ts(line, year)
        if ts is not None:
            return ts
    return None


# ------------------------------------------------------------------------------------------ torchrun output


def _run_id_from_dir(name: str) -> str:
    """torchrun names a run's log directory <run id>_<8 random characters>."""
    match = _RUN_SUFFIX_RE.match(name)
    return match.group("run") if match else name


def rows_from_torchrun_output(text: str, context: EventContext | None = None, *, source_name: str = "<stderr>",
                              fallback_ts: dt.datetime | int | None = None,
                              rules: ProcessRules | None = None) -> list[dict[str, Any]]:
    """torchrun's stderr: rows for every entry of its failure report(s) (an exit row, and an error row when a
    traceback was reported) and for the workers' tracebacks and error lines it teed ('[defaultN]:' lines). Text
    with no report and no worker prefix at all is taken as one worker's own stderr (rank unknown).

    torchrun's stderr starts at attempt 0 and logs one `failed (exitcode: ...)` line per failed attempt, so the
    teed lines before the k-th such line belong to attempt k, stamped (when they carry no time of their own) with
    that line's time: when torchrun saw the failure."""
    context = context or EventContext()
    rules = rules or load_process_rules()
    fallback_ts = fallback_ts if fallback_ts is not None else time.time_ns()
    try:
        output = parse_torchrun_output(text, source=source_name, tz=context.tz)
    except TorchrunReportError as exc:
        raise ProcessEventsError(str(exc)) from None
    job_id = context.job_id or _job_from_report(output)
    final_attempt = len(output.agent_failures) - 1 if output.agent_failures else None
    rows: list[dict[str, Any]] = []
    for report in output.reports:
        report_attempt = report.attempt if report.attempt is not None else final_attempt
        for failure in report.failures:
            rows.extend(_report_rows(failure, report_attempt, job_id, context, fallback_ts, rules))
    lines = text.splitlines()
    year = dt.datetime.fromtimestamp(_ns(fallback_ts) / 1e9).year  # type: ignore[operator]
    start = 0
    boundaries = [(a.line_number, _glog_ts(lines[a.line_number - 1], year)) for a in output.agent_failures]
    plain_worker_output = not output.reports and not output.agent_failures and not any(
        _HAS_PREFIX_RE.match(line) for line in lines)
    for attempt, (end, seen_at) in enumerate([*boundaries, (len(lines), None)]):
        streams, unprefixed = split_worker_streams(lines[start:end])
        if plain_worker_output:  # one process's own stderr, not torchrun's: all of it is that worker's
            streams = [_Stream(None, None, unprefixed)]
        segment_context = EventContext(context.node, context.cluster, job_id,
                                       context.attempt if context.attempt is not None else attempt, context.tz)
        for stream in streams:
            rows.extend(rows_from_stream(stream.lines, segment_context, rank=stream.rank,
                                         local_rank=stream.local_rank, fallback_ts=seen_at or fallback_ts,
                                         rules=rules))
        start = end
    return rows


def _job_from_report(output: Any) -> str | None:
    for report in output.reports:
        for failure in report.failures:
            if failure.run_dir:
                return _run_id_from_dir(Path(failure.run_dir).name)
    return None


def _report_rows(failure: TorchrunFailure, report_attempt: int | None, job_id: str | None, context: EventContext,
                 fallback_ts: dt.datetime | int, rules: ProcessRules) -> list[dict[str, Any]]:
    attempt = context.attempt if context.attempt is not None else (
        failure.attempt if failure.attempt is not None else report_attempt)
    row_context = EventContext(context.node or failure.host, context.cluster, job_id, attempt, context.tz)
    ts = failure.time or fallback_ts
    parsed = parse_traceback(failure.traceback)
    last_line = failure.traceback.strip().splitlines()[-1].strip() if failure.traceback.strip() else None
    terminated_by_torchrun = failure.signal == "SIGTERM"  # torchrun SIGTERMs the survivors of a failure
    common = {"rank": failure.rank, "local_rank": failure.local_rank, "pid": failure.pid,
              "error_file": failure.error_file, "reported_root_cause": failure.is_root_cause}
    errors = []
    if parsed is not None and (parsed.exception_type or parsed.message):
        errors.append(error_row(row_context, ts, source=Source.TORCHRUN_REPORT, exception_type=parsed.exception_type,
                                message=parsed.message, traceback=failure.traceback, parsed=parsed, rules=rules,
                                **common))
    # a survivor's exit is an echo too when what it died of is (a peer's death seen as a closed connection or a
    # receive timeout), whatever error torch printed
    echoed = terminated_by_torchrun or any(row.get("is_secondary") for row in errors)
    return [exit_row(row_context, ts, source=Source.TORCHRUN_REPORT, exit_code=failure.exit_code,
                     signal=failure.signal, is_secondary=echoed, message=last_line, **common), *errors]


# ---------------------------------------------------------------------------------------------- log dirs


@dataclass(frozen=True)
class WorkerLogDir:
    """<log dir>/<run id>_<suffix>/attempt_<n>/<local rank>/"""

    path: Path
    run_id: str
    attempt: int
    local_rank: int


def find_worker_dirs(root: str | Path) -> list[WorkerLogDir]:
    """Every worker directory under a torchrun --log-dir (the base, a run directory or an attempt directory)."""
    root = Path(root)
    found = []
    for attempt_dir in sorted({*root.glob("attempt_*"), *root.glob("*/attempt_*"), *root.glob("*/*/attempt_*")}
                              | ({root} if _ATTEMPT_DIR_RE.match(root.name) else set())):
        match = _ATTEMPT_DIR_RE.match(attempt_dir.name)
        if not match or not attempt_dir.is_dir():
            continue
        for worker in sorted(attempt_dir.iterdir()):
            if worker.is_dir() and worker.name.isdigit():
                found.append(WorkerLogDir(worker, _run_id_from_dir(attempt_dir.parent.name), int(match.group(1)),
                                          int(worker.name)))
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
    """One worker directory: its error.json row and its stderr tail's rows (a traceback already in error.json is
    not repeated). The global rank comes from torch's '[rankN]:' prefixes in stderr when they are there."""
    context = context or EventContext()
    rules = rules or load_process_rules()
    row_context = EventContext(context.node, context.cluster, context.job_id or worker.run_id,
                               context.attempt if context.attempt is not None else worker.attempt, context.tz)
    stderr_path = worker.path / "stderr.log"
    streams: list[_Stream] = []
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
        rows.extend(rows_from_error_file(error_path, row_context, rank=rank, local_rank=worker.local_rank,
                                         rules=rules))
    known = frozenset(r["fingerprint"] for r in rows if r.get("fingerprint"))
    fallback = _mtime_ns(stderr_path)
    for stream in streams:
        rows.extend(rows_from_stream(stream.lines, row_context, rank=stream.rank if stream.rank is not None else rank,
                                     local_rank=worker.local_rank, fallback_ts=fallback, rules=rules,
                                     skip_fingerprints=known))
    return rows


# ------------------------------------------------------------------------------------------- collecting


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
    """Rows from any mix of log directories, torchrun stderr files and error files. A file that cannot be read
    is an error naming it; the other files' rows are still returned. Ranks missing in log-dir rows are filled from
    a torchrun report given alongside (its error_file paths name attempt and local rank)."""
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


def _rows_from_text_file(path: Path, context: EventContext, rules: ProcessRules) -> list[dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProcessEventsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if b"\x00" in raw[:4096]:
        raise ProcessEventsError(f"{path}: binary data, not torchrun output")
    text = raw.decode("utf-8", errors="replace")
    rows = rows_from_torchrun_output(text, context, source_name=str(path), fallback_ts=_mtime_ns(path), rules=rules)
    if not rows and text.strip() and not _mentions_torchrun(text):
        raise ProcessEventsError(f"{path}: neither a torchrun failure report nor worker output (no traceback, "
                                 "no recognised error line)")
    return rows


def _mentions_torchrun(text: str) -> bool:
    """Output of a torchrun run that went well: its own lines or its workers' teed lines."""
    return ("torch.distributed" in text or "torch/distributed" in text or "OMP_NUM_THREADS" in text
            or bool(re.search(r"^\[default\d+\]:", text, re.MULTILINE)))


def _fill_job_from_log_dirs(rows: list[dict[str, Any]], run_ids: set[str]) -> None:
    """A report whose failures all died by signal names no error file, hence no run id: when exactly one run's
    log directory was given too, that run is the report's."""
    jobs = set(run_ids) | {row["job_id"] for row in rows
                           if row.get("source") == Source.ERROR_JSON and row.get("job_id")}
    if len(jobs) != 1:
        return
    job = jobs.pop()
    for row in rows:
        if row.get("job_id") is None and row.get("source") in (Source.TORCHRUN_REPORT, Source.STDERR):
            row["job_id"] = job


def _without_repeats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same worker traceback seen in its stderr.log and again in torchrun's teed output, or already in its
    error.json, is kept once (the error.json row, which has the exact time)."""
    def key(row: dict[str, Any]) -> tuple:
        return row.get("job_id"), row.get("attempt"), row.get("rank"), row.get("kind"), row.get("fingerprint")

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
    """error.json rows of a log dir know attempt and local rank; a torchrun report row with the same error file
    knows the global rank."""
    by_file = {row["error_file"]: row["rank"] for row in rows
               if row.get("source") == Source.TORCHRUN_REPORT and row.get("error_file") and row.get("rank") is not None}
    if not by_file:
        return
    resolved = {os.path.realpath(path): rank for path, rank in by_file.items()}
    for row in rows:
        if row.get("rank") is None and row.get("error_file"):
            rank = by_file.get(row["error_file"], resolved.get(os.path.realpath(row["error_file"])))
            if rank is not None:
                row["rank"] = rank


# ------------------------------------------------------------------------------------------------ source


class ProcessSource:
    """A Source of process_events: supervisor-recorded starts and exits, plus the rows of watched paths (log dirs,
    torchrun stderr files, error files), re-read when they change; each row is emitted once. Never raises."""

    name = "process"

    def __init__(self, identity: NodeIdentity, *, paths: Sequence[str | Path] = (), rules: ProcessRules | None = None,
                 clock: Callable[[], int] = time.time_ns, tz: dt.tzinfo | None = None) -> None:
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
        self._pending.append(start_row(context, self._clock(), rank=rank, local_rank=local_rank, pid=pid))

    def record_exit(self, *, rank: int | None, local_rank: int | None, pid: int | None, returncode: int,
                    attempt: int | None = None, terminated_by_us: bool = False) -> None:
        """An exit seen by the supervisor (Popen returncode: negative for a signal). terminated_by_us: the
        supervisor itself sent the signal (a survivor being shut down): the row is secondary."""
        context = self._context(attempt)
        self._pending.append(exit_row(context, self._clock(), source=Source.SUPERVISOR, exit_code=returncode,
                                      is_secondary=terminated_by_us, rank=rank, local_rank=local_rank, pid=pid))

    def _context(self, attempt: int | None) -> EventContext:
        c = self.context
        return EventContext(c.node, c.cluster, c.job_id, attempt if attempt is not None else c.attempt, c.tz)

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
            stats = [path.stat()] + ([p.stat() for p in path.rglob("*") if p.is_file()] if path.is_dir() else [])
        except OSError:
            return False
        if path.is_dir() and len(stats) == 1:
            return False  # a watched log dir torchrun has not filled yet: nothing to read, nothing wrong
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
