"""The telemetry one attribution pass looks at, as pandas frames, from the store (batch) or from
memory (follow).

Every detector takes a Telemetry bundle rather than a store, so the batch pass (SQL over the whole
store) and the live pass (rows of new segments accumulated in memory) run the same code. Steps are
widened here: the `sections` map becomes one float column per section (`sec:<name>`), which is what
the straggler detector scores.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from faultlens.collectors.store.schema import TABLES, empty_table

SECTION_PREFIX = "sec:"
SAMPLE_COLUMNS = (
    "ts",
    "node",
    "gpu_index",
    "gpu_uuid",
    "pci_bus_id",
    "temp_c",
    "hbm_temp_c",
    "power_w",
    "sm_clock_mhz",
    "clocks_event_reasons",
    "gpu_util_pct",
)
PLACEMENT_COLUMNS = (
    "job_id",
    "attempt",
    "rank",
    "node",
    "local_rank",
    "gpu_index",
    "gpu_uuid",
    "pci_bus_id",
    "pp_rank",
    "dp_rank",
    "tp_rank",
    "world_size",
    "ts",
)

SampleFetcher = Callable[[Sequence[str], dt.datetime, dt.datetime], pd.DataFrame]


def to_frame(table: pa.Table | None, name: str) -> pd.DataFrame:
    """An Arrow table of store table `name` as a pandas frame (timestamps tz-aware UTC nanoseconds,
    whatever the store's unit: the detectors' arithmetic is in ns; ints nullable)."""
    if table is None:
        table = empty_table(name)
    if name == "steps":
        return steps_frame(table)
    return table.to_pandas(types_mapper=_types_mapper, coerce_temporal_nanoseconds=True)


def _types_mapper(arrow_type: pa.DataType) -> object | None:
    if pa.types.is_integer(arrow_type):
        return pd.Int64Dtype()
    if pa.types.is_boolean(arrow_type):
        return pd.BooleanDtype()
    return None


def steps_frame(table: pa.Table) -> pd.DataFrame:
    """Steps rows as a frame with one `sec:<name>` float column per section name found in the
    `sections` map.
    """
    sections = table.column("sections") if "sections" in table.column_names else None
    base = table.drop_columns(["sections"]) if sections is not None else table
    frame = base.to_pandas(types_mapper=_types_mapper, coerce_temporal_nanoseconds=True)
    # NaN and null are one value in pandas: keep "not finite" apart from "none"
    if "loss" in table.column_names:
        loss = table.column("loss")
        bad = (
            pc.fill_null(pc.invert(pc.is_finite(loss)), False)
            if table.num_rows
            else pa.array([], pa.bool_())
        )
        frame["loss_nonfinite"] = np.asarray(bad.to_numpy(zero_copy_only=False), dtype=bool)
    if sections is None or table.num_rows == 0:
        return frame
    array = sections.combine_chunks() if isinstance(sections, pa.ChunkedArray) else sections
    offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    if stop == start:
        return frame
    encoded = pc.dictionary_encode(array.keys.slice(start, stop - start))
    names = encoded.dictionary.to_pylist()
    which = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    values = (
        array.items.slice(start, stop - start).to_numpy(zero_copy_only=False).astype(np.float64)
    )
    row_of_entry = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    cells = which * table.num_rows + row_of_entry
    finite = ~np.isnan(values)
    size = len(names) * table.num_rows
    # a section named twice in one row is summed
    wide = np.bincount(cells[finite], weights=values[finite], minlength=size).reshape(
        len(names), table.num_rows
    )
    present = np.bincount(cells[finite], minlength=size).reshape(len(names), table.num_rows) > 0
    wide[~present] = np.nan
    frame = frame.reset_index(drop=True)
    # added in place: a concat would copy every other column of a large frame
    for i, name in enumerate(names):
        frame[f"{SECTION_PREFIX}{name}"] = wide[i]
    return frame


def section_columns(steps: pd.DataFrame) -> list[str]:
    return [c for c in steps.columns if c.startswith(SECTION_PREFIX)]


@dataclass
class Telemetry:
    """What one attribution pass sees of one store (or one job of it)."""

    ranks: pd.DataFrame
    steps: pd.DataFrame
    process_events: pd.DataFrame
    gpu_events: pd.DataFrame
    collectives: pa.Table
    fetch_samples: SampleFetcher
    jobs: tuple[str, ...] = ()
    as_of: dict[str, dt.datetime] = field(default_factory=dict)
    heartbeats: pd.DataFrame = field(default_factory=lambda: to_frame(None, "heartbeats"))
    # per-rank loss, local gradient norm, parameter digests (opt-in in-job numerics)
    numerics: pd.DataFrame = field(default_factory=lambda: to_frame(None, "numerics"))

    def for_job(self, job: str) -> Telemetry:
        """The rows of one job; GPU events are node-level and kept for every node the job ran on."""
        def pick(frame: pd.DataFrame) -> pd.DataFrame:
            if frame.empty or "job_id" not in frame.columns:
                return frame
            return frame[frame["job_id"] == job].reset_index(drop=True)

        nodes = job_nodes(
            pick(self.ranks), pick(self.steps), pick(self.process_events), pick(self.heartbeats)
        )
        events = self.gpu_events
        if not events.empty:
            events = events[events["node"].isin(nodes) | (events["job_id"] == job)].reset_index(
                drop=True
            )
        collectives = self.collectives
        if collectives.num_rows:
            mask = pc.equal(collectives.column("job_id"), pa.scalar(job))
            collectives = collectives.filter(pc.fill_null(mask, False))
        return Telemetry(
            ranks=pick(self.ranks),
            steps=pick(self.steps),
            process_events=pick(self.process_events),
            gpu_events=events,
            collectives=collectives,
            fetch_samples=self.fetch_samples,
            jobs=(job,),
            as_of={job: self.as_of[job]} if job in self.as_of else {},
            heartbeats=pick(self.heartbeats),
            numerics=pick(self.numerics),
        )


def job_nodes(*frames: pd.DataFrame) -> list[str]:
    nodes: set[str] = set()
    for frame in frames:
        if not frame.empty and "node" in frame.columns:
            nodes.update(str(n) for n in frame["node"].dropna().unique())
    return sorted(nodes)


def list_jobs(*frames: pd.DataFrame) -> list[str]:
    jobs: set[str] = set()
    for frame in frames:
        if not frame.empty and "job_id" in frame.columns:
            jobs.update(str(j) for j in frame["job_id"].dropna().unique())
    return sorted(jobs)


# ---------------------------------------------------------------- placement


@dataclass(frozen=True)
class Placement:
    """Where one rank of one attempt ran."""

    rank: int
    node: str | None = None
    local_rank: int | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    pp_rank: int | None = None

    @property
    def gpu_label(self) -> str | None:
        return self.gpu_uuid or self.pci_bus_id or (
            # an index, never an invented name
            str(self.gpu_index) if self.gpu_index is not None else None)


def _value(row: pd.Series, column: str) -> object | None:
    if column not in row.index:
        return None
    value = row[column]
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return value


def placements(
    ranks: pd.DataFrame, attempt: int | None, *fallback: pd.DataFrame
) -> dict[int, Placement]:
    """rank -> Placement for one attempt: from the ranks table (latest row per rank), else from the
    node and local_rank columns of other rows of that attempt (`fallback`, least trusted first: a
    later frame's values win over an earlier one's)."""
    found: dict[int, Placement] = {}
    for frame in (*fallback, ranks):  # ranks last: it wins
        if frame.empty or "rank" not in frame.columns:
            continue
        rows = frame[frame["rank"].notna()]
        if attempt is not None and "attempt" in rows.columns:
            same = rows[rows["attempt"] == attempt]
            rows = same if not same.empty else rows
        wanted = [
            c
            for c in (
                "rank",
                "ts",
                "node",
                "local_rank",
                "gpu_index",
                "gpu_uuid",
                "pci_bus_id",
                "pp_rank",
            )
            if c in rows.columns
        ]
        rows = rows[wanted]
        if rows.empty:
            continue
        latest = rows.loc[rows.groupby("rank")["ts"].idxmax()] if "ts" in rows.columns else \
            rows.drop_duplicates("rank", keep="last")
        for _, row in latest.iterrows():
            rank = int(row["rank"])
            previous = found.get(rank)
            merged = {}
            for name in ("node", "local_rank", "gpu_index", "gpu_uuid", "pci_bus_id", "pp_rank"):
                value = _value(row, name)
                if value is None and previous is not None:
                    value = getattr(previous, name)
                merged[name] = (
                    int(value)
                    if name in {"local_rank", "gpu_index", "pp_rank"} and value is not None
                    else value
                )
            found[rank] = Placement(rank=rank, **merged)
    return found


# ---------------------------------------------------------------- batch loading from a store


def sql_in_list(values: Iterable[str]) -> str:
    """The values as the quoted items of an SQL `IN (...)` list (a quote inside one doubled)."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def load_from_store(store: object, job: str | None = None) -> Telemetry:
    """Read what attribution needs from a Store (faultlens.attribution.reading.store.Store); GPU
    samples are fetched on demand."""
    query = store.query  # type: ignore[attr-defined]
    where = "WHERE job_id = ?" if job is not None else "WHERE job_id IS NOT NULL"
    params = [job] if job is not None else None
    ranks = to_frame(query(f"SELECT * FROM ranks {where}", params), "ranks")
    steps = to_frame(query(f"SELECT * FROM steps {where}", params), "steps")
    events = to_frame(query(f"SELECT * FROM process_events {where}", params), "process_events")
    heartbeats = to_frame(query(f"SELECT * FROM heartbeats {where}", params), "heartbeats")
    numerics = to_frame(query(f"SELECT * FROM numerics {where}", params), "numerics")
    collectives = query(f"SELECT * FROM collectives {where}", params)
    nodes = job_nodes(ranks, steps, events, heartbeats)
    if job is None:  # every node's events: health incidents concern nodes without a job too
        gpu_events = to_frame(query("SELECT * FROM gpu_events"), "gpu_events")
    elif nodes:
        gpu_events = to_frame(query("SELECT * FROM gpu_events WHERE node IN "
                                    f"({sql_in_list(nodes)}) OR job_id = ?", params), "gpu_events")
    else:
        gpu_events = to_frame(None, "gpu_events")
    jobs = list_jobs(ranks, steps, events, heartbeats) if job is None else [job]
    # a replay observes each job up to its own newest row: node telemetry that goes on after a job
    # ended (GPU samples) does not make a finished job look hung
    as_of = {}
    for name in jobs:
        newest = job_as_of(store, name)
        if newest is not None:
            as_of[name] = newest

    return Telemetry(
        ranks=ranks,
        steps=steps,
        process_events=events,
        gpu_events=gpu_events,
        collectives=collectives if collectives.num_rows else empty_table("collectives"),
        fetch_samples=sample_fetcher(store),
        jobs=tuple(jobs),
        as_of=as_of,
        heartbeats=heartbeats,
        numerics=numerics,
    )


