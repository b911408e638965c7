"""Per-rank timing tables users already have (Megatron timer logs turned into a table, a profiler
export) -> the steps and ranks tables, so their stragglers can be analysed offline.

Input: a Parquet or CSV file with one row per (rank, step, section) timing: rank, step, section,
start (a timestamp, or a number of `start_unit` since the epoch) and duration (in `duration_unit`);
a section timed several times in a step (one row per microbatch) adds up. Optional columns: node,
job_id, attempt, phase and the parallel coordinates dp_rank, pp_rank, tp_rank, cp_rank, ep_rank; the
placement may also come from a second table (rank plus any of node and the coordinates). A `mapping`
renames the user's columns to these names ({"rank": "global_rank", ...}).

Output: one steps row per (rank, step): start_ts the earliest start, end_ts the latest end,
duration_s between them, the sections map; one ranks row per rank with its node and coordinates. A
bad file is a StepTableError with one line naming the file, the column and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from faultlens.collectors.store.schema import TABLES, as_ns_type
from faultlens.errors import FaultlensError

REQUIRED = ("rank", "step", "section", "start", "duration")
OPTIONAL = ("node", "job_id", "attempt", "phase")
COORDS = ("dp_rank", "pp_rank", "tp_rank", "cp_rank", "ep_rank", "pp_size")
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class StepTableError(ValueError, FaultlensError):
    """A timing table cannot be read: `<file>: column '<name>': <problem>`."""


@dataclass(frozen=True)
class StepTables:
    steps: pa.Table
    ranks: pa.Table
    rows_in: int
    sections: tuple[str, ...]


def _read(path: Path) -> pd.DataFrame:
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
        if suffix in (".csv", ".tsv", ".txt"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
    except FileNotFoundError:
        raise StepTableError(f"{path}: no such file") from None
    except Exception as exc:  # pyarrow/pandas parse errors carry no common type
        raise StepTableError(
            f"{path}: cannot read as {suffix[1:]}: {str(exc).splitlines()[0]}"
        ) from None
    raise StepTableError(f"{path}: unknown format {suffix or '(no suffix)'}: expected .parquet or "
                         ".csv")


def _columns(
    frame: pd.DataFrame, path: Path, mapping: Mapping[str, str], required: tuple[str, ...]
) -> pd.DataFrame:
    unknown = sorted(set(mapping) - set(REQUIRED + OPTIONAL + COORDS))
    if unknown:
        raise StepTableError(f"{path}: mapping names unknown column {unknown[0]!r}; expected one "
                             "of "
                             f"{', '.join(REQUIRED + OPTIONAL + COORDS)}")
    renamed = {}
    for name in REQUIRED + OPTIONAL + COORDS:
        source = mapping.get(name, name)
        if source in frame.columns:
            renamed[name] = frame[source]
        elif name in required:
            hint = f" (mapped from {source!r})" if source != name else ""
            raise StepTableError(f"{path}: column {name!r}{hint} not found; the file has "
                                 f"{', '.join(map(str, frame.columns[:12]))}")
    return pd.DataFrame(renamed)


def _numbers(series: pd.Series, path: Path, name: str, *, integer: bool = False,
             allow_missing: bool = False) -> pd.Series:
    values = pd.to_numeric(series, errors="coerce")
    bad = values.isna() & (series.notna() | (not allow_missing))
    if bad.any():
        where = int(np.flatnonzero(bad.to_numpy())[0])
        raise StepTableError(f"{path}: column {name!r}: expected "
                             f"{'integers' if integer else 'numbers'}, row "
                             f"{where + 1} has {series.iloc[where]!r}")
    if integer and (values.dropna() % 1 != 0).any():
        where = int(np.flatnonzero((values % 1 != 0).to_numpy())[0])
        raise StepTableError(f"{path}: column {name!r}: expected integers, row {where + 1} has "
                             f"{series.iloc[where]!r}")
    return values


def _starts(series: pd.Series, path: Path, unit: str) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(series):
        values = series if series.dt.tz is not None else series.dt.tz_localize("UTC")
        return values.dt.tz_convert("UTC")
    numbers = pd.to_numeric(series, errors="coerce")
    if numbers.notna().all():
        return pd.to_datetime((numbers * UNITS[unit] * 1e9).round().astype("int64"), utc=True)
    parsed = pd.to_datetime(series, errors="coerce", utc=True, format="mixed")
    if parsed.isna().any():
        where = int(np.flatnonzero(parsed.isna().to_numpy())[0])
        raise StepTableError(f"{path}: column 'start': expected timestamps or numbers of {unit} "
                             "since the epoch, "
                             f"row {where + 1} has {series.iloc[where]!r}")
    return parsed


def read_step_table(
    path: str | Path,
    *,
    mapping: Mapping[str, str] | None = None,
    duration_unit: str = "s",
    start_unit: str = "s",
    placement: str | Path | None = None,
    placement_mapping: Mapping[str, str] | None = None,
    job_id: str | None = None,
    attempt: int | None = None,
    node: str | None = None,
) -> StepTables:
    """Read a per-rank timing table (and an optional placement table) into steps and ranks rows."""
    path = Path(path)
    for unit in (duration_unit, start_unit):
        if unit not in UNITS:
            raise StepTableError(f"{path}: unit {unit!r}: expected one of {', '.join(UNITS)}")
    raw = _read(path)
    frame = _columns(raw, path, mapping or {}, REQUIRED)
    if frame.empty:
        raise StepTableError(f"{path}: no rows")
    frame["rank"] = _numbers(frame["rank"], path, "rank", integer=True).astype("int64")
    frame["step"] = _numbers(frame["step"], path, "step", integer=True).astype("int64")
    duration = _numbers(frame["duration"], path, "duration") * UNITS[duration_unit]
    if (duration < 0).any():
        where = int(np.flatnonzero((duration < 0).to_numpy())[0])
        raise StepTableError(f"{path}: column 'duration': expected seconds >= 0, row {where + 1} "
                             "has "
                             f"{frame['duration'].iloc[where]!r}")
    if frame["section"].isna().any():
        where = int(np.flatnonzero(frame["section"].isna().to_numpy())[0])
        raise StepTableError(f"{path}: column 'section': row {where + 1} has no section name")
    frame["duration"] = duration
    frame["section"] = frame["section"].astype(str)
    frame["start"] = _starts(frame["start"], path, start_unit)
    frame["end"] = frame["start"] + pd.to_timedelta(frame["duration"], unit="s")
    for name in (*COORDS, "attempt"):
        if name in frame.columns:
            frame[name] = _numbers(frame[name], path, name, integer=True, allow_missing=True)
    frame["job_id"] = (
        job_id
        if job_id is not None
        else (frame["job_id"].astype(object) if "job_id" in frame else None)
    )
    if attempt is not None or "attempt" not in frame:
        frame["attempt"] = attempt if attempt is not None else 0
    if node is not None or "node" not in frame:
        frame["node"] = node
    if "phase" not in frame:
        frame["phase"] = "train"

    keys = ["job_id", "attempt", "rank", "step"]
    frame["job_id"] = frame["job_id"].astype(object).where(frame["job_id"].notna(), "")
    grouped = frame.groupby(keys, sort=True, dropna=False)
    spans = grouped.agg(start_ts=("start", "min"), end_ts=("end", "max"), node=("node", "first"),
                        phase=("phase", "first")).reset_index()
    sections = (
        frame.groupby([*keys, "section"], sort=True, dropna=False)["duration"].sum().reset_index()
    )
    per_row = sections.groupby(keys, sort=True, dropna=False)
    maps = [list(zip(g["section"], g["duration"].astype(float), strict=True)) for _, g in per_row]
    spans["sections"] = maps
    spans["duration_s"] = (spans["end_ts"] - spans["start_ts"]).dt.total_seconds()
    spans["ts"] = spans["end_ts"]
    spans["job_id"] = spans["job_id"].replace("", None)

    coords = frame.groupby(["job_id", "attempt", "rank"], dropna=False).agg(
        {c: "first" for c in (*COORDS, "node") if c in frame.columns}).reset_index()
    if placement is not None:
        coords = _merge_placement(coords, Path(placement), placement_mapping or {})
    if "node" in coords.columns:
        node_of = coords.set_index("rank")["node"]
        spans["node"] = (
            spans["rank"].map(node_of).where(spans["rank"].map(node_of).notna(), spans["node"])
        )
    coords["job_id"] = coords["job_id"].replace("", None)
    coords["ts"] = spans.groupby("rank")["start_ts"].min().reindex(coords["rank"]).to_numpy()
    coords["world_size"] = len(coords)
    steps_table = _table("steps", spans)
    ranks_table = _table("ranks", coords)
    return StepTables(
        steps_table, ranks_table, len(frame), tuple(sorted(frame["section"].unique()))
    )


def _merge_placement(coords: pd.DataFrame, path: Path, mapping: Mapping[str, str]) -> pd.DataFrame:
    raw = _read(path)
    table = _columns(raw, path, mapping, ("rank",))
    table["rank"] = _numbers(table["rank"], path, "rank", integer=True).astype("int64")
    for name in COORDS:
        if name in table.columns:
            table[name] = _numbers(table[name], path, name, integer=True, allow_missing=True)
    extra = [c for c in ("node", *COORDS) if c in table.columns]
    if not extra:
        raise StepTableError(f"{path}: column 'node' or a coordinate (dp_rank, pp_rank, ...) "
                             "expected beside 'rank'")
    merged = coords.drop(columns=[c for c in extra if c in coords.columns]).merge(
        table[["rank", *extra]].drop_duplicates("rank"), on="rank", how="left")
    missing = merged[extra[0]].isna()
    if missing.all():
        raise StepTableError(f"{path}: column 'rank': none of the timing table's ranks is placed")
    return merged


def _table(name: str, frame: pd.DataFrame) -> pa.Table:
    schema = TABLES[name]
    arrays = []
    for field in schema:
        if field.name in frame.columns:
            values = frame[field.name]
            if pa.types.is_integer(field.type):
                values = values.astype("Int64")
            # pandas holds ns; the store's unit is coarser: truncate
            if pa.types.is_timestamp(field.type):
                arrays.append(
                    pa.array(values, type=as_ns_type(field.type), from_pandas=True).cast(
                        field.type, safe=False
                    )
                )
                continue
            arrays.append(
                pa.array(
                    values.tolist() if field.name == "sections" else values,
                    type=field.type,
                    from_pandas=True,
                )
            )
        else:
            arrays.append(pa.nulls(len(frame), field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


__all__ = ["StepTableError", "StepTables", "read_step_table"]
