"""The store reader: an embedded DuckDB connection with one view per table over the Parquet layout.

Local stores are scanned by DuckDB's own Parquet reader; object stores (s3://, gs://, memory://, ...) go through
pyarrow datasets on the fsspec filesystem, so no DuckDB extension is downloaded at run time. Every view has the
full current schema of its table: segments written by an older schema version with fewer columns read as nulls
in the new columns (union by name). Partition pruning (job, date range, node) happens on the listing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from collectors.layout import StoreError, StoreLocation, list_segments, resolve_store
from collectors.schema import TABLE_NAMES, empty_table, schema_for


class QueryError(ValueError):
    """A SQL query failed: the message is DuckDB's on one line, with its hints ("Did you mean ...")."""


def _duckdb_message(text: str) -> str:
    """DuckDB's error on one line: the error, then its hint lines (Did you mean, Candidate bindings), without the
    echoed query and caret."""
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


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Store:
    """Read access to a faultlens store through DuckDB views named after the tables."""

    def __init__(self, store: str | StoreLocation, *, jobs: Iterable[str] | None = None,
                 date_from: str | None = None, date_to: str | None = None,
                 nodes: Iterable[str] | None = None, threads: int | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.location = resolve_store(store, **(storage_options or {}))
        self.jobs = list(jobs) if jobs is not None else None
        self.nodes = list(nodes) if nodes is not None else None
        self.date_from = date_from
        self.date_to = date_to
        self.con = duckdb.connect()
        self.con.execute("SET TimeZone='UTC'")
        if threads:
            self.con.execute(f"SET threads={int(threads)}")
        self._segments: dict[str, list[str]] = {}
        self.refresh()

    def segments(self, table: str) -> list[str]:
        return list(self._segments.get(table, []))

    def refresh(self, tables: Sequence[str] = TABLE_NAMES) -> None:
        """List the store again and point every view at the segments visible now."""
        for table in tables:
            for attempt in range(5):
                try:
                    segments = list_segments(self.location, table, jobs=self.jobs, date_from=self.date_from,
                                             date_to=self.date_to, nodes=self.nodes)
                except OSError as exc:
                    raise StoreError(f"store {self.location.url!r}: cannot list {table}: {exc}") from None
                try:
                    self._define_view(table, segments)
                except (duckdb.IOException, FileNotFoundError):
                    if attempt == 4:  # segments keep vanishing under us (compaction/retention): give up loudly
                        raise
                    continue  # a listed segment was replaced (compaction) or expired before binding: list again
                self._segments[table] = segments
                break

    def _define_view(self, table: str, segments: list[str]) -> None:
        empty_name = f"_empty_{table}"
        self.con.register(empty_name, empty_table(table))
        quoted = f'"{table}"'
        if not segments:
            self.con.execute(f"CREATE OR REPLACE VIEW {quoted} AS SELECT * FROM {empty_name}")
            return
        if self.location.is_local:
            files = ", ".join(_sql_string(path) for path in segments)
            source = f"read_parquet([{files}], union_by_name=true, hive_partitioning=false)"
        else:
            import pyarrow.dataset as ds  # here, not at import: it pulls in pandas (slow CLI start-up)
            from pyarrow.fs import FSSpecHandler, PyFileSystem

            dataset = ds.dataset(segments, schema=schema_for(table), format="parquet",
                                 filesystem=PyFileSystem(FSSpecHandler(self.location.fs)))
            dataset_name = f"_dataset_{table}"
            self.con.register(dataset_name, dataset)
            source = dataset_name
        self.con.execute(
            f"CREATE OR REPLACE VIEW {quoted} AS SELECT * FROM {empty_name} UNION ALL BY NAME SELECT * FROM {source}"
        )

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """Run SQL over the views and return an Arrow table. A segment removed under us (compaction,
        retention) triggers one refresh and retry."""
        for attempt in range(3):
            try:
                relation = self.con.sql(sql, params=params) if params else self.con.sql(sql)
                if relation is None:
                    return pa.table({})
                return relation.to_arrow_table()
            except duckdb.IOException as exc:
                if attempt == 2:
                    raise QueryError(str(exc).splitlines()[0]) from None
                self.refresh()
            except duckdb.Error as exc:
                text = str(exc)
                if attempt < 2 and ("No such file" in text or "No files found" in text):
                    self.refresh()
                    continue
                raise QueryError(_duckdb_message(text) if text else type(exc).__name__) from None
            except (FileNotFoundError, pa.ArrowIOError) as exc:
                if attempt == 2:
                    raise QueryError(str(exc).splitlines()[0]) from None
                self.refresh()
        raise QueryError("query failed after retries")  # pragma: no cover - loop always returns or raises

    def read_table(self, table: str, where: str | None = None, params: Sequence[Any] | None = None) -> pa.Table:
        schema_for(table)
        sql = f'SELECT * FROM "{table}"' + (f" WHERE {where}" if where else "")
        return self.query(sql, params)

    def summary(self) -> list[TableSummary]:
        """Row counts and time range per table."""
        result = []
        for table in TABLE_NAMES:
            row = self.query(f'SELECT count(*) AS n, min(ts) AS lo, max(ts) AS hi FROM "{table}"').to_pylist()[0]
            result.append(TableSummary(table, row["n"], len(self._segments.get(table, [])), row["lo"], row["hi"]))
        return result

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