def job_as_of(store: object, job: str) -> dt.datetime | None:
    """A job's newest telemetry (a replay observes the job up to it)."""
    row = store.query(  # type: ignore[attr-defined]
        "SELECT max(t) AS t FROM (SELECT max(ts) AS t FROM steps WHERE job_id = ? UNION ALL "
        "SELECT max(end_ts) FROM steps WHERE job_id = ? UNION ALL "
        "SELECT max(ts) FROM process_events WHERE job_id = ? UNION ALL "
        "SELECT max(ts) FROM heartbeats WHERE job_id = ? UNION ALL "
        "SELECT max(ts) FROM collectives WHERE job_id = ? UNION ALL SELECT max(ts) FROM ranks "
        "WHERE job_id = ?)",
        [job] * 6).to_pylist()[0]
    return row["t"]


def sample_fetcher(store: object) -> SampleFetcher:
    """GPU samples of some nodes over a time range, read from the store when a detector asks for
    them.
    """
    query = store.query  # type: ignore[attr-defined]

    def fetch(sample_nodes: Sequence[str], start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
        if not sample_nodes:
            return to_frame(None, "gpu_samples")[list(SAMPLE_COLUMNS)]
        columns = ", ".join(SAMPLE_COLUMNS)
        table = query(f"SELECT {columns} FROM gpu_samples WHERE node IN "
                      f"({sql_in_list(sample_nodes)}) AND ts >= ? AND ts <= ?", [start, end])
        return table.to_pandas(types_mapper=_types_mapper, coerce_temporal_nanoseconds=True)

    return fetch


def empty_samples() -> pd.DataFrame:
    return to_frame(empty_table("gpu_samples"), "gpu_samples")[list(SAMPLE_COLUMNS)]


def schema_columns(name: str) -> list[str]:
    return TABLES[name].names
