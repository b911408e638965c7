"""The store reader: an embedded DuckDB connection with one view per table over the Parquet layout.

Local stores are scanned by DuckDB's own Parquet reader; object stores (s3://, gs://, memory://,
...) go through pyarrow datasets on the fsspec filesystem, so no DuckDB extension is downloaded at
run time. Every view has the full current schema of its table: segments written by an older schema
version with fewer columns read as nulls in the new columns (union by name). Partition pruning (job,
date range, node) happens on the listing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from faultlens.attribution.reading.segment_check import BadSegment, deep_check, inspect_segment
from faultlens.collectors.store.layout import (
    StoreError,
    StoreLocation,
    list_segments,
    probe_store,
    resolve_store,
    safe_value,
)
from faultlens.collectors.store.schema import (
    TABLE_NAMES,
    Role,
    as_ns_type,
    empty_table,
    schema_for,
    tables_with,
)
from faultlens.errors import FaultlensError

log = logging.getLogger("faultlens.store")
_MAX_VANISHED_RETRIES = 8  # refresh-and-retry rounds of one query whose segments vanish under it
# segments found broken while a query reads them (footer fine, data pages not)
_MAX_BAD_PER_QUERY = 64


class QueryError(ValueError, FaultlensError):
    """A SQL query failed: the message is DuckDB's on one line, with its hints ("Did you mean ...").
    """


def _duckdb_message(text: str) -> str:
    """DuckDB's error on one line: the error, then its hint lines (Did you mean, Candidate
    bindings), without the echoed query and caret."""
    kept = []
    for line in text.splitlines():
        if line.startswith("LINE ") or not line.strip() or set(line.strip()) <= {"^"}:
            if line.startswith("LINE "):
                break
            continue
        kept.append(line.strip())
    return " ".join(kept) or text.splitlines()[0]


@dataclass(frozen=True)
class TableSummary:
    table: str
    rows: int
    segments: int
    ts_min: Any
    ts_max: Any
    # listed segments skipped because they cannot be read (see `faultlens doctor`)
    bad_segments: int = 0


def _duck_type(typ: pa.DataType) -> str:
    """The DuckDB type of an Arrow type of the schemas that hold timestamps (timestamps, lists,
    structs).
    """
    if pa.types.is_timestamp(typ):
        return "TIMESTAMPTZ"
    if pa.types.is_list(typ):
        return f"{_duck_type(typ.value_type)}[]"
    if pa.types.is_struct(typ):
        return "STRUCT(" + ", ".join(f'"{typ.field(i).name}" {_duck_type(typ.field(i).type)}'
                                     for i in range(typ.num_fields)) + ")"
    return {
        pa.string(): "VARCHAR",
        pa.int64(): "BIGINT",
        pa.int32(): "INTEGER",
        pa.float64(): "DOUBLE",
    }[typ]


def _microsecond_casts(table: str) -> str:
    """SELECT * REPLACE items that make every timestamp column of `table` microseconds (top level:
    truncated, as the follower's validate() does; inside evidence structs: DuckDB's cast, which
    rounds)."""
    items = []
    for field in schema_for(table):
        if pa.types.is_timestamp(field.type):
            items.append(f"date_trunc('microsecond', \"{field.name}\")::TIMESTAMPTZ AS "
                         f"\"{field.name}\"")
        elif not as_ns_type(field.type).equals(field.type):
            items.append(f'CAST("{field.name}" AS {_duck_type(field.type)}) AS "{field.name}"')
    return ", ".join(items)


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


_DATA_ERRORS = tuple(
    getattr(duckdb, name)
    for name in ("IOException", "InvalidInputException", "InternalException")
    if hasattr(duckdb, name)
)
_DATA_WORDS = (
    "parquet",
    "thrift",
    "tprotocol",
    "corrupt",
    "magic bytes",
    "snappy",
    "zstd",
    "decompress",
)


def _data_error(exc: BaseException, text: str) -> bool:
    """An error that may come from a segment's bytes (not from the SQL itself, nor memory or an
    interrupt).
    """
    if _vanished(exc, text):
        return False
    lowered = text.lower()
    return isinstance(exc, (*_DATA_ERRORS, pa.ArrowException)) or any(
        word in lowered for word in _DATA_WORDS
    )


def _vanished(exc: BaseException, text: str) -> bool:
    """A segment that is gone (compaction, retention) rather than broken."""
    return isinstance(exc, FileNotFoundError) or "No such file" in text or "No files found" in text


# SQL that reads the catalog rather than naming tables: every table gets its view
_CATALOG_RE = re.compile(r"\b(show|describe|summarize|information_schema|pragma|duckdb_\w+)\b",
                         re.IGNORECASE)


def tables_named(sql: str) -> list[str]:
    """The store's tables a query can read: those it names as a word (DuckDB's identifiers are case
    blind), or every table when it reads the catalog (SHOW TABLES, information_schema, ...). A
    one-off query lists and binds only these (Store(tables=...)); `faultlens sql` binds the rest
    and runs it again when it fails, so an error's hints ("Did you mean") are DuckDB's own."""
    if _CATALOG_RE.search(sql):
        return list(TABLE_NAMES)
    words = {word.lower() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}
    return [table for table in TABLE_NAMES if table in words]


#: tables whose rows belong to one job (partitioned under job=<job id>): the ones scope_to_job
#: narrows
JOB_TABLES = tables_with(Role.JOB_VIEW)


class Store:
    """Read access to a faultlens store through DuckDB views named after the tables."""

    def __init__(
        self,
        store: str | StoreLocation,
        *,
        jobs: Iterable[str] | None = None,
        date_from: str | None = None,
        date_to: str | None = None,
        nodes: Iterable[str] | None = None,
        threads: int | None = None,
        storage_options: dict[str, Any] | None = None,
        tables: Sequence[str] | None = None,
    ) -> None:
        """`tables`: the tables listed and given a view now (default: every table); the others get
        theirs from the first refresh that names them (the live follower lists only what it tails,
        as it tails it)."""
        self.location = resolve_store(store, **(storage_options or {}))
        probe_store(self.location)  # an unreachable object store is an error, never an empty store
        self.jobs = list(jobs) if jobs is not None else None
        self.nodes = list(nodes) if nodes is not None else None
        for value in [*(self.jobs or ()), *(self.nodes or ())]:
            safe_value(value)  # a value no partition can hold is an error whatever is listed
        self.date_from = date_from
        self.date_to = date_to
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone='UTC'")
        # DuckDB draws a progress bar on stdout for a query over ~2 s: it would corrupt a command's
        # --json output
        # in Jupyter it is a widget, and the setting refuses to change
        with contextlib.suppress(duckdb.Error):
            self.con.execute("SET enable_progress_bar=false")
        if threads:
            self.con.execute(f"SET threads={int(threads)}")
        self._segments: dict[str, list[str]] = {}
        # (table, path) -> (stamp, reason)
        self._checked: dict[tuple[str, str], tuple[Any, str | None]] = {}
        # usable segments whose timestamps are not microseconds (schema version 1)
        self._legacy: set[str] = set()
        # usable segments' columns (SegmentInfo.columns): one set of columns reads without a union
        self._columns: dict[str, pa.Schema] = {}
        self._bad: dict[str, BadSegment] = {}
        self._read_ok: set[str] = set()  # segments read through without error by a deep scan
        # the job whose partitions alone the job tables' views read (scope_to_job)
        self._scope: str | None = None
        self.refresh(TABLE_NAMES if tables is None else tables)

    def segments(self, table: str) -> list[str]:
        return list(self._segments.get(table, []))

    def bad_segments(self, table: str | None = None) -> list[BadSegment]:
        """Listed segments the reader skips (unreadable, wrong schema), each named once in a
        warning.
        """
        return [bad for bad in self._bad.values() if table is None or bad.table == table]

    def _stamp(self, path: str) -> Any:
        if not self.location.is_local:
            return None  # object-store segments are written once (one PUT) and never change
        try:
            info = os.stat(path)
        except OSError:
            return None
        return (info.st_size, info.st_mtime_ns)

    def _mark_bad(self, table: str, path: str, reason: str) -> None:
        if path not in self._bad:
            log.warning(
                "store %s: skipping %s segment %s: %s", self.location.url, table, path, reason
            )
        self._bad[path] = BadSegment(table, path, reason)

    def _usable(self, table: str, segments: list[str]) -> list[str]:
        """The listed segments without those that cannot be read as `table` (checked once per
        segment).
        """
        stamps = {path: self._stamp(path) for path in segments}
        todo = [
            path
            for path in segments
            if (cached := self._checked.get((table, path))) is None or cached[0] != stamps[path]
        ]
        # footers of many new segments (object stores: one request each): read them in parallel
        if len(todo) > 8:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=16 if not self.location.is_local else 4) as pool:
                infos = list(
                    pool.map(lambda path: inspect_segment(self.location, table, path), todo)
                )
        else:
            infos = [inspect_segment(self.location, table, path) for path in todo]
        for path, info in zip(todo, infos, strict=True):
            self._checked[(table, path)] = (stamps[path], info.reason)
            if info.columns is not None:
                self._columns[path] = info.columns
            if info.legacy_units:
                self._legacy.add(path)
            else:
                self._legacy.discard(path)
        usable = []
        for path in segments:
            reason = self._checked[(table, path)][1]
            if reason is None:
                self._bad.pop(path, None)
                usable.append(path)
            else:
                self._mark_bad(table, path, reason)
        return usable

    def refresh(self, tables: Sequence[str] = TABLE_NAMES, *, views: bool = True,
                lister: Callable[[str], list[str]] | None = None) -> None:
        """List the store again and point every view at the segments visible now. views=False: only
        the listing (segments()), for a reader of the files themselves (the live tail): binding a
        view over every segment costs more than the poll that wants only the new ones. `lister`: a
        table's segments as listed by the caller (the tail of one job: attribution/reading/tail.py
        PartitionListing), instead of list_segments."""
        for table in tables:
            for attempt in range(5):
                try:
                    segments = (
                        lister(table)
                        if lister is not None
                        else list_segments(
                            self.location,
                            table,
                            jobs=self.jobs,
                            date_from=self.date_from,
                            date_to=self.date_to,
                            nodes=self.nodes,
                        )
                    )
                except OSError as exc:
                    raise StoreError(
                        f"store {self.location.url!r}: cannot list {table}: {exc}"
                    ) from None
                listed = set(segments)
                for path in [
                    p for p, bad in self._bad.items() if bad.table == table and p not in listed
                ]:
                    del self._bad[path]  # quarantined or removed since
                segments = self._usable(table, segments)
                if not views:
                    self._segments[table] = segments
                    break
                try:
                    segments = self._define_view_skipping(table, segments)
                except (duckdb.IOException, FileNotFoundError):
                    # segments keep vanishing under us (compaction/retention): give up loudly
                    if attempt == 4:
                        raise
                    # a listed segment was replaced (compaction) or expired before binding: list
                    # again
                    continue
                self._segments[table] = segments
                break

    def _define_view_skipping(self, table: str, segments: list[str]) -> list[str]:
        """Define the view; a segment DuckDB cannot bind (its error names it) is skipped, the rest
        kept.
        """
        for _ in range(_MAX_BAD_PER_QUERY):
            try:
                self._define_view(table, segments)
                return segments
            except duckdb.Error as exc:
                text = str(exc)
                named = next((path for path in segments if path in text), None)
                if named is None or _vanished(exc, text):
                    raise
                reason = f"unreadable: {text.splitlines()[0][:200]}"
                self._mark_bad(table, named, reason)
                self._checked[(table, named)] = (self._stamp(named), reason)
                segments = [path for path in segments if path != named]
        self._define_view(table, segments)
        return segments

    def scope_to_job(self, job: str | None) -> None:
        """Point the views of the job tables (JOB_TABLES) at the segments of `job`'s partitions only
        (None: at every segment again). A query filtering on job_id = job reads the same rows from
        far fewer files: in a store of many jobs every query otherwise opens the footer of every
        segment of the table (the batch pass runs a few dozen queries per job). Node-level tables
        (GPU samples and events) keep every segment: they are read by node and time, whatever job a
        row names. A refresh while scoped keeps the scope."""
        self._scope = job
        for table in JOB_TABLES:
            if table in self._segments:
                self._define_view(table, self._segments[table])

    def _scoped(self, table: str, segments: list[str]) -> list[str]:
        """The segments a view of `table` reads under the current scope: those under job=<the job>
        (a job's rows are written under its own partition, docs/design.md "Layout")."""
        if self._scope is None or table not in JOB_TABLES:
            return segments
        wanted = f"job={safe_value(self._scope)}"
        base = self.location.join(table)
        return [path for path in segments if path[len(base):].strip("/").split("/", 1)[0] == wanted]

    def _define_view(self, table: str, segments: list[str]) -> None:
        segments = self._scoped(table, segments)
        empty_name = f"_empty_{table}"
        self.con.register(empty_name, empty_table(table))
        quoted = f'"{table}"'
        if not segments:
            self.con.execute(f"CREATE OR REPLACE VIEW {quoted} AS SELECT * FROM {empty_name}")
            return
        legacy = any(path in self._legacy for path in segments)
        if self.location.is_local:
            files = ", ".join(_sql_string(path) for path in segments)
            # a union by name reads every file's schema at bind time and maps each file's columns:
            # segments that all have one set of columns (checked when listed) need neither
            kinds = {self._columns.get(path) for path in segments}
            union = "true" if len(kinds) != 1 or None in kinds else "false"
            source = f"read_parquet([{files}], union_by_name={union}, hive_partitioning=false)"
        else:
            # here, not at import: it pulls in pandas (slow CLI start-up)
            import pyarrow.dataset as ds
            from pyarrow.fs import FSSpecHandler, PyFileSystem

            # nanoseconds while reading (a version-1 segment casts to it losslessly), microseconds
            # in the view
            schema = schema_for(table)
            if legacy:
                schema = pa.schema([field.with_type(as_ns_type(field.type)) for field in schema])
            dataset = ds.dataset(segments, schema=schema, format="parquet",
                                 filesystem=PyFileSystem(FSSpecHandler(self.location.fs)))
            dataset_name = f"_dataset_{table}"
            self.con.register(dataset_name, dataset)
            source = dataset_name
        union = f"SELECT * FROM {empty_name} UNION ALL BY NAME SELECT * FROM {source}"
        # a store mixing units reads as the schema's microseconds (the union alone would be ns)
        if legacy:
            union = f"SELECT * REPLACE ({_microsecond_casts(table)}) FROM ({union})"
        self.con.execute(f"CREATE OR REPLACE VIEW {quoted} AS {union}")

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run SQL over the views and return an Arrow table. A segment removed under us (compaction,
        retention) triggers a refresh and retry; a segment whose data turns out unreadable while the
        query reads it is skipped from then on (one warning naming it) and the query runs again
        without it."""
        retries = 0
        found_bad = 0
        while True:
            try:
                relation = self.con.sql(sql, params=params) if params else self.con.sql(sql)
                if relation is None:
                    return pa.table({})
                return relation.to_arrow_table()
            except (duckdb.Error, FileNotFoundError, pa.ArrowException) as exc:
                text = str(exc)
                first = text.splitlines()[0] if text else type(exc).__name__
                broken = self._broken_segment(text)
                if (
                    broken is not None
                    and found_bad < _MAX_BAD_PER_QUERY
                    and not _vanished(exc, text)
                ):
                    found_bad += 1
                    self._skip(*broken, f"unreadable data: {first[:200]}")
                    continue
                if broken is None and found_bad < _MAX_BAD_PER_QUERY and _data_error(exc, text):
                    # the error names no file (DuckDB: "TProtocolException: Invalid data"): read the
                    # segments of the tables the query names to find the broken ones
                    found = self._deep_scan(sql)
                    if found:
                        found_bad += found
                        continue
                vanished = (
                    isinstance(exc, (duckdb.IOException, FileNotFoundError, pa.ArrowIOError))
                    or "No such file" in text
                    or "No files found" in text
                )
                if not vanished or retries >= _MAX_VANISHED_RETRIES:
                    raise QueryError(_duckdb_message(text) if text else first) from None
                # each vanished segment is a compaction or retention step done: retry on the new
                # listing (one pass over a store's partitions can remove segments under a query
                # several times in a row)
                time.sleep(min(0.5, 0.01 * 2 ** retries))
                retries += 1
                self.refresh()

    def _deep_scan(self, sql: str) -> int:
        """Read every not yet fully read segment of the tables `sql` mentions (all tables when it
        names none); skip those whose data cannot be read. Returns how many were found."""
        named = [t for t in self._segments if t in sql] or list(self._segments)
        found = 0
        for table in named:
            for path in list(self._segments.get(table, [])):
                if path in self._read_ok:
                    continue
                reason = deep_check(self.location, table, path)
                if reason is None:
                    self._read_ok.add(path)
                    continue
                self._skip(table, path, reason)
                found += 1
        return found

    def _broken_segment(self, text: str) -> tuple[str, str] | None:
        """The (table, segment) an error message names, when it names one of the listed segments."""
        for table, segments in self._segments.items():
            for path in segments:
                if path in text:
                    return table, path
        return None

    def _skip(self, table: str, path: str, reason: str) -> None:
        self._mark_bad(table, path, reason)
        self._checked[(table, path)] = (self._stamp(path), reason)
        remaining = [p for p in self._segments.get(table, []) if p != path]
        self._define_view(table, remaining)
        self._segments[table] = remaining

    def read_table(
        self, table: str, where: str | None = None, params: Sequence[Any] | None = None
    ) -> pa.Table:
        schema_for(table)
        sql = f'SELECT * FROM "{table}"' + (f" WHERE {where}" if where else "")
        return self.query(sql, params)

    def summary(self) -> list[TableSummary]:
        """Row counts and time range per table."""
        result = []
        for table in TABLE_NAMES:
            row = self.query(
                f'SELECT count(*) AS n, min(ts) AS lo, max(ts) AS hi FROM "{table}"'
            ).to_pylist()[0]
            result.append(
                TableSummary(
                    table,
                    row["n"],
                    len(self._segments.get(table, [])),
                    row["lo"],
                    row["hi"],
                    len(self.bad_segments(table)),
                )
            )
        return result

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
