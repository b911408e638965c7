"""Tailing a store: after Store.refresh(), read only the segments not seen before, and keep a bounded window of
rows per table in memory for the live engine.

A tail given a `PartitionListing` (the follower of one job) lists only the partitions its window can hold rows of,
instead of the whole of each table: see PartitionListing for what it lists and when a new segment is seen.

Compaction replaces small segments by one merged `c-` segment; a merged segment whose replaced segments were all
read already is skipped, so a row is never counted twice. A segment that cannot be read is logged, counted and
skipped (it is not retried forever); the engine goes on with the others.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from faultlens.collectors.store.layout import (
    COMPACTED_PREFIX,
    StoreError,
    StoreLocation,
    is_segment_name,
    replaced_by,
    safe_value,
)
from faultlens.collectors.store.schema import SchemaError, empty_table, schema_for, validate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewSegment:
    table: str
    path: str
    rows: int
    landed_at: float | None  # wall-clock seconds when the segment became visible (its mtime), if known


@dataclass
class TailState:
    tables: dict[str, pa.Table] = field(default_factory=dict)  # tables kept as Arrow
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)  # tables kept as pandas frames
    seen: dict[str, set[str]] = field(default_factory=dict)
    unreadable: int = 0


class SegmentTail:
    """Reads new segments of some tables of a Store and keeps their rows (bounded) in memory: as pandas frames
    (converted once per segment, by `to_frame`), or as Arrow for the tables named in `arrow_tables`."""

    def __init__(self, store: object, tables: Sequence[str], *, retain_s: float, max_rows: int,
                 to_frame: Callable[[pa.Table, str], pd.DataFrame],
                 arrow_tables: Sequence[str] = (), listing: PartitionListing | None = None) -> None:
        self.store = store
        self.listing = listing  # None: each poll lists the store's tables whole (Store.refresh)
        self.tables = list(tables)
        self.retain = dt.timedelta(seconds=retain_s)
        self.max_rows = max_rows
        self.to_frame = to_frame
        self.arrow_tables = set(arrow_tables)
        self.state = TailState(
            tables={t: empty_table(t) for t in self.tables if t in self.arrow_tables},
            frames={t: to_frame(empty_table(t), t) for t in self.tables if t not in self.arrow_tables},
            seen={t: set() for t in self.tables})

    def table(self, name: str) -> pa.Table:
        return self.state.tables[name]

    def frame(self, name: str) -> pd.DataFrame:
        return self.state.frames[name]

    def poll(self) -> list[NewSegment]:
        """List the store again and read the segments that appeared since the last poll."""
        if self.listing is None:
            self.store.refresh(self.tables, views=False)  # type: ignore[attr-defined]  (the files are read here)
        else:  # only the partitions the window can hold rows of
            self.listing.refresh({name: self.oldest_date(name) for name in self.tables})
            self.store.refresh(self.tables, views=False,  # type: ignore[attr-defined]
                               lister=self.listing.segments)
        location = self.store.location  # type: ignore[attr-defined]
        arrived: list[NewSegment] = []
        for name in self.tables:
            seen = self.state.seen[name]
            fresh = [p for p in self.store.segments(name) if p not in seen]  # type: ignore[attr-defined]
            parts = []
            for path in fresh:
                seen.add(path)
                if path.rsplit("/", 1)[-1].startswith(COMPACTED_PREFIX):
                    replaced = {f"{path.rsplit('/', 1)[0]}/{old}" for old in replaced_by(location, path)}
                    if replaced and replaced <= seen:
                        continue  # its rows were read from the segments it replaces
                    if replaced & seen:
                        log.warning("compacted segment %s replaces segments read only in part; "
                                    "some rows may be counted twice", path)
                table = self._read(location, name, path)
                if table is None:
                    continue
                parts.append(table)
                arrived.append(NewSegment(name, path, table.num_rows, _mtime(location, path)))
            if not parts:
                continue
            if name in self.arrow_tables:
                self.state.tables[name] = self._trim(pa.concat_tables([self.state.tables[name], *parts]))
            else:
                new = [self.to_frame(part, name) for part in parts]
                current = self.state.frames[name]
                frames = [f for f in (current, *new) if not f.empty]
                merged = pd.concat(frames, ignore_index=True) if len(frames) > 1 else (frames[0] if frames
                                                                                     else current)
                self.state.frames[name] = self._trim_frame(merged)
        return arrived

    def oldest_date(self, name: str) -> str | None:
        """The UTC date (YYYY-MM-DD) of the window start of table `name`: every row of an older date partition
        would be dropped on arrival. None while the table holds no rows (any date may hold its first ones)."""
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
            with location.fs.open(path, "rb") as handle:  # type: ignore[attr-defined]
                table = pq.read_table(handle)
            known = [c for c in table.column_names if schema_for(name).get_field_index(c) >= 0]
            return validate(name, table.select(known).replace_schema_metadata(None))
        except FileNotFoundError:
            return None  # compacted away between listing and reading: its rows are in the merged segment
        except (OSError, pa.ArrowException, SchemaError) as exc:
            self.state.unreadable += 1
            log.warning("segment %s of %s cannot be read, skipped: %s", path, name, exc)
            return None

    def _trim(self, table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            return table
        cutoff = self._cutoff(pc.max(table.column("ts")).as_py())
        if cutoff is not None:
            keep = pc.greater_equal(table.column("ts"), pa.scalar(cutoff, table.schema.field("ts").type))
            if not pc.all(keep).as_py():
                table = table.filter(keep)
        if table.num_rows > self.max_rows:
            table = table.slice(table.num_rows - self.max_rows)
        return table.combine_chunks() if table.column(0).num_chunks > 64 else table


    def _cutoff(self, newest: dt.datetime | None) -> dt.datetime | None:
        if newest is None:
            return None
        # relative to the newest row, but never to a row from the future (a skewed clock must not push
        # everything else out)
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


# ---------------------------------------------------------------- the listing of one job's partitions

NODE_JOB = "_node"  # the job= value of node-level rows (GPU samples and events of no job)
PAGE_KEYS = 1000  # keys per LIST response (S3's default and maximum): what the plans below count in


def _pages(keys: int, page_keys: int) -> int:
    return max(1, -(-keys // page_keys))


def _is_s3(fs: object) -> bool:
    protocol = getattr(fs, "protocol", ())
    return bool({"s3", "s3a"} & ({protocol} if isinstance(protocol, str) else set(protocol)))


def _files_under(fs: object, parent: str, stem: str) -> list[str]:
    """Every file below `parent/stem` (stem: the start of a name, "date=" or "node=x/"). On S3 this is one flat
    LIST of that key prefix (one request per 1,000 keys): fsspec neither serves it from nor stores it in its
    listings cache, and does not follow an empty result with a HEAD. Elsewhere fs.find."""
    if _is_s3(fs):
        return [str(p) for p in fs.find(parent, prefix=stem)]  # type: ignore[attr-defined]
    target = f"{parent}/{stem.rstrip('/')}" if stem.endswith("/") else parent
    try:
        found = [str(p) for p in fs.find(target)]  # type: ignore[attr-defined]
    except FileNotFoundError:
        return []
    return found if stem.endswith("/") else [p for p in found if p.startswith(f"{parent}/{stem}")]


def _subdirs(fs: object, parent: str, stem: str) -> list[str]:
    """The names (not paths) of the directories right below `parent` whose names start with `stem`: on S3 one
    delimiter LIST of the prefix, read fresh (never from the listings cache)."""
    if _is_s3(fs):
        fs.invalidate_cache(parent)  # type: ignore[attr-defined]  (drops parent and its ancestors, not below)
        entries = fs.find(parent, maxdepth=1, withdirs=True, detail=True, prefix=stem,  # type: ignore[attr-defined]
                          refresh=True)
        names = [str(name) for name, info in entries.items() if info.get("type") == "directory"]
    else:
        try:
            names = [str(p) for p in fs.ls(parent, detail=False)]  # type: ignore[attr-defined]
        except (FileNotFoundError, NotADirectoryError):
            return []
    return sorted({name.rstrip("/").rsplit("/", 1)[-1] for name in names
                   if name.rstrip("/").rsplit("/", 1)[-1].startswith(stem)})


@dataclass
class _Scope:
    """One `<table>/job=<job>/` prefix as last listed: date -> node -> segment paths. Dates older than the window
    keep their last listing (never returned; their sizes price the plans)."""

    dates: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    listed: bool = False  # listed whole once: every date directory is known

    def keys(self, date: str | None = None) -> int:
        days = [self.dates.get(date, {})] if date is not None else self.dates.values()
        return sum(len(paths) for day in days for paths in day.values())


class PartitionListing:
    """What the follower of one job lists on each poll: the partitions its window can hold rows of, and nothing
    else of the store.

    For every tailed table, two prefixes: `<table>/job=<job>/` and `<table>/job=_node/` (node-level rows: GPU samples
    and events belong to no job), and in the latter only the nodes of the job (every `node=` value seen so far in
    the job's own partitions, of any table). Within a prefix, only the dates on or after `since[table]`, the UTC
    date of the table's window start (SegmentTail.oldest_date: retain_s behind the table's newest row, or behind now
    when that row is in the future); every date when the table's window is empty. Each prefix is listed the
    cheapest of three ways, priced in LIST requests from its previous listing: whole (one flat listing of
    `job=<job>/`), by date (one delimiter listing of the date directories, then one flat listing of each date
    wanted), or, for `job=_node`, node by node within a date (one flat listing of each job node's partition), when
    the job holds fewer nodes than that date holds pages.

    The bound: a segment that lands in a listed partition is in the next refresh, whatever its date and however
    late it lands; so is a node-level segment of a node in the refresh after the one that first sees the node in
    the job's partitions (in the same refresh when both are there: the job's prefixes are listed first). Not
    listed, ever: other jobs; node-level rows of nodes that never wrote into the job's partitions (a job's follower
    finds health incidents on its own nodes only; follow the whole store for the others); and dates before a
    table's window start, whose rows are all older than that start, so the tail would drop every one of them on
    arrival (dates are the UTC day of `ts`, collectors/store/layout.py). The one difference: a table at its
    max_rows cap keeps its newest rows by arrival, not by time, and a late segment of such a date is not read.

    Compacted segments are handled as by list_segments (the segments they replace are left out); the names a
    compacted segment replaces are read from its footer once, not on every poll.
    """

    def __init__(self, location: StoreLocation, job: str, *, page_keys: int = PAGE_KEYS) -> None:
        self.location = location
        self.job = safe_value(job)
        self.page_keys = page_keys
        self.nodes: set[str] = set()  # node= values of the job's partitions
        self._scopes: dict[tuple[str, str], _Scope] = {}
        self._segments: dict[str, list[str]] = {}
        self._replaces: dict[str, list[str]] = {}  # compacted segment -> names it replaces (immutable)
        self.plans: dict[tuple[str, str], str] = {}  # (table, job) -> how it was listed last: whole|dates|nodes

    def segments(self, table: str) -> list[str]:
        """The segments of `table` the last refresh found, sorted, replaced ones left out (Store.refresh's lister)."""
        return list(self._segments.get(table, []))

    def refresh(self, since: Mapping[str, str | None]) -> None:
        """List what the tables of `since` need (table -> oldest date wanted, None for every date)."""
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
            del self._replaces[path]  # compacted away again, or out of the window

    # ------------------------------------------------------------ one prefix

    def _list(self, table: str, job: str, low: str | None) -> list[str]:
        base = self.location.join(table, f"job={job}")
        scope = self._scopes.setdefault((table, job), _Scope())
        node_level = job == NODE_JOB
        if node_level and not self.nodes:
            return []  # no node of the job known yet: none of the node-level rows is the job's
        if not scope.listed:
            plan = "whole" if low is None else "dates"
        else:
            wanted = [d for d in scope.dates if low is None or d >= low]
            by_date = 1 + sum(self._date_cost(scope, d, node_level) for d in wanted)
            plan = "whole" if _pages(scope.keys(), self.page_keys) <= by_date else "dates"
        self.plans[(table, job)] = plan
        if plan == "whole":
            scope.dates = {}
            for path in _files_under(self.location.fs, base, "date="):
                self._add(scope, base, path)
        else:
            present = _subdirs(self.location.fs, base, "date=")
            dates = [name.split("=", 1)[1] for name in present]
            for gone in set(scope.dates) - set(dates):  # retention removed it
                del scope.dates[gone]
            for date in sorted(dates, reverse=True):  # newest first
                if low is not None and date < low:
                    continue
                self._list_date(table, scope, base, date, node_level)
        scope.listed = True
        if not node_level:
            self.nodes.update(node for day in scope.dates.values() for node in day)
        return [path for date, day in scope.dates.items() if low is None or date >= low
                for node, paths in day.items() if not node_level or node in self.nodes for path in paths]

    def _date_cost(self, scope: _Scope, date: str, node_level: bool) -> int:
        whole_date = _pages(scope.keys(date), self.page_keys)
        if not node_level:
            return whole_date
        day = scope.dates.get(date, {})
        return min(whole_date, sum(_pages(len(day.get(node, ())), self.page_keys) for node in self.nodes) or 1)

    def _list_date(self, table: str, scope: _Scope, base: str, date: str, node_level: bool) -> None:
        directory = f"{base}/date={date}"
        day = scope.dates.get(date)
        if node_level and day is not None and self.nodes and \
                sum(_pages(len(day.get(n, ())), self.page_keys) for n in self.nodes) < _pages(scope.keys(date),
                                                                                               self.page_keys):
            self.plans[(table, NODE_JOB)] = "nodes"
            for node in sorted(self.nodes):
                day.pop(node, None)
                for path in _files_under(self.location.fs, directory, f"node={node}/"):
                    self._add(scope, base, path)
            return
        scope.dates[date] = {}
        for path in _files_under(self.location.fs, directory, "node="):
            self._add(scope, base, path)

    @staticmethod
    def _add(scope: _Scope, base: str, path: str) -> None:
        parts = path[len(base):].strip("/").split("/")
        if len(parts) != 3 or not is_segment_name(parts[2]):
            return
        date, node = parts[0].partition("=")[2], parts[1].partition("=")[2]
        if parts[0].startswith("date=") and parts[1].startswith("node="):
            scope.dates.setdefault(date, {}).setdefault(node, []).append(path)

    def _drop_replaced(self, segments: list[str]) -> list[str]:
        replaced: set[str] = set()
        for path in segments:
            directory, name = path.rsplit("/", 1)
            if name.startswith(COMPACTED_PREFIX):
                names = self._replaces.get(path)
                if names is None:
                    names = replaced_by(self.location, path)
                    if names:  # an unreadable footer is asked again next time
                        self._replaces[path] = names
                replaced.update(f"{directory}/{old}" for old in names)
        return [path for path in segments if path not in replaced]
