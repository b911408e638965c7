"""The segment sink: per-table buffers flushed into Parquet segments by row count or by age.

`write()` validates and buffers; a buffer becomes segments (one per job/date/node partition) when it
holds `flush_rows` rows, when its oldest row is `flush_age_s` old (checked on write and by
`flush_aged()`), or on `flush()` / `close()`. When `flush()` returns, every row written before it is
in a visible, complete segment. After a flush the sink merges its own older segments of a partition
(collectors/store/rollup.py), so a partition holds a few segments whatever its history.

A table found due on write flushes with every other table then due (one flush, one landing-log
key: a node agent's heartbeats and GPU samples land together). On an object store each flush also
writes the landing log (collectors/store/landing.py) that a live follower lists instead of the
partitions; a landing-log key that cannot be written is retried with the next flush.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from faultlens.collectors.store.landing import write_landed
from faultlens.collectors.store.layout import (
    StoreLocation,
    partition_dir,
    resolve_store,
    write_segment,
)
from faultlens.collectors.store.rollup import Roller, Rollup
from faultlens.collectors.store.schema import (
    partition_date,
    partition_keys,
    rows_to_table,
    validate,
)

log = logging.getLogger(__name__)


@dataclass
class _Buffer:
    tables: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    oldest: float | None = None


@dataclass(frozen=True)
class FlushResult:
    table: str
    rows: int
    paths: tuple[str, ...]


class SegmentSink:
    """Buffers rows per table and writes them as crash-safe Parquet segments in the store layout."""

    def __init__(
        self,
        store: str | StoreLocation,
        *,
        flush_rows: int = 100_000,
        flush_age_s: float = 5.0,
        compression: str = "zstd",
        clock: Callable[[], float] = time.monotonic,
        storage_options: Mapping[str, Any] | None = None,
        write_threads: int = 8,
        write_through: Iterable[str] = (),
        rollup: Rollup | bool | None = None,
        landing: bool | None = None,
    ) -> None:
        self.location = resolve_store(store, create=True, **dict(storage_options or {}))
        # rollup: None = Rollup() on a local store, off on an object store (no exclusive create to
        # lock a partition against `faultlens compact`); False = off; a Rollup = that policy
        if rollup is None:
            rollup = self.location.is_local
        policy = Rollup() if rollup is True else (rollup or None)
        self._roller = Roller(self.location, policy, clock) if policy is not None else None
        # landing: None = on for an object store (collectors/store/landing.py), off on a local one
        self.landing = (not self.location.is_local) if landing is None else bool(landing)
        self._unlanded: list[str] = []  # segments whose landing-log key failed: sent next flush
        self.landing_keys_written = 0
        self.flush_rows = flush_rows
        self.flush_age_s = flush_age_s
        # tables flushed at every write, whatever their age: the few rows a live decision waits on
        # (a process's death, a GPU event) land at once instead of after flush_age_s
        self.write_through = frozenset(write_through)
        self.compression = compression
        # segments written at once by a flush spanning several partitions
        self.write_threads = write_threads
        self._clock = clock
        self._buffers: dict[str, _Buffer] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.rows_written = 0
        self.segments_written = 0

    def write(
        self, table: str, data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]]
    ) -> None:
        """Validate and buffer rows of `table`; flushes that table if its buffer is full or old."""
        if isinstance(data, (pa.Table, pa.RecordBatch)):
            conformed = validate(table, data)
        else:
            conformed = rows_to_table(table, data)
        if conformed.num_rows == 0:
            return
        with self._lock:
            buffer = self._buffers.setdefault(table, _Buffer())
            buffer.tables.append(conformed)
            buffer.rows += conformed.num_rows
            if buffer.oldest is None:
                buffer.oldest = self._clock()
            due = (table in self.write_through or buffer.rows >= self.flush_rows
                   or self._clock() - buffer.oldest >= self.flush_age_s)
            # with it, every other table then due: one flush, one landing-log key
            names = [table, *self._aged(exclude=table)] if due else []
        if names:
            self._flush(names)

    def _aged(self, exclude: str | None = None) -> list[str]:
        now = self._clock()
        return [name for name, buf in self._buffers.items() if name != exclude
                and buf.oldest is not None and now - buf.oldest >= self.flush_age_s]

    def pending_rows(self, table: str | None = None) -> int:
        with self._lock:
            if table is not None:
                buffer = self._buffers.get(table)
                return buffer.rows if buffer else 0
            return sum(buffer.rows for buffer in self._buffers.values())

    def flush_aged(self) -> list[FlushResult]:
        """Flush every table whose oldest buffered row is at least flush_age_s old."""
        with self._lock:
            due = self._aged()
        return self._flush(due) if due else []

    def flush(self, table: str | None = None) -> list[FlushResult]:
        """Write buffered rows (of one table, or all) as segments; returns when they are visible."""
        with self._lock:
            names = [table] if table is not None else list(self._buffers)
        return self._flush(names)

    def _flush(self, names: list[str]) -> list[FlushResult]:
        with self._lock:
            taken = {}
            for name in names:
                buffer = self._buffers.pop(name, None)
                if buffer is not None and buffer.rows:
                    taken[name] = buffer
        results = []
        with self._write_lock:
            for name in names:
                buffer = taken.get(name)
                if buffer is None:
                    results.append(FlushResult(name, 0, ()))
                    continue
                try:
                    paths = self._write_table(name, pa.concat_tables(buffer.tables))
                except BaseException:
                    with self._lock:  # put the rows back so nothing is lost; a later flush retries
                        current = self._buffers.setdefault(name, _Buffer())
                        current.tables[:0] = buffer.tables
                        current.rows += buffer.rows
                        current.oldest = buffer.oldest
                    raise
                self.rows_written += buffer.rows
                self.segments_written += len(paths)
                results.append(FlushResult(name, buffer.rows, tuple(p for p, _ in paths)))
                if self._roller is not None:
                    for path, rows in paths:
                        self._roller.wrote(name, path, rows)
            if self.landing and taken:
                self._land([path for result in results for path in result.paths])
        if self._roller is not None and taken:
            # after the write lock: another thread's flush (a write-through table's) never waits
            # for merges; a failed merge leaves its sources and never raises
            self._roller.roll(sum(len(result.paths) for result in results))
        return results

    def _land(self, paths: list[str]) -> None:
        """The landing log of this flush's segments (and of any whose key failed before). A failure
        never raises: the rows are stored; the key is retried with the next flush."""
        pending = [*self._unlanded, *paths]
        try:
            self.landing_keys_written += write_landed(self.location, pending)
        except Exception as exc:  # an object store's error: any kind
            self._unlanded = pending[-100_000:]
            log.warning("store %s: landing log not written (%s: %s); retried with the next flush",
                        self.location.url, type(exc).__name__, exc)
        else:
            self._unlanded = []

    @property
    def rolls_up(self) -> bool:
        """Whether this sink merges its own older segments after a flush (rollup)."""
        return self._roller is not None

    @property
    def merges(self) -> int:
        """How many rollup merges this sink has made."""
        return self._roller.merges if self._roller is not None else 0

    def _write_table(self, name: str, table: pa.Table) -> list[tuple[str, int]]:
        """One segment per (job, date, node) partition: rows are sorted by partition once, then
        sliced. Returns (path, rows) of each.
        """
        job, day, node = partition_keys(table)
        uniques = [pc.unique(column) for column in (job, day, node)]
        if all(len(u) == 1 for u in uniques):
            directory = partition_dir(self.location, name, uniques[0][0].as_py(),
                                      partition_date(uniques[1][0].as_py()), uniques[2][0].as_py())
            path = write_segment(self.location, directory, table, compression=self.compression)
            return [(path, table.num_rows)]
        # sort by small integer codes (dictionary indices), not by the strings themselves
        job_codes = job.combine_chunks().dictionary_encode()
        node_codes = node.combine_chunks().dictionary_encode()
        keys = pa.table(
            {"j": job_codes.indices, "d": day.combine_chunks(), "n": node_codes.indices}
        )
        order = pc.sort_indices(
            keys, sort_keys=[("j", "ascending"), ("d", "ascending"), ("n", "ascending")]
        )
        groups = (
            keys.take(order)
            .group_by(["j", "d", "n"], use_threads=False)
            .aggregate([([], "count_all")])
        )
        job_names = job_codes.dictionary.to_pylist()
        node_names = node_codes.dictionary.to_pylist()
        # the rows in partition order once (one take of every column: a take per partition costs
        # each column's per-call work 128 times), each partition a zero-copy slice of it
        ordered = table.take(order)
        parts = []
        offset = 0
        for j_code, d, n_code, count in zip(
            *(groups.column(c).to_pylist() for c in ("j", "d", "n", "count_all")), strict=True
        ):
            j, n = job_names[j_code], node_names[n_code]
            parts.append(
                (
                    partition_dir(self.location, name, j, partition_date(d), n),
                    ordered.slice(offset, count),
                )
            )
            offset += count
        return self._write_parts(parts)

    def _write_parts(self, parts: list[tuple[str, pa.Table]]) -> list[tuple[str, int]]:
        """Write one segment per partition (its rows), a few at a time: Parquet encoding releases
        the GIL and each segment waits on two fsyncs (file, directory), so a whole-job flush of 128
        partitions overlaps them. Every segment is complete and visible when this returns; the
        first failure is raised after the others end."""
        def write(part: tuple[str, pa.Table]) -> tuple[str, int]:
            path = write_segment(self.location, part[0], part[1], compression=self.compression)
            return path, part[1].num_rows

        if len(parts) < 2 or self.write_threads < 2:
            return [write(part) for part in parts]
        with ThreadPoolExecutor(max_workers=min(self.write_threads, len(parts)),
                                thread_name_prefix="faultlens-sink") as pool:
            futures = [pool.submit(write, part) for part in parts]
            wait(futures)
        return [future.result() for future in futures]

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> SegmentSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
