"""Worker stderr: lines grouped by the worker that wrote them, and one worker's lines into rows (its
tracebacks and the error lines the rules recognise outside them), stamped with the nearest glog
time."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faultlens.collectors.artifacts.fingerprint import (
    LINE_PREFIX_RE,
    ParsedTraceback,
    iter_tracebacks,
    split_exception_line,
    strip_prefixes,
)
from faultlens.collectors.sources.process_events.rows import (
    EventContext,
    Source,
    error_row,
    timestamp_ns,
)
from faultlens.collectors.sources.process_rules import ProcessRules, load_process_rules

_GLOG_TS_RE = re.compile(r"^\[?[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})\b")
_GLOG_PREFIX_STRIP_RE = re.compile(r"^\[?[IWEF]\d{4} [\d:.]+ \d+ [^\]]*\]\s*")


@dataclass
class WorkerStream:
    rank: int | None
    local_rank: int | None
    lines: list[str] = field(default_factory=list)


def split_worker_streams(
    lines: Iterable[str], default_rank: int | None = None, default_local_rank: int | None = None
) -> tuple[list[WorkerStream], list[str]]:
    """Group lines by the worker that wrote them ('[defaultN]:' from torchrun --tee, '[rankN]:' from
    torch). Lines with no prefix go to the default worker when one is given, else they are returned
    apart."""
    streams: dict[tuple[int | None, int | None], WorkerStream] = {}
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
            stream = streams[(local, rank)] = WorkerStream(rank, local)
        stream.lines.append(strip_prefixes(line))
    # a worker whose lines carry only [defaultN]: before init_process_group and [rankM]: after is
    # one worker
    by_local: dict[int, int] = {s.local_rank: s.rank for s in streams.values()
                                if s.local_rank is not None and s.rank is not None}
    merged: dict[tuple[int | None, int | None], WorkerStream] = {}
    for (local, rank), stream in streams.items():
        if rank is None and local in by_local:
            rank = by_local[local]
        target = merged.setdefault((local, rank), WorkerStream(rank, local))
        target.lines.extend(stream.lines)
    return list(merged.values()), unprefixed


def glog_ts(line: str, year: int) -> dt.datetime | None:
    match = _GLOG_TS_RE.match(line.strip())
    if not match:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in match.groups())
    try:
        return dt.datetime(year, month, day, hour, minute, second, micro).astimezone()
    except ValueError:
        return None


def rows_from_stream(
    lines: Sequence[str],
    context: EventContext,
    *,
    rank: int | None,
    local_rank: int | None,
    fallback_ts: dt.datetime | int,
    rules: ProcessRules | None = None,
    skip_fingerprints: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """Rows from one worker's stderr lines (prefixes already stripped): one per traceback, one per
    recognised error line outside a traceback (NCCL watchdog, OOM reports, ...), identical ones
    once."""
    rules = rules or load_process_rules()
    year = dt.datetime.fromtimestamp(timestamp_ns(fallback_ts) / 1e9).year  # type: ignore[operator]
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
        row = error_row(context, glog_ts(line, year) or fallback_ts, source=Source.STDERR,
                        exception_type=exception_type, message=message, traceback=None, rules=rules,
                        rank=rank, local_rank=local_rank)
        key = (row["kind"], row["fingerprint"])
        if key in seen:
            continue
        seen.add(key)
        rows.append(row)
    return rows


def _find_block(lines: list[str], parsed: ParsedTraceback, consumed: set[int]) -> int:
    """Mark the lines of a parsed traceback as consumed (so they do not count again as free lines).
    """
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
        ts = glog_ts(line, year)
        if ts is not None:
            return ts
    return None
