"""Tailing a store: after Store.refresh(), read only the segments not seen before, and keep a bounded window of
rows per table in memory for the live engine.

Compaction replaces small segments by one merged `c-` segment; a merged segment whose replaced segments were all
read already is skipped, so a row is never counted twice. A segment that cannot be read is logged, counted and
skipped (it is not retried forever); the engine goes on with the others.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from faultlens.collectors.store.layout import COMPACTED_PREFIX, replaced_by
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
                 arrow_tables: Sequence[str] = ()) -> None:
        self.store = store
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
        self.store.refresh(self.tables, views=False)  # type: ignore[attr-defined]  (the files are read here)
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
