"""Store maintenance: compaction of small segments and retention by partition date.

Compaction merges the visible segments of one partition into one `c-` segment whose metadata names
the segments it replaces, then deletes them. A reader listing at any moment sees each row once:
before the merged segment appears it reads the small ones; after, it drops the replaced ones even if
they are still listed; if one disappears under a running query the store reader lists again and
retries.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from faultlens.attribution.reading.segment_check import check_segment
from faultlens.collectors.store.layout import (
    COMPACTED_PREFIX,
    REPLACES_KEY,
    StoreLocation,
    checked_segments,
    is_segment_name,
    list_partitions,
    new_segment_name,
    replaced_segments,
    resolve_store,
    write_segment,
    writer_is_gone,
)
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.rollup import merge_lock
from faultlens.collectors.store.schema import TABLE_NAMES, validate

log = logging.getLogger("faultlens.maintenance")
# a temporary file older than this is removed whoever wrote it (a write takes seconds)
TEMP_MAX_AGE_S = 3600.0


@dataclass(frozen=True)
class CompactionResult:
    table: str
    partition: str
    segments_in: int
    rows: int
    path: str


@dataclass(frozen=True)
class RetentionResult:
    table: str
    partition: str
    segments: int


def _partition_files(location: StoreLocation, partition: str) -> tuple[list[str], list[str]]:
    """(visible segments, temporary files) directly in a partition directory."""
    try:
        names = [str(p).rsplit("/", 1)[-1] for p in location.fs.ls(partition, detail=False)]
    except FileNotFoundError:
        return [], []
    segments = checked_segments(
        location, sorted(f"{partition}/{n}" for n in names if is_segment_name(n))
    )
    temps = [f"{partition}/{n}" for n in names if n.startswith(".") and n.endswith(".tmp")]
    return segments, temps


def _remove_leftovers(
    location: StoreLocation, segments: list[str], temps: list[str], now: float
) -> list[str]:
    """Delete sources that an earlier compaction replaced but could not delete, and stale temp
    files.
    """
    replaced = replaced_segments(location, segments)  # only what a compacted segment really holds
    for path in replaced & set(segments):
        location.fs.rm_file(path)
    for path in stale_temps(location, temps, now):
        with contextlib.suppress(FileNotFoundError):
            location.fs.rm_file(path)
    return [p for p in segments if p not in replaced]


def stale_temps(location: StoreLocation, temps: list[str], now: float) -> list[str]:
    """Temporary files no writer will finish: their writer (this host, by pid) is dead, or they are
    older than TEMP_MAX_AGE_S. A temp file of a live writer is left alone."""
    stale = []
    for path in temps:
        if writer_is_gone(path.rsplit("/", 1)[-1], local=location.is_local):
            stale.append(path)
            continue
        try:
            modified = location.fs.modified(path).timestamp()
        except (FileNotFoundError, NotImplementedError, OSError):
            continue
        if now - modified > TEMP_MAX_AGE_S:
            stale.append(path)
    return stale


def _read_for_compaction(location: StoreLocation, table: str, path: str) -> pa.Table | None:
    """The segment's rows, or None (with a warning) when it is broken: a broken segment is never
    merged nor deleted by compaction; `faultlens doctor --quarantine` moves it aside."""
    reason = check_segment(location, table, path)
    if reason is None:
        try:
            with open_segment(location, path) as handle:
                return validate(table, pq.read_table(handle))
        except FileNotFoundError:
            return None
        except Exception as exc:
            text = str(exc).strip().splitlines()
            reason = f"unreadable data: {text[0][:200] if text else type(exc).__name__}"
    log.warning(
        "compact: leaving %s segment %s out: %s (see faultlens doctor)", table, path, reason
    )
    return None


def compact(
    store: str | StoreLocation,
    tables: Sequence[str] = TABLE_NAMES,
    *,
    min_segments: int = 2,
    clock: Callable[[], float] = time.time,
) -> list[CompactionResult]:
    """Merge the segments of every partition holding at least `min_segments` of them."""
    location = resolve_store(store)
    results = []
    for table in tables:
        for partition in list_partitions(location, table):
            # a live sink merging its own segments there holds the lock (collectors/store/rollup.py)
            with merge_lock(location, partition) as held:
                if not held:
                    log.warning("compact: %s is being merged by its writer: skipped this time",
                                partition)
                    continue
                result = _compact_partition(location, table, partition, min_segments, clock)
            if result is not None:
                results.append(result)
    return results


def _compact_partition(location: StoreLocation, table: str, partition: str, min_segments: int,
                       clock: Callable[[], float]) -> CompactionResult | None:
    segments, temps = _partition_files(location, partition)
    segments = _remove_leftovers(location, segments, temps, clock())
    if len(segments) < max(min_segments, 2):
        return None
    parts, merged_sources = [], []
    for path in segments:
        part = _read_for_compaction(location, table, path)
        if part is not None:
            parts.append(part)
            merged_sources.append(path)
    segments = merged_sources
    if len(segments) < max(min_segments, 2):
        return None
    merged = pa.concat_tables(parts).sort_by("ts")
    names = ",".join(path.rsplit("/", 1)[-1] for path in segments)
    merged_path = write_segment(
        location,
        partition,
        merged,
        name=new_segment_name(COMPACTED_PREFIX),
        metadata={REPLACES_KEY: names.encode()},
    )
    for path in segments:
        location.fs.rm_file(path)
    return CompactionResult(table, partition, len(segments), merged.num_rows, merged_path)


def retention(store: str | StoreLocation, days: int, tables: Sequence[str] = TABLE_NAMES, *,
              today: dt.date | None = None, dry_run: bool = False) -> list[RetentionResult]:
    """Delete every partition whose date is more than `days` days before `today` (UTC); `dry_run`:
    only say which."""
    if days < 0:
        raise ValueError(f"retention days must be >= 0, got {days}")
    location = resolve_store(store)
    today = today or dt.datetime.now(dt.UTC).date()
    cutoff = (today - dt.timedelta(days=days)).isoformat()
    results = []
    for table in tables:
        for partition in list_partitions(location, table):
            date = next((p[5:] for p in partition.split("/") if p.startswith("date=")), "")
            if date and date < cutoff:
                segments, _ = _partition_files(location, partition)
                if not dry_run:
                    location.fs.rm(partition, recursive=True)
                results.append(RetentionResult(table, partition, len(segments)))
    return results
