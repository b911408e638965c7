"""The reference parser: columns of a dump loaded as Python objects (JSON, or a pickle the
restricted unpickler loaded because the compiled scanner declined it). The fast path (fastpath.py)
reads a file only where it gives exactly this."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from faultlens.collectors.artifacts.flight_recorder.model import (
    Dump,
    DumpFormatError,
    ListColumn,
    SizesColumn,
    StrColumn,
)
from faultlens.collectors.artifacts.flight_recorder.values import (
    SCALAR_TYPES,
    ElementBudget,
    as_int,
    as_text,
    check_top,
    dump_header,
    show,
)
from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits

_INT_KEYS = (
    "record_id",
    "collective_seq_id",
    "p2p_seq_id",
    "op_id",
    "timeout_ms",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "pg_id",
)


def _str_column(values: Sequence[Any], what: str) -> StrColumn:
    lookup: dict[str, int] = {}
    uniques: list[str] = []
    codes = np.empty(len(values), np.int32)
    for i, value in enumerate(values):
        if value is None:
            codes[i] = -1
            continue
        if not isinstance(value, str):
            value = as_text(value, what)
        code = lookup.get(value)
        if code is None:
            code = lookup[value] = len(uniques)
            uniques.append(value)
        codes[i] = code
    return StrColumn(codes, uniques)


def _frame_text(frame: Any) -> str:
    if isinstance(frame, Mapping):
        name = as_text(frame.get("name"), "frame name")
        filename = as_text(frame.get("filename"), "frame filename")
        line = frame.get("line")
        if not isinstance(line, SCALAR_TYPES):
            raise DumpFormatError(f"frame line: expected an integer, got a {type(line).__name__}")
        return f"{name} ({filename}:{line})"
    return as_text(frame, "frame")


def _checked_entries(top: Mapping[str, Any], budget: ElementBudget, file_bytes: int) -> list[Any]:
    """The entries, within the entry budget, each a dict."""
    entries = top.get("entries") or []
    if len(entries) > budget.entries:
        raise DumpFormatError(f"{len(entries)} entries in {file_bytes} bytes: more than "
                              f"{budget.entries} (limit: fr_limits bytes_per_entry)")
    budget.take(len(entries))
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise DumpFormatError(f"entry {i} is a {type(entry).__name__}, expected a dict")
    return entries


# ids the analysis matches ranks by: integers as torch writes them, never a bool, text or float
# (a seq id of "12" or true read as a number made its rank the culprit); their range is checked on
# the columns of both parsers (values.check_fields)
_ID_KEYS = frozenset(("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "pg_id"))


def _as_id(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return as_int(value, what)
    raise DumpFormatError(f"{what}: expected an integer, got {type(value).__name__} "
                          f"{show(value)}")


def _int_columns(entries: list[Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    n = len(entries)
    ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in _INT_KEYS:
        values = np.zeros(n, np.int64)
        valid = np.zeros(n, bool)
        read = _as_id if key in _ID_KEYS else as_int
        for i, entry in enumerate(entries):
            value = read(entry.get(key), f"entry {i} {key}")
            if value is not None:
                values[i] = value
                valid[i] = True
        ints[key] = (values, valid)
    return ints


def _flag(entries: list[Any], key: str) -> np.ndarray:
    out = np.full(len(entries), -1, np.int8)
    for i, entry in enumerate(entries):
        value = entry.get(key)
        if value is not None:
            out[i] = 1 if value else 0
    return out


def _string_columns(entries: list[Any]) -> dict[str, StrColumn]:
    names, descs = [], []
    for i, entry in enumerate(entries):
        group = entry.get("process_group")
        if group is None:
            names.append(None)
            descs.append(None)
        elif isinstance(group, (list, tuple)):
            names.append(as_text(group[0], f"entry {i} process_group") if len(group) > 0 else None)
            descs.append(as_text(group[1], f"entry {i} process_group") if len(group) > 1 else None)
        else:
            raise DumpFormatError(f"entry {i} process_group: expected (name, desc), got "
                                  f"{type(group).__name__}")
    return {
        "op": _str_column([e.get("profiling_name") for e in entries], "profiling_name"),
        "state": _str_column([e.get("state") for e in entries], "state"),
        "pg_name": _str_column(names, "process_group"),
        "pg_desc": _str_column(descs, "process_group"),
    }


def _sizes_column(entries: list[Any], key: str, budget: ElementBudget) -> SizesColumn:
    counts = np.full(len(entries), -1, np.int64)
    ndims: list[int] = []
    dims: list[int] = []
    for i, entry in enumerate(entries):
        value = entry.get(key)
        if value is None:
            continue
        if not isinstance(value, (list, tuple)):
            raise DumpFormatError(f"entry {i} {key}: expected a list of shapes")
        counts[i] = len(value)
        budget.take(len(value))
        for shape in value:
            if not isinstance(shape, (list, tuple)):
                raise DumpFormatError(f"entry {i} {key}: expected a list of shapes")
            budget.take(len(shape))
            ndims.append(len(shape))
            for d in shape:
                dim = as_int(d, f"entry {i} {key}")
                if dim is None:
                    raise DumpFormatError(f"entry {i} {key}: a dimension is None")
                dims.append(dim)
    return SizesColumn(counts, np.asarray(ndims, np.int64), np.asarray(dims, np.int64))


def _dtypes_column(entries: list[Any], key: str, budget: ElementBudget) -> ListColumn:
    counts = np.full(len(entries), -1, np.int64)
    flat: list[Any] = []
    for i, entry in enumerate(entries):
        value = entry.get(key)
        if value is None:
            continue
        if not isinstance(value, (list, tuple)):
            raise DumpFormatError(f"entry {i} {key}: expected a list of dtype names")
        counts[i] = len(value)
        budget.take(len(value))
        flat.extend(value)
    column = _str_column(flat, key)
    return ListColumn(counts, column.codes, column.values)


def _frames_column(entries: list[Any], max_frames: int, budget: ElementBudget) -> ListColumn:
    counts = np.full(len(entries), -1, np.int64)
    flat: list[str] = []
    for i, entry in enumerate(entries):
        value = entry.get("frames")
        if value is None:
            continue
        if not isinstance(value, (list, tuple)):
            raise DumpFormatError(f"entry {i} frames: expected a list")
        kept = value[:max_frames]
        counts[i] = len(kept)
        budget.take(len(kept))
        flat.extend(_frame_text(f) for f in kept)
    column = _str_column(flat, "frames")
    return ListColumn(counts, column.codes, column.values)


def dump_from_object(obj: Any, path: Path, fmt: str, max_frames: int,
                     limits: DumpLimits | None = None, file_bytes: int = 0) -> Dump:
    """Columns of a dump loaded as Python objects (JSON, or a pickle the fast scanner handed over).
    This is the
    reference: the fast scanner reads a file only where it gives exactly this."""
    budget = ElementBudget(limits or default_limits(), file_bytes)
    top = check_top(obj)
    entries = _checked_entries(top, budget, file_bytes)
    ints = _int_columns(entries)
    pg_id = ints.pop("pg_id")
    strings = _string_columns(entries)
    sizes = {key: _sizes_column(entries, key, budget) for key in ("input_sizes", "output_sizes")}
    dtypes = {
        key: _dtypes_column(entries, key, budget) for key in ("input_dtypes", "output_dtypes")
    }
    frames = _frames_column(entries, max_frames, budget) if max_frames > 0 else None
    rank = as_int(top.get("rank"), "rank")
    return Dump(
        path=path, fmt=fmt, rank=-1 if rank is None else rank, n=len(entries), **dump_header(top),
        ints=ints, pg_id=pg_id, is_p2p=_flag(entries, "is_p2p"), retired=_flag(entries, "retired"),
        strings=strings, sizes=sizes, dtypes=dtypes, frames=frames,
    )
