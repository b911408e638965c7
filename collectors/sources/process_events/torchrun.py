"""torchrun's stderr: the rows of its failure reports and of the workers' lines it tees, attempt by
attempt.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

from faultlens.collectors.artifacts.fingerprint import parse_traceback
from faultlens.collectors.artifacts.torchrun_report import (
    TorchrunFailure,
    TorchrunReportError,
    parse_torchrun_output,
)
from faultlens.collectors.sources.process_events.rows import (
    EventContext,
    ProcessEventsError,
    Source,
    error_row,
    exit_row,
    timestamp_ns,
)
from faultlens.collectors.sources.process_events.stderr import (
    WorkerStream,
    glog_ts,
    rows_from_stream,
    split_worker_streams,
)
from faultlens.collectors.sources.process_rules import ProcessRules, load_process_rules

_HAS_PREFIX_RE = re.compile(r"^\[(?:default|rank)\d+\]:")
_RUN_SUFFIX_RE = re.compile(r"^(?P<run>.+)_[a-z0-9_]{8}$")


def run_id_from_dir(name: str) -> str:
    """torchrun names a run's log directory <run id>_<8 random characters>."""
    match = _RUN_SUFFIX_RE.match(name)
    return match.group("run") if match else name


def rows_from_torchrun_output(
    text: str,
    context: EventContext | None = None,
    *,
    source_name: str = "<stderr>",
    fallback_ts: dt.datetime | int | None = None,
    rules: ProcessRules | None = None,
) -> list[dict[str, Any]]:
    """torchrun's stderr: rows for every entry of its failure report(s) (an exit row, and an error
    row when a traceback was reported) and for the workers' tracebacks and error lines it teed
    ('[defaultN]:' lines). Text with no report and no worker prefix at all is taken as one worker's
    own stderr (rank unknown).

    torchrun's stderr starts at attempt 0 and logs one `failed (exitcode: ...)` line per failed
    attempt, so the teed lines before the k-th such line belong to attempt k, stamped (when they
    carry no time of their own) with that line's time: when torchrun saw the failure."""
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
    year = dt.datetime.fromtimestamp(timestamp_ns(fallback_ts) / 1e9).year  # type: ignore[operator]
    start = 0
    boundaries = [
        (a.line_number, glog_ts(lines[a.line_number - 1], year)) for a in output.agent_failures
    ]
    plain_worker_output = not output.reports and not output.agent_failures and not any(
        _HAS_PREFIX_RE.match(line) for line in lines)
    for attempt, (end, seen_at) in enumerate([*boundaries, (len(lines), None)]):
        streams, unprefixed = split_worker_streams(lines[start:end])
        # one process's own stderr, not torchrun's: all of it is that worker's
        if plain_worker_output:
            streams = [WorkerStream(None, None, unprefixed)]
        segment_context = EventContext(
            context.node,
            context.cluster,
            job_id,
            context.attempt if context.attempt is not None else attempt,
            context.tz,
        )
        for stream in streams:
            rows.extend(
                rows_from_stream(
                    stream.lines,
                    segment_context,
                    rank=stream.rank,
                    local_rank=stream.local_rank,
                    fallback_ts=seen_at or fallback_ts,
                    rules=rules,
                )
            )
        start = end
    return rows


def _job_from_report(output: Any) -> str | None:
    for report in output.reports:
        for failure in report.failures:
            if failure.run_dir:
                return run_id_from_dir(Path(failure.run_dir).name)
    return None


def _report_rows(
    failure: TorchrunFailure,
    report_attempt: int | None,
    job_id: str | None,
    context: EventContext,
    fallback_ts: dt.datetime | int,
    rules: ProcessRules,
) -> list[dict[str, Any]]:
    attempt = context.attempt if context.attempt is not None else (
        failure.attempt if failure.attempt is not None else report_attempt)
    row_context = EventContext(
        context.node or failure.host, context.cluster, job_id, attempt, context.tz
    )
    ts = failure.time or fallback_ts
    parsed = parse_traceback(failure.traceback)
    last_line = (
        failure.traceback.strip().splitlines()[-1].strip() if failure.traceback.strip() else None
    )
    # torchrun SIGTERMs the survivors of a failure
    terminated_by_torchrun = failure.signal == "SIGTERM"
    common = {"rank": failure.rank, "local_rank": failure.local_rank, "pid": failure.pid,
              "error_file": failure.error_file, "reported_root_cause": failure.is_root_cause}
    errors = []
    if parsed is not None and (parsed.exception_type or parsed.message):
        errors.append(
            error_row(
                row_context,
                ts,
                source=Source.TORCHRUN_REPORT,
                exception_type=parsed.exception_type,
                message=parsed.message,
                traceback=failure.traceback,
                parsed=parsed,
                rules=rules,
                **common,
            )
        )
    # a survivor's exit is an echo too when what it died of is (a peer's death seen as a closed
    # connection or a receive timeout), whatever error torch printed
    echoed = terminated_by_torchrun or any(row.get("is_secondary") for row in errors)
    return [
        exit_row(
            row_context,
            ts,
            source=Source.TORCHRUN_REPORT,
            exit_code=failure.exit_code,
            signal=failure.signal,
            is_secondary=echoed,
            message=last_line,
            **common,
        ),
        *errors,
    ]
