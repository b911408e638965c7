"""Tailing a store: after Store.refresh(), read only the segments not seen before, and keep a
bounded window of rows per table in memory for the live engine.

A tail given a `PartitionListing` (the follower of one job) lists only the partitions its window can
hold rows of, instead of the whole of each table: see PartitionListing for what it lists and when a
new segment is seen. On an object store the follower's tail lists the landing log instead
(attribution/reading/landed.py). The segments read are remembered while they are listed only: the
memory of a long tail follows its listing, not its history.

Compaction replaces small segments by one merged `c-` segment; a merged segment whose replaced
segments were all read already is skipped, so a row is never counted twice. A segment that cannot be
read is logged, counted and skipped (it is not retried forever); the engine goes on with the others.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from faultlens.collectors.store.layout import (
    COMPACTED_PREFIX,
    StoreError,
    StoreLocation,
    checked_segments,
    is_segment_name,
    replaced_by,
    replaced_segments,
    safe_value,
)
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.schema import SchemaError, empty_table, schema_for, validate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewSegment:
    table: str
    path: str
    rows: int
    # wall-clock seconds when the segment became visible (its mtime), if known
    landed_at: float | None


class TailListing(Protocol):
    """What a tail lists on each poll instead of the store's tables whole: PartitionListing (the
    partitions of one job), attribution/reading/landed.py LandingListing (an object store's landing
    log)."""

    def refresh(self, since: Mapping[str, str | None]) -> None: ...

    def segments(self, table: str) -> list[str]: ...

    def landed_at(self, path: str) -> float | None: ...


@dataclass
class TailState:
    tables: dict[str, pa.Table] = field(default_factory=dict)  # tables kept as Arrow
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)  # tables kept as pandas frames
    seen: dict[str, set[str]] = field(default_factory=dict)
    unreadable: int = 0


class SegmentTail:
    """Reads new segments of some tables of a Store and keeps their rows (bounded) in memory: as
    pandas frames (converted once per segment, by `to_frame`), or as Arrow for the tables named in
    `arrow_tables`."""

    def __init__(self, store: object, tables: Sequence[str], *, retain_s: float, max_rows: int,
                 to_frame: Callable[[pa.Table, str], pd.DataFrame],
                 arrow_tables: Sequence[str] = (), listing: TailListing | None = None) -> None:
        self.store = store
        self.listing = listing  # None: each poll lists the store's tables whole (Store.refresh)
        self.tables = list(tables)
        self.retain = dt.timedelta(seconds=retain_s)
        self.max_rows = max_rows
        self.to_frame = to_frame
        self.arrow_tables = set(arrow_tables)
        self.state = TailState(
            tables={t: empty_table(t) for t in self.tables if t in self.arrow_tables},
            frames={
                t: to_frame(empty_table(t), t) for t in self.tables if t not in self.arrow_tables
            },
            seen={t: set() for t in self.tables},
        )

    def table(self, name: str) -> pa.Table:
        return self.state.tables[name]

    def frame(self, name: str) -> pd.DataFrame:
        return self.state.frames[name]

    def poll(self) -> list[NewSegment]:
        """List the store again and read the segments that appeared since the last poll."""
        listed_of: Callable[[str], list[str]]
        if self.listing is None:
            self.store.refresh(self.tables, views=False)  # type: ignore[attr-defined]  (the files are read here)
            listed_of = self.store.segments  # type: ignore[attr-defined]
        else:
            # only what the listing names, read here (_read checks each segment as it reads it): no
            # footer read first per segment (an object store's request each), no per-segment
            # verdict kept for the store's whole history
            self.listing.refresh({name: self.oldest_date(name) for name in self.tables})
            listed_of = self.listing.segments
        location = self.store.location  # type: ignore[attr-defined]
        arrived: list[NewSegment] = []
        for name in self.tables:
            seen = self.state.seen[name]
            listed = listed_of(name)
            fresh = [p for p in listed if p not in seen]
            parts = []
            for path in fresh:
                seen.add(path)
                if path.rsplit("/", 1)[-1].startswith(COMPACTED_PREFIX):
                    replaced = {
                        f"{path.rsplit('/', 1)[0]}/{old}" for old in replaced_by(location, path)
                    }
                    if replaced and replaced <= seen:
                        continue  # its rows were read from the segments it replaces
                    if replaced & seen:
                        log.warning("compacted segment %s replaces segments read only in part; "
                                    "some rows may be counted twice", path)
                table = self._read(location, name, path)
                if table is None:
                    continue
                parts.append(table)
                landed = self.listing.landed_at(path) if self.listing is not None else None
                arrived.append(NewSegment(name, path, table.num_rows,
                                          landed if landed is not None else _mtime(location, path)))
            # what is no longer listed is never listed again (names are unique; a date leaves the
            # window for good): keep only the listed, so the set follows the listing, not history
            self.state.seen[name] = seen & set(listed)
            if not parts:
                continue
            if name in self.arrow_tables:
                self.state.tables[name] = self._trim(
                    pa.concat_tables([self.state.tables[name], *parts])
                )
            else:
                new = [self.to_frame(part, name) for part in parts]
                current = self.state.frames[name]
                frames = [f for f in (current, *new) if not f.empty]
                merged = (
                    pd.concat(frames, ignore_index=True)
                    if len(frames) > 1
                    else (frames[0] if frames else current)
                )
                self.state.frames[name] = self._trim_frame(merged)
        return arrived

    def oldest_date(self, name: str) -> str | None:
        """The UTC date (YYYY-MM-DD) of the window start of table `name`: every row of an older date
        partition would be dropped on arrival. None while the table holds no rows (any date may hold
        its first ones)."""
        if name in self.arrow_tables:
            table = self.state.tables[name]
            newest = pc.max(table.column("ts")).as_py() if table.num_rows else None
        else:
            frame = self.state.frames[name]
            newest = frame["ts"].max() if not frame.empty else None
        cutoff = self._cutoff(newest) if newest is not None and not pd.isna(newest) else None
        return None if cutoff is None else cutoff.astimezone(dt.UTC).date().isoformat()

    def _read(self, location: object, name: str, path: str) -> pa.Table | None:
        try:
            with open_segment(location, path) as handle:  # type: ignore[arg-type]
                table = pq.read_table(handle)
            known = [c for c in table.column_names if schema_for(name).get_field_index(c) >= 0]
            return validate(name, table.select(known).replace_schema_metadata(None))
        except FileNotFoundError:
            # compacted away between listing and reading: its rows are in the merged segment
            return None
        except (OSError, pa.ArrowException, SchemaError) as exc:
            self.state.unreadable += 1
            log.warning("segment %s of %s cannot be read, skipped: %s", path, name, exc)
            return None

    def _trim(self, table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            return table
        cutoff = self._cutoff(pc.max(table.column("ts")).as_py())
        if cutoff is not None:
            keep = pc.greater_equal(
                table.column("ts"), pa.scalar(cutoff, table.schema.field("ts").type)
            )
            if not pc.all(keep).as_py():
                table = table.filter(keep)
        if table.num_rows > self.max_rows:
            table = table.slice(table.num_rows - self.max_rows)
        return table.combine_chunks() if table.column(0).num_chunks > 64 else table


    def _cutoff(self, newest: dt.datetime | None) -> dt.datetime | None:
        if newest is None:
            return None
        # relative to the newest row, but never to a row from the future (a skewed clock must not
        # push everything else out)
        return min(newest, dt.datetime.now(dt.UTC)) - self.retain

    def _trim_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty:
            return frame
        cutoff = self._cutoff(frame["ts"].max())
        if cutoff is not None and frame["ts"].min() < cutoff:
            frame = frame[frame["ts"] >= cutoff]
        if len(frame) > self.max_rows:
            frame = frame.iloc[len(frame) - self.max_rows:]
        return frame.reset_index(drop=True)


def _mtime(location: object, path: str) -> float | None:
    if getattr(location, "is_local", False):
        try:
            return os.stat(path).st_mtime
        except OSError:
            return None
    try:
        info = location.fs.info(path)  # type: ignore[attr-defined]
    except (OSError, ValueError):
        return None
    value = info.get("mtime") or info.get("LastModified") or info.get("created")
    if isinstance(value, dt.datetime):
        return value.timestamp()
    return float(value) if isinstance(value, (int, float)) else None


# ---------------------------------------------------------------- the listing of one job's
# partitions

NODE_JOB = "_node"  # the job= value of node-level rows (GPU samples and events of no job)


def _is_plain_s3(fs: object) -> bool:
    """s3fs without object versions: listed here by ListObjectsV2 with StartAfter."""
    protocol = getattr(fs, "protocol", ())
    protocols = {protocol} if isinstance(protocol, str) else set(protocol)
    return (
        bool({"s3", "s3a"} & protocols)
        and hasattr(fs, "call_s3")
        and not getattr(fs, "version_aware", False)
    )


def s3_listing(fs: object, directory: str, start_after: str | None) -> list[dict] | None:
    """The objects below `directory` on S3 whose keys sort after `directory/start_after`: one flat
    ListObjectsV2 per 1,000 keys, from StartAfter on, as s3fs info dicts. None when `fs` is not a
    plain S3 filesystem (then the caller lists the fsspec way)."""
    if not _is_plain_s3(fs):
        return None
    bucket, key, _ = fs.split_path(directory)  # type: ignore[attr-defined]
    prefix = key.rstrip("/") + "/"
    kwargs: dict[str, str] = {"Bucket": bucket, "Prefix": prefix}
    if start_after:
        kwargs["StartAfter"] = prefix + start_after
    found = []
    while True:
        page = fs.call_s3("list_objects_v2", **kwargs)  # type: ignore[attr-defined]
        for item in page.get("Contents", ()):
            name = f"{bucket}/{item['Key']}"
            found.append({**item, "Key": name, "name": name, "type": "file", "size": item["Size"]})
        if not page.get("IsTruncated"):
            return found
        kwargs.pop("StartAfter", None)
        kwargs["ContinuationToken"] = page["NextContinuationToken"]


class PartitionListing:
    """What the follower of one job lists on each poll: the partitions its window can hold rows of,
    and nothing else of the store.

    For every tailed table, two prefixes: `<table>/job=<job>/`, and `<table>/job=_node/` (node-level
    rows: GPU samples and events belong to no job) kept to the nodes of the job (every `node=` value
    seen so far in the job's own partitions, of any table). Within each prefix only the date
    partitions on or after `since[table]`, the UTC date of the table's window start
    (SegmentTail.oldest_date: retain_s behind the table's newest row, or behind now when that row is
    in the future); every date while the table's window is empty. On S3 a prefix costs one
    ListObjectsV2 request per 1,000 keys of those dates (StartAfter=`date=<since>`: older dates and
    other jobs are never sent); elsewhere, a listing of the date directories and one find per date
    wanted. Node-level partitions of other nodes within those dates are listed (a prefix per node
    and date would cost a request each) but never read.

    The bound: a segment that lands in a listed partition, whatever its date and however late it
    lands, is in the next refresh; a node-level segment of a node the job's partitions do not name
    yet, in the refresh after the one that first sees the node in them (the same refresh when both
    are there: the job's prefixes are listed first). Never listed: other jobs; node-level rows of
    nodes that never wrote into the job's partitions (a job's follower finds health incidents on its
    own nodes only: follow the whole store for the others); and dates before a table's window start,
    whose rows are all older than that start (a date partition holds the rows of its UTC day of
    `ts`, collectors/store/layout.py), so the tail would drop every one of them on arrival. The one
    difference from listing everything: a table at its max_rows cap keeps its newest rows by
    arrival, not by time, and would have kept some rows of a late segment of such a date.

    On S3 the listing of each partition listed replaces fsspec's cached listing of it (s3fs answers
    `info` and `open` of a segment from its parent's cached listing, and a stale one says a new
    segment does not exist); elsewhere the cache is emptied before listing, as list_segments does.
    Compacted segments are handled as by list_segments (the segments they replace are left out); the
    names a compacted segment replaces are read from its footer once, not on every poll.
    """

    def __init__(self, location: StoreLocation, job: str) -> None:
        self.location = location
        self.job = safe_value(job)
        self.nodes: set[str] = set()  # node= values of the job's partitions
        self._segments: dict[str, list[str]] = {}
        # compacted segment -> the names it replaces (immutable)
        self._replaces: dict[str, list[str]] = {}

    def segments(self, table: str) -> list[str]:
        """The segments of `table` the last refresh found, sorted, replaced ones left out
        (Store.refresh's lister).
        """
        return list(self._segments.get(table, []))

    def landed_at(self, path: str) -> float | None:
        """None: the tail asks the segment's mtime (answered from the cached listing)."""
        return None

    def refresh(self, since: Mapping[str, str | None]) -> None:
        """List what the tables of `since` need (table -> oldest date wanted, None for every date).
        """
        if not self.location.is_local and not _is_plain_s3(self.location.fs):
            self.location.fs.invalidate_cache()
        try:
            own = {table: self._list(table, self.job, low) for table, low in since.items()}
            nodes = {table: self._list(table, NODE_JOB, low) for table, low in since.items()} \
                if self.job != NODE_JOB else {}
        except OSError as exc:
            raise StoreError(f"store {self.location.url!r}: cannot list: {exc}") from None
        for table in since:
            self._segments[table] = self._drop_replaced(sorted(own[table] + nodes.get(table, [])))
        listed = {path for paths in self._segments.values() for path in paths}
        for path in [p for p in self._replaces if p not in listed]:
            del self._replaces[path]  # compacted again, or out of the window

    def _list(self, table: str, job: str, low: str | None) -> list[str]:
        node_level = job == NODE_JOB
        if node_level and not self.nodes:
            return []  # no node of the job known yet: no node-level row is the job's
        fs = self.location.fs
        base = self.location.join(table, f"job={job}")
        entries = s3_listing(fs, base, f"date={low}" if low is not None else None)
        if entries is not None:
            self._cache(base, entries)
            paths = [entry["name"] for entry in entries]
        else:
            paths = self._find(base, low)
        kept = []
        for path in paths:
            parts = path[len(base):].strip("/").split("/")
            if (
                len(parts) != 3
                or not parts[0].startswith("date=")
                or not parts[1].startswith("node=")
                or not is_segment_name(parts[2])
            ):
                continue
            if low is not None and parts[0][len("date="):] < low:
                continue
            node = parts[1][len("node="):]
            if node_level and node not in self.nodes:
                continue
            if not node_level:
                self.nodes.add(node)
            kept.append(path)
        return checked_segments(self.location, kept)

    def _find(self, base: str, low: str | None) -> list[str]:
        fs = self.location.fs
        try:
            dates = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        found: list[str] = []
        for name in sorted(dates, reverse=True):  # newest first
            if name.startswith("date=") and (low is None or name[len("date="):] >= low):
                found.extend(str(p) for p in fs.find(f"{base}/{name}"))
        return found

    def _cache(self, base: str, entries: list[dict]) -> None:
        fs = self.location.fs
        # base and its ancestors (their listings may lack new date or node directories)
        fs.invalidate_cache(base)
        by_directory: dict[str, list[dict]] = {}
        for entry in entries:
            by_directory.setdefault(entry["name"].rsplit("/", 1)[0], []).append(entry)
        for directory, listing in by_directory.items():
            fs.dircache[directory] = sorted(listing, key=lambda entry: entry["name"])

    def _drop_replaced(self, segments: list[str]) -> list[str]:
        replaced = replaced_segments(self.location, segments, self._names)
        return [path for path in segments if path not in replaced]

    def _names(self, path: str) -> list[str]:
        names = self._replaces.get(path)
        if names is None:
            names = replaced_by(self.location, path)
            if names:  # an unreadable footer is read again next time
                self._replaces[path] = names
        return names
