"""Flight-recorder dump reader: a directory of per-rank dumps -> rows of the `collectives` table.

Reads what torch's flight recorder writes (NCCL watchdog files `_dump_9`, `comm_lib_trace_rank_9`) and what
faultlens' trigger writes (`rank_9.pkl`, `rank_9.json`, interface 4): pickle or JSON, NCCL or gloo, format versions
2.x, one rank or thousands, incomplete sets allowed. The rank is the dump's top-level `rank` key, else the last
integer in the file name; a rank with both a pickle and a JSON dump is read once, from the pickle (the JSON one is
the fallback when the pickle is broken).

Pickles never reach `pickle.load`: a compiled scanner (faultlens.collectors.artifacts.fr_fastpickle) turns the
plain-data opcodes
into columns directly, and anything it does not accept goes to the restricted unpickler
(faultlens.collectors.artifacts.safe_pickle), which loads plain data or refuses. A truncated, corrupt or hostile dump
becomes a
DumpFileError naming the file and the problem, and every other rank is still read.

Speed and memory: files are parsed a window at a time by a few threads (the scanner releases the GIL) and their
columns are assembled into Arrow chunks of CHUNK_ROWS rows as they come, with set-wide string dictionaries, so a
16,384-rank set is never held twice. `columns=` builds only what a caller needs and `dictionary=True` keeps strings
dictionary-encoded (what the hang analysis uses); the defaults give the table exactly in the schema.

Rows, one per entry (`record_id` set). Besides them each dump adds one *status row* per `pg_status` group
(`record_id` null; `pg_id` the dump's local id, `pg_last_enqueued/started/completed` set), or a single status row
when it has none, so a dump with no entries (an idle rank in an only-active dump) is still visible as present.

Process groups: `pg_id` is the rank-local id of the entry; `pg_name` / `pg_desc` come from `process_group` and are
what identifies a group across ranks. `pg_ranks` (global ranks of the group) comes from `pg_config`; when that is
broken as gloo writes it (keyed '', ranks '[]', groups overwriting each other) it is rebuilt from the entries: the
ranks whose dumps recorded that group (plus every rank of `world_size`, else 0..highest rank read, for the default
group). To keep dump sets of
thousands of ranks small, `pg_ranks` is carried on the first row of each group (per distinct membership) in the
set, and is null on the group's other rows: `SELECT DISTINCT pg_name, pg_ranks ... WHERE pg_ranks IS NOT NULL`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts import fr_fastpickle as fast
from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits
from faultlens.collectors.artifacts.safe_pickle import PickleLoadError, _has_surrogate, safe_loads
from faultlens.collectors.errors import FaultlensError
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.schema import TABLES, validate

log = logging.getLogger(__name__)

TABLE = "collectives"
SCHEMA = TABLES[TABLE]
DEFAULT_MAX_FRAMES = 16
CHUNK_ROWS = 1 << 20  # rows per Arrow chunk while reading (bounds the per-dump pieces held at once)
PICKLE_SUFFIXES = (".pkl", ".pickle")
JSON_SUFFIXES = (".json",)
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$", re.IGNORECASE)
_INT_COLUMNS = {
    "record_id": "record_id",
    "collective_seq_id": "collective_seq_id",
    "p2p_seq_id": "p2p_seq_id",
    "op_id": "op_id",
    "timeout_ms": "timeout_ms",
}
_TIME_COLUMNS = {
    "time_created": "time_created_ns",
    "time_started": "time_discovered_started_ns",
    "time_completed": "time_discovered_completed_ns",
}
_STRING_FIELDS = ("op", "state", "pg_name", "pg_desc")
_JSON_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape (an unpaired one is refused)


class DumpFileError(ValueError, FaultlensError):
    """One dump file cannot be read: the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class DumpDirError(ValueError, FaultlensError):
    """A dump directory as a whole cannot be read (missing, not a directory, no dumps in it)."""


@dataclass(frozen=True)
class DumpSet:
    """What read_dump_dir found: the rows, the ranks read, the files used and the per-file errors."""

    table: pa.Table
    ranks: tuple[int, ...]
    files: tuple[str, ...]
    errors: tuple[DumpFileError, ...]
    world_size: int | None = None
    skipped: tuple[str, ...] = ()  # files not used (a JSON twin of a pickle, a duplicate rank)
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------------------
# per-dump columns, from either parser


@dataclass
class _StrColumn:
    codes: np.ndarray  # int32, -1 = null
    values: list[str]


@dataclass
class _ListColumn:
    counts: np.ndarray  # int64 per entry, -1 = null
    items: np.ndarray  # int64 per item (ints) or int32 codes into `values` (strings)
    values: list[str] | None = None


@dataclass
class _SizesColumn:
    counts: np.ndarray  # tensors per entry, -1 = null
    ndims: np.ndarray  # dims per tensor
    dims: np.ndarray  # all dims


@dataclass
class _Dump:
    path: Path
    fmt: str
    rank: int
    n: int
    version: str | None
    world_size: int | None
    node: str | None
    comm_lib_version: str | None
    pg_config: Mapping[str, Any]
    pg_status: Mapping[str, Any]
    ints: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (values int64, valid bool)
    pg_id: tuple[np.ndarray, np.ndarray]
    is_p2p: np.ndarray  # int8, -1 null
    retired: np.ndarray
    strings: dict[str, _StrColumn]
    sizes: dict[str, _SizesColumn]
    dtypes: dict[str, _ListColumn]
    frames: _ListColumn | None
    mtime_ns: int = 0


class _DumpFormatError(ValueError, FaultlensError):
    pass


class _Decline(FaultlensError):
    """The fast path leaves this dump to the reference path (which loads it or says why not)."""


_SCALARS = (str, int, float, bool, bytes, type(None))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DIGIT_TEXT = re.compile(r"-?\d+")


def _show(value: Any) -> str:
    """A short, bounded description of a value for an error message (never the repr of a container or of a huge
    integer: those can cost unbounded time)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(value) if -(10**20) < value < 10**20 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (str, bytes)):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def _as_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _DumpFormatError(f"{what}: {_show(value)} does not fit 64 bits")
        return value
    if isinstance(value, str):
        text = value.strip()
        if _DIGIT_TEXT.fullmatch(text):
            if len(text) > 20:
                raise _DumpFormatError(f"{what}: an integer of {len(text)} digits does not fit 64 bits")
            return _as_int(int(text), what)
    if isinstance(value, float) and value.is_integer():
        return _as_int(int(value), what)
    raise _DumpFormatError(f"{what}: expected an integer, got {type(value).__name__} {_show(value)}")


def _text(value: Any, what: str) -> str | None:
    """A string field: None, a string, or a scalar written as one; a container is refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, _SCALARS):
        return str(value)
    raise _DumpFormatError(f"{what}: expected a string, got a {type(value).__name__}")


class _Budget:
    """Elements (entries + shapes + dims + dtypes + frames kept) one dump may expand to (fr_limits), counted the
    same way by both readers."""

    def __init__(self, limits: DumpLimits, file_bytes: int) -> None:
        self.left = limits.element_budget(file_bytes)
        self.limit = self.left
        self.entries = limits.entry_budget(file_bytes)
        self.file_bytes = file_bytes

    def take(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise _DumpFormatError(f"expands to more than {self.limit} elements (entries, shapes, dims, dtypes, "
                                   f"frames) from {self.file_bytes} bytes: shared references? (limit: "
                                   "fr_limits elements_per_byte)")


def _check_top(obj: Any) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise _DumpFormatError(f"not a flight-recorder dump: top level is a {type(obj).__name__}, expected a dict")
    if "version" not in obj and "entries" not in obj:
        keys = ", ".join(sorted(_show(k) if not isinstance(k, str) else k[:40] for k in list(obj)[:64])[:6])
        raise _DumpFormatError(f"not a flight-recorder dump: no 'version' or 'entries' key (keys: {keys})")
    version = obj.get("version")
    if version is not None:
        if not isinstance(version, (str, int, float)) or isinstance(version, bool):
            raise _DumpFormatError(f"unsupported flight-recorder format version {_show(version)} (expected 2.x)")
        text = str(version) if not isinstance(version, str) else version
        if not re.fullmatch(r"2\.\d{1,6}(\.\d{1,6})?", text):
            raise _DumpFormatError(f"unsupported flight-recorder format version {_show(text)} (expected 2.x)")
    entries = obj.get("entries", [])
    if not isinstance(entries, list):
        raise _DumpFormatError(f"'entries' is a {type(entries).__name__}, expected a list")
    for key in ("pg_config", "pg_status"):
        if obj.get(key) is not None and not isinstance(obj.get(key), Mapping):
            raise _DumpFormatError(f"'{key}' is a {type(obj[key]).__name__}, expected a dict")
    for key in obj.get("pg_status") or ():
        if not isinstance(key, (str, int)):
            raise _DumpFormatError(f"'pg_status' key {_show(key)}: expected a process group id")
    for key in ("node", "comm_lib_version", "nccl_version"):
        _text(obj.get(key), key)
    return obj


def _str_column(values: Sequence[Any], what: str) -> _StrColumn:
    lookup: dict[str, int] = {}
    uniques: list[str] = []
    codes = np.empty(len(values), np.int32)
    for i, value in enumerate(values):
        if value is None:
            codes[i] = -1
            continue
        if not isinstance(value, str):
            value = _text(value, what)
        code = lookup.get(value)
        if code is None:
            code = lookup[value] = len(uniques)
            uniques.append(value)
        codes[i] = code
    return _StrColumn(codes, uniques)


def _frame_text(frame: Any) -> str:
    if isinstance(frame, Mapping):
        name = _text(frame.get("name"), "frame name")
        filename = _text(frame.get("filename"), "frame filename")
        line = frame.get("line")
        if not isinstance(line, _SCALARS):
            raise _DumpFormatError(f"frame line: expected an integer, got a {type(line).__name__}")
        return f"{name} ({filename}:{line})"
    return _text(frame, "frame")


def _dump_from_object(obj: Any, path: Path, fmt: str, max_frames: int, limits: DumpLimits | None = None,
                      file_bytes: int = 0) -> _Dump:
    """Columns of a dump loaded as Python objects (JSON, or a pickle the fast scanner handed over). This is the
    reference: the fast scanner reads a file only where it gives exactly this."""
    budget = _Budget(limits or default_limits(), file_bytes)
    top = _check_top(obj)
    entries = top.get("entries") or []
    if len(entries) > budget.entries:
        raise _DumpFormatError(f"{len(entries)} entries in {file_bytes} bytes: more than {budget.entries} "
                               "(limit: fr_limits bytes_per_entry)")
    budget.take(len(entries))
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise _DumpFormatError(f"entry {i} is a {type(entry).__name__}, expected a dict")
    n = len(entries)
    ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for key in ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "timeout_ms", "time_created_ns",
                "time_discovered_started_ns", "time_discovered_completed_ns", "pg_id"):
        values = np.zeros(n, np.int64)
        valid = np.zeros(n, bool)
        for i, entry in enumerate(entries):
            value = _as_int(entry.get(key), f"entry {i} {key}")
            if value is not None:
                values[i] = value
                valid[i] = True
        ints[key] = (values, valid)
    pg_id = ints.pop("pg_id")

    def flag(key: str) -> np.ndarray:
        out = np.full(n, -1, np.int8)
        for i, entry in enumerate(entries):
            value = entry.get(key)
            if value is not None:
                out[i] = 1 if value else 0
        return out

    groups = [entry.get("process_group") for entry in entries]
    names, descs = [], []
    for i, group in enumerate(groups):
        if group is None:
            names.append(None)
            descs.append(None)
        elif isinstance(group, (list, tuple)):
            names.append(_text(group[0], f"entry {i} process_group") if len(group) > 0 else None)
            descs.append(_text(group[1], f"entry {i} process_group") if len(group) > 1 else None)
        else:
            raise _DumpFormatError(f"entry {i} process_group: expected (name, desc), got {type(group).__name__}")
    strings = {
        "op": _str_column([e.get("profiling_name") for e in entries], "profiling_name"),
        "state": _str_column([e.get("state") for e in entries], "state"),
        "pg_name": _str_column(names, "process_group"),
        "pg_desc": _str_column(descs, "process_group"),
    }
    sizes: dict[str, _SizesColumn] = {}
    for key in ("input_sizes", "output_sizes"):
        counts = np.full(n, -1, np.int64)
        ndims: list[int] = []
        dims: list[int] = []
        for i, entry in enumerate(entries):
            value = entry.get(key)
            if value is None:
                continue
            if not isinstance(value, (list, tuple)):
                raise _DumpFormatError(f"entry {i} {key}: expected a list of shapes")
            counts[i] = len(value)
            budget.take(len(value))
            for shape in value:
                if not isinstance(shape, (list, tuple)):
                    raise _DumpFormatError(f"entry {i} {key}: expected a list of shapes")
                budget.take(len(shape))
                ndims.append(len(shape))
                for d in shape:
                    dim = _as_int(d, f"entry {i} {key}")
                    if dim is None:
                        raise _DumpFormatError(f"entry {i} {key}: a dimension is None")
                    dims.append(dim)
        sizes[key] = _SizesColumn(counts, np.asarray(ndims, np.int64), np.asarray(dims, np.int64))
    dtypes: dict[str, _ListColumn] = {}
    for key in ("input_dtypes", "output_dtypes"):
        counts = np.full(n, -1, np.int64)
        flat: list[Any] = []
        for i, entry in enumerate(entries):
            value = entry.get(key)
            if value is None:
                continue
            if not isinstance(value, (list, tuple)):
                raise _DumpFormatError(f"entry {i} {key}: expected a list of dtype names")
            counts[i] = len(value)
            budget.take(len(value))
            flat.extend(value)
        column = _str_column(flat, key)
        dtypes[key] = _ListColumn(counts, column.codes, column.values)
    frames = None
    if max_frames > 0:
        counts = np.full(n, -1, np.int64)
        flat = []
        for i, entry in enumerate(entries):
            value = entry.get("frames")
            if value is None:
                continue
            if not isinstance(value, (list, tuple)):
                raise _DumpFormatError(f"entry {i} frames: expected a list")
            kept = value[:max_frames]
            counts[i] = len(kept)
            budget.take(len(kept))
            flat.extend(_frame_text(f) for f in kept)
        column = _str_column(flat, "frames")
        frames = _ListColumn(counts, column.codes, column.values)
    rank = _as_int(top.get("rank"), "rank")
    return _Dump(
        path=path, fmt=fmt, rank=-1 if rank is None else rank, n=n,
        version=None if top.get("version") is None else str(top.get("version")),
        world_size=_as_int(top.get("world_size"), "world_size"), node=_text(top.get("node"), "node"),
        comm_lib_version=_text(top.get("comm_lib_version", top.get("nccl_version")), "comm_lib_version"),
        pg_config=top.get("pg_config") or {}, pg_status=top.get("pg_status") or {},
        ints=ints, pg_id=pg_id, is_p2p=flag("is_p2p"), retired=flag("retired"), strings=strings, sizes=sizes,
        dtypes=dtypes, frames=frames,
    )


# ---------------------------------------------------------------------------------------------------------------
# the fast path


class _Decoder:
    """Turns tape nodes into Python values (small parts only) and string nodes into codes."""

    def __init__(self, buf: np.ndarray, kind: np.ndarray, ival: np.ndarray, ilen: np.ndarray,
                 links: tuple[np.ndarray, ...], limits: DumpLimits | None = None) -> None:
        limits = limits or default_limits()
        self.left = limits.element_budget(int(buf.shape[0]))  # values decoded (shared references count each time)
        self.max_depth = limits.max_depth
        self.buf = buf
        self.kind, self.ival, self.ilen = kind, ival, ilen
        self.head, self.run_start, self.run_end, self.run_next, self.echild = links

    def children(self, node: int) -> list[int]:
        out: list[int] = []
        run = int(self.head[node])
        while run >= 0:
            out.extend(self.echild[self.run_start[run]:self.run_end[run]].tolist())
            run = int(self.run_next[run])
        return out

    def raw(self, node: int) -> bytes:
        start = int(self.ival[node])
        return self.buf[start:start + int(self.ilen[node])].tobytes()

    def text(self, node: int) -> str:
        return self.raw(node).decode("utf-8", "replace")

    def value(self, node: int, depth: int = 0) -> Any:
        self.left -= 1
        if depth > self.max_depth or self.left < 0:
            raise _Decline("nesting or expansion beyond the limits")
        k = int(self.kind[node])
        if k == fast.K_NONE:
            return None
        if k in (fast.K_TRUE, fast.K_FALSE):
            return k == fast.K_TRUE
        if k == fast.K_INT:
            return int(self.ival[node])
        if k == fast.K_FLOAT:
            return float(np.array([self.ival[node]], np.int64).view(np.float64)[0])
        if k == fast.K_STR:
            return self.text(node)
        if k == fast.K_BYTES:
            return self.raw(node)
        items = self.children(node)
        if k == fast.K_DICT:
            return {self.value(int(items[i]), depth + 1): self.value(int(items[i + 1]), depth + 1)
                    for i in range(0, len(items), 2)}
        values = [self.value(int(item), depth + 1) for item in items]
        return tuple(values) if k == fast.K_TUPLE else values

    def _opt(self, node: int) -> Any:
        return None if node < 0 else self.value(node)

    def top_fields(self, small: tuple) -> dict[str, Any]:
        """The root's small fields from the scanner's _top (no generic walk)."""
        _ok, top, cfg, status = small
        out: dict[str, Any] = {"entries": []} if top[8] >= 0 else {}
        for i, name in enumerate(fast.TOP_FIELDS):
            if name not in ("pg_config", "pg_status") and top[i] >= 0:
                out[name] = self.value(int(top[i]))
        out["pg_config"] = {
            self.text(int(key)) if self.kind[key] == fast.K_STR else self.value(int(key)):
                {"name": self._opt(int(name)), "desc": self._opt(int(desc)), "ranks": self._opt(int(ranks))}
            for key, name, desc, ranks in cfg.tolist()}
        keys = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
        out["pg_status"] = {
            (self.text(int(row[0])) if self.kind[row[0]] == fast.K_STR else self.value(int(row[0]))):
                dict(zip(keys, row[1:], strict=True))
            for row in status.tolist()}
        return out

    def top_level(self, root: int) -> dict[str, Any]:
        """The root dict with 'entries' left empty (those are read into columns)."""
        items = self.children(root)
        out: dict[str, Any] = {}
        for i in range(0, len(items), 2):
            key_node, value_node = int(items[i]), int(items[i + 1])
            if self.kind[key_node] != fast.K_STR:
                continue
            key = self.text(key_node)
            out[key] = self.value(value_node) if key != "entries" else []
        return out

    def strings(self, nodes: np.ndarray, workspace: fast.Workspace) -> _StrColumn:
        codes, distinct = workspace.intern(nodes)
        texts = [self.text(node) for node in distinct.tolist()]
        if len(set(texts)) == len(texts):
            return _StrColumn(codes, texts)
        # the same text in several (unmemoized) string nodes: one code per text
        lookup: dict[str, int] = {}
        values: list[str] = []
        remap = np.empty(len(texts), np.int32)
        for i, text in enumerate(texts):
            code = lookup.get(text)
            if code is None:
                code = lookup[text] = len(values)
                values.append(text)
            remap[i] = code
        out = np.full(codes.shape[0], -1, np.int32)
        present = codes >= 0
        out[present] = remap[codes[present]]
        return _StrColumn(out, values)


_local = threading.local()


def _workspace() -> fast.Workspace:
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = fast.Workspace()
    return ws


def _dump_fast(buf: np.ndarray, path: Path, max_frames: int, limits: DumpLimits | None = None) -> _Dump | None:
    """Columns straight from the pickle bytes, or None when the scanner declines (then the restricted
    unpickler decides: it is the reference, and gives the error message of a bad file)."""
    limits = limits or default_limits()
    size = int(buf.shape[0])
    bounds = np.array([limits.max_string_bytes, limits.element_budget(size), limits.entry_budget(size)], np.int64)
    workspace = _workspace()
    try:
        result = workspace.parse(buf, max_frames, bounds)
        return _dump_from_tape(workspace, result, buf, path, max_frames, limits)
    except Exception:  # any doubt: the reference decides (and words the error)
        log.debug("fast path declined %s", path, exc_info=True)
        return None
    finally:
        workspace.release()


def _dump_from_tape(workspace: fast.Workspace, result: tuple, buf: np.ndarray, path: Path,
                    max_frames: int, limits: DumpLimits | None = None) -> _Dump | None:
    status, root, kind, ival, ilen, links, _nodes = result[:7]
    if status != fast.OK:
        return None
    (ints, valid, strs, flags), counts, sizes, dtypes, frames, small = result[7:]
    decoder = _Decoder(buf, kind, ival, ilen, links, limits)
    top = _check_top(decoder.top_fields(small) if small[0] else decoder.top_level(root))
    valid = valid.astype(bool)
    slot = {name: i for i, name in enumerate(fast.INT_FIELDS)}
    int_columns = {name: (ints[slot[name]], valid[slot[name]]) for name in fast.INT_FIELDS if name != "pg_id"}
    strings = {name: decoder.strings(strs[i], workspace) for i, name in enumerate(_STRING_FIELDS)}
    dtype_columns = {}
    for i, key in enumerate(("input_dtypes", "output_dtypes")):
        column = decoder.strings(dtypes[i], workspace)
        dtype_columns[key] = _ListColumn(counts[2 + i], column.codes, column.values)
    frame_column = None
    if max_frames > 0:
        name_nodes, file_nodes, lines = frames
        names = decoder.strings(name_nodes, workspace)
        files = decoder.strings(file_nodes, workspace)
        # one text per distinct (name, file, line): vectorised, frames repeat across thousands of entries; keys
        # are composed from dense codes two at a time, so they stay below (frames + 1)^2 (no int64 overflow)
        n_files = len(files.values) + 1
        pair_keys = (names.codes.astype(np.int64) + 1) * n_files + files.codes + 1
        pairs, pair_codes = np.unique(pair_keys, return_inverse=True)
        line_values, line_codes = np.unique(lines, return_inverse=True)
        n_line_values = max(1, line_values.shape[0])
        keys = pair_codes.reshape(-1).astype(np.int64) * n_line_values + line_codes.reshape(-1)
        unique, inverse = np.unique(keys, return_inverse=True)
        texts = []
        for key in unique.tolist():
            pair_code, line_code = divmod(key, n_line_values)
            name_code, file_code = divmod(int(pairs[pair_code]), n_files)
            name_code, file_code, line = name_code - 1, file_code - 1, int(line_values[line_code])
            name = names.values[name_code] if name_code >= 0 else None
            file = files.values[file_code] if file_code >= 0 else None
            texts.append(f"{name} ({file}:{line if line >= 0 else None})")
        frame_column = _ListColumn(counts[4], inverse.reshape(-1).astype(np.int32), texts)
    n = int(ints.shape[1])
    dump = _Dump(
        path=path, fmt="pickle", rank=-1, n=n,
        version=None if top.get("version") is None else str(top.get("version")),
        world_size=_as_int(top.get("world_size"), "world_size"), node=_text(top.get("node"), "node"),
        comm_lib_version=_text(top.get("comm_lib_version", top.get("nccl_version")), "comm_lib_version"),
        pg_config=top.get("pg_config") or {}, pg_status=top.get("pg_status") or {},
        ints=int_columns, pg_id=(ints[slot["pg_id"]], valid[slot["pg_id"]]), is_p2p=flags[0], retired=flags[1],
        strings=strings,
        sizes={"input_sizes": _SizesColumn(counts[0], sizes[0], sizes[1]),
               "output_sizes": _SizesColumn(counts[1], sizes[2], sizes[3])},
        dtypes=dtype_columns, frames=frame_column,
    )
    dump.rank = -1 if top.get("rank") is None else _as_int(top.get("rank"), "rank")
    return dump


# ---------------------------------------------------------------------------------------------------------------
# files


def rank_from_name(path: str | os.PathLike[str]) -> int | None:
    """The last integer of a dump file name: `_dump_9`, `comm_lib_trace_rank_9`, `rank_9.pkl` -> 9 (a number of
    more than 18 digits is no rank: None)."""
    match = _RANK_IN_NAME.search(Path(path).name)
    if not match or len(match.group(1)) > 18:
        return None
    return int(match.group(1))


def _is_candidate(path: Path) -> bool:
    name = path.name
    if name.startswith(".") or name.endswith((".tmp", ".partial")) or not path.is_file():
        return False
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES or suffix in JSON_SUFFIXES:
        return True
    return name[-1:].isdigit() and rank_from_name(name) is not None


def find_dump_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Dump files in `directory` (not recursive), pickles before their JSON twins; temp names are ignored."""
    root = Path(directory)
    if not root.exists():
        raise DumpDirError(f"{root}: no such directory")
    if not root.is_dir():
        raise DumpDirError(f"{root}: not a directory")
    try:
        files = [p for p in root.iterdir() if _is_candidate(p)]
    except OSError as exc:
        raise DumpDirError(f"{root}: cannot list: {exc.strerror or exc}") from None

    def order(path: Path) -> tuple[int, int, str]:
        rank = rank_from_name(path)
        is_json = path.suffix.lower() in JSON_SUFFIXES
        return (rank if rank is not None else 1 << 62, int(is_json), path.name)

    return sorted(files, key=order)


def _looks_like_json(head: bytes) -> bool:
    stripped = head.lstrip()
    return stripped[:1] in (b"{", b"[")


def _load_file(path: Path, max_frames: int, fast_path: bool, limits: DumpLimits | None = None) -> _Dump:
    """One dump, or DumpFileError naming the file: whatever the file holds, no other exception leaves here."""
    limits = limits or default_limits()
    try:
        return _load_file_checked(path, max_frames, fast_path, limits)
    except DumpFileError:
        raise
    except RecursionError:
        raise DumpFileError(path, "nested too deep") from None
    except MemoryError:
        raise DumpFileError(path, "out of memory while reading it") from None
    except Exception as exc:  # a bad file is this file's problem, never the set's (the message says what it was)
        log.debug("unexpected error reading %s", path, exc_info=True)
        raise DumpFileError(path, f"unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


def _load_file_checked(path: Path, max_frames: int, fast_path: bool, limits: DumpLimits) -> _Dump:
    try:
        size = path.stat().st_size
        if size > limits.max_file_bytes:
            raise DumpFileError(path, f"{size} bytes: larger than any real dump (limit {limits.max_file_bytes}, "
                                      "FAULTLENS_FR_MAX_FILE_BYTES)")
        buf = np.fromfile(path, dtype=np.uint8, count=limits.max_file_bytes + 1)
        mtime_ns = path.stat().st_mtime_ns
    except OSError as exc:
        raise DumpFileError(path, f"cannot read: {exc.strerror or exc}") from None
    if buf.shape[0] == 0:
        raise DumpFileError(path, "empty file (a dump cut short?)")
    if buf.shape[0] > limits.max_file_bytes:
        raise DumpFileError(path, f"larger than any real dump (limit {limits.max_file_bytes} bytes)")
    dump = _load_buffer(buf, path, max_frames, fast_path, limits)
    dump.mtime_ns = mtime_ns
    return dump


def load_dump_bytes(data: bytes, name: str = "rank_0.pkl", *, fast_path: bool = False,
                    max_frames: int = DEFAULT_MAX_FRAMES, limits: DumpLimits | None = None) -> _Dump:
    """One dump from bytes, as the reader would read a file called `name` (tests and the fuzz bench compare the
    two pickle paths with it). Raises DumpFileError naming `name`, and nothing else."""
    limits = limits or default_limits()
    path = Path(name)
    buf = np.frombuffer(data, dtype=np.uint8)
    try:
        if buf.shape[0] == 0:
            raise DumpFileError(path, "empty file (a dump cut short?)")
        if buf.shape[0] > limits.max_file_bytes:
            raise DumpFileError(path, f"larger than any real dump (limit {limits.max_file_bytes} bytes)")
        return _load_buffer(buf, path, max_frames, fast_path, limits)
    except DumpFileError:
        raise
    except RecursionError:
        raise DumpFileError(path, "nested too deep") from None
    except MemoryError:
        raise DumpFileError(path, "out of memory while reading it") from None
    except Exception as exc:
        raise DumpFileError(path, f"unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


def _load_buffer(buf: np.ndarray, path: Path, max_frames: int, fast_path: bool, limits: DumpLimits) -> _Dump:
    size = int(buf.shape[0])
    try:
        if _looks_like_json(buf[:64].tobytes()):
            try:
                obj = json.loads(buf.tobytes())
            except RecursionError:
                raise DumpFileError(path, "not a usable JSON dump: nested deeper than the parser's limit") from None
            except (ValueError, UnicodeDecodeError) as exc:
                raise DumpFileError(path, f"not valid JSON (truncated or corrupt?): {str(exc)[:200]}") from None
            if _JSON_SURROGATE.search(buf.tobytes()) and _has_surrogate(obj):
                raise DumpFileError(path, "not a usable JSON dump: a string holds a lone surrogate (\\ud800-\\udfff)")
            dump = _dump_from_object(obj, path, "json", 0, limits, size)
        else:
            dump = _dump_fast(buf, path, max_frames, limits) if fast_path else None
            if dump is None:
                try:
                    obj = safe_loads(buf.tobytes(), source=str(path), limits=limits)
                except PickleLoadError as exc:
                    raise DumpFileError(path, str(exc).removeprefix(f"{path}: ")) from None
                dump = _dump_from_object(obj, path, "pickle", max_frames, limits, size)
    except _DumpFormatError as exc:
        raise DumpFileError(path, str(exc)) from None
    world = limits.max_world_size
    if dump.world_size is not None and not 0 <= dump.world_size <= world:
        raise DumpFileError(path, f"world_size {dump.world_size} is not a job's (limit {world}, "
                                  "FAULTLENS_FR_MAX_WORLD_SIZE)")
    if dump.rank >= world:
        raise DumpFileError(path, f"rank {dump.rank} is not a job's (limit {world}, FAULTLENS_FR_MAX_WORLD_SIZE)")
    if dump.rank < 0:
        from_name = rank_from_name(path)
        if from_name is None:
            raise DumpFileError(path, "cannot tell the rank: no top-level 'rank' and no number in the file name")
        if from_name >= world:
            raise DumpFileError(path, f"rank {from_name} (from the file name) is not a job's (limit {world}, "
                                      "FAULTLENS_FR_MAX_WORLD_SIZE)")
        dump.rank = from_name
    return dump


# ---------------------------------------------------------------------------------------------------------------
# assembly


_MAX_VOCABULARIES = 4096  # per column: dumps of one job share a handful; a hostile set cannot grow it without bound
_MAX_CACHED_VOCABULARY = 256  # longer vocabularies (frames) are remapped each time, not kept


class _Strings:
    """One set-wide dictionary for a string column."""

    def __init__(self) -> None:
        self.lookup: dict[str, int] = {}
        self.values: list[str] = []
        self.tables: dict[tuple[str, ...], np.ndarray] = {}  # a dump's vocabulary -> its codes (remap)

    def remap(self, column_values: Sequence[str], codes: np.ndarray) -> np.ndarray:
        """A dump's local codes (-1 = null) as codes of this set-wide dictionary."""
        if not column_values:
            return codes.astype(np.int32, copy=False)
        key = tuple(column_values)
        table = self.tables.get(key)
        if table is None:
            # the set-wide code of each local value, plus -1 last (where a null's code -1 lands); a code, once
            # given, never changes, so the table of one vocabulary is good for every later dump that has it
            table = np.empty(len(column_values) + 1, np.int32)
            for i, value in enumerate(column_values):
                code = self.lookup.get(value)
                if code is None:
                    code = self.lookup[value] = len(self.values)
                    self.values.append(value)
                table[i] = code
            table[-1] = -1
            if len(column_values) <= _MAX_CACHED_VOCABULARY and len(self.tables) < _MAX_VOCABULARIES:
                self.tables[key] = table
        if codes.shape[0] and int(codes.min()) < -1:  # never from the parsers; kept null rather than wrapped
            codes = np.where(codes < 0, -1, codes)
        return table[codes]

    def array(self, codes: np.ndarray, dictionary: bool) -> pa.Array:
        indices = pa.array(codes, type=pa.int32(), mask=codes < 0)
        arr = pa.DictionaryArray.from_arrays(indices, pa.array(self.values, type=pa.string()))
        return arr if dictionary else arr.cast(pa.string())


_RANKS_CACHE: dict[tuple[str, int], tuple[int, ...] | None] = {}


def _rank_list(values: Any, world: int) -> tuple[int, ...] | None:
    if not isinstance(values, (list, tuple)) or len(values) > world:
        return None
    ranks = []
    for r in values:
        if isinstance(r, str) and 0 < len(r.strip()) <= 10 and r.strip().isdigit():
            r = int(r.strip())
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world:
            return None
        ranks.append(r)
    return tuple(sorted(ranks)) or None


def parse_ranks(text: Any, max_world_size: int | None = None) -> tuple[int, ...] | None:
    """pg_config 'ranks' ('[0, 1, 2]' or a list) -> sorted tuple; None when empty or unreadable, or when a rank is
    not one of a real job (outside 0..max_world_size-1: fr_limits)."""
    world = max_world_size or default_limits().max_world_size
    if isinstance(text, (list, tuple)):
        return _rank_list(text, world)
    if not isinstance(text, str):
        return None
    cached = _RANKS_CACHE.get((text, world), ...)
    if cached is not ...:
        return cached  # type: ignore[return-value]
    try:
        ranks = _rank_list(json.loads(text), world) if len(text) <= 16 * world + 2 else None
    except (ValueError, TypeError, RecursionError):
        ranks = None
    if len(_RANKS_CACHE) < 65536:
        _RANKS_CACHE[(text, world)] = ranks
    return ranks


def _config_ranks(pg_config: Mapping[str, Any], name: str | None,
                  max_world_size: int | None = None) -> tuple[int, ...] | None:
    if name is None or not name:
        return None
    entry = pg_config.get(name)
    if not isinstance(entry, Mapping):
        return None
    return parse_ranks(entry.get("ranks"), max_world_size)


def _status_value(status: Mapping[str, Any], pg_id: str, key: str) -> int | None:
    group = status.get(pg_id)
    if not isinstance(group, Mapping):
        return None
    try:
        return _as_int(group.get(key), key)
    except _DumpFormatError:
        return None


def _comm_lib(dump: _Dump) -> str | None:
    ops = dump.strings["op"].values
    for prefix in ("nccl", "gloo", "ucc", "mpi", "xccl"):
        if any(op.startswith(prefix + ":") for op in ops):
            return prefix
    if dump.comm_lib_version:
        return "nccl"
    return "gloo" if dump.comm_lib_version == "" else None


@dataclass
class _Assembly:
    columns: set[str]
    dictionary: bool
    strings: dict[str, _Strings] = field(default_factory=lambda: {
        k: _Strings() for k in ("op", "state", "pg_name", "pg_desc", "pg_id", "dump_id", "fr_version",
                                "comm_lib", "node", "input_dtypes", "output_dtypes", "frames")})
    parts: list[dict[str, Any]] = field(default_factory=list)
    group_members: dict[str, set[int]] = field(default_factory=dict)  # from entries
    group_configs: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    config_objects: list[tuple[int, ...]] = field(default_factory=list)
    row_group: dict[int, str] = field(default_factory=dict)  # rows carrying pg_ranks -> their group
    group_first_row: dict[str, int] = field(default_factory=dict)
    group_desc: dict[str, str] = field(default_factory=dict)
    ranks_rows: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    carried: set[tuple[str, int]] = field(default_factory=set)  # (group, id of the cached ranks tuple)
    rows: int = 0  # rows so far in the whole set (row indices below are set-wide)
    chunk_rows: int = 0  # rows of the parts not yet built into a chunk
    chunks: list[pa.Table] = field(default_factory=list)
    world_size: int | None = None
    all_ranks: set[int] = field(default_factory=set)
    max_world_size: int | None = None  # fr_limits' (read once per set, not per dump)

    def add(self, dump: _Dump, dump_id: str) -> None:
        n = dump.n
        self.all_ranks.add(dump.rank)
        if dump.world_size:
            self.world_size = max(self.world_size or 0, dump.world_size)
        part: dict[str, Any] = {"n": n}
        names = dump.strings["pg_name"]
        name_codes = self.strings["pg_name"].remap(names.values, names.codes)
        pg_ids, pg_valid = dump.pg_id
        # group key: the name, else the local id
        part["pg_name"] = name_codes
        for key in ("op", "state", "pg_desc"):
            column = dump.strings[key]
            part[key] = self.strings[key].remap(column.values, column.codes)
        valid_rows = np.flatnonzero(pg_valid) if n else np.empty(0, np.int64)
        unique_ids, first_valid = np.unique(pg_ids[valid_rows], return_index=True)
        id_values = [str(v) for v in unique_ids.tolist()]
        local_codes = np.full(n, -1, np.int32)
        if valid_rows.shape[0]:
            local_codes[valid_rows] = np.searchsorted(unique_ids, pg_ids[valid_rows]).astype(np.int32)
        first_row_of_id = valid_rows[first_valid]  # the first entry of each local pg id
        part["pg_id"] = self.strings["pg_id"].remap(id_values, local_codes)
        # copies of the wanted columns only: the parser's 2-D arrays are released with the dump
        for column, key in _INT_COLUMNS.items():
            if column in self.columns:
                values, valid = dump.ints[key]
                part[column] = (values.copy(), valid.copy())
        for column, key in _TIME_COLUMNS.items():
            if column not in self.columns and column != "time_created":
                continue
            values, valid = dump.ints[key]
            if column != "time_created":
                valid = valid & (values != 0)  # the JSON form writes 0 for "not seen"
            part[column] = (values.copy(), valid.copy())
        part["is_p2p"] = dump.is_p2p.copy()
        part["retired"] = dump.retired.copy()
        # pg_status per row, by the entry's local pg id
        status = dump.pg_status
        for column, key in (("pg_last_enqueued", "last_enqueued_collective"),
                            ("pg_last_started", "last_started_collective"),
                            ("pg_last_completed", "last_completed_collective")):
            if column not in self.columns:
                continue
            # one value per local pg id, plus "none" last (where local code -1 lands)
            by_id = np.zeros(len(id_values) + 1, np.int64)
            known = np.zeros(len(id_values) + 1, bool)
            for i, pid in enumerate(id_values):
                value = _status_value(status, pid, key)
                if value is not None:
                    by_id[i] = value
                    known[i] = True
            part[column] = (by_id[local_codes], known[local_codes])
        for key in ("input_sizes", "output_sizes"):
            if key in self.columns:
                sizes = dump.sizes[key]
                part[key] = _SizesColumn(sizes.counts.astype(np.int32), sizes.ndims.astype(np.int32), sizes.dims)
        for key in ("input_dtypes", "output_dtypes"):
            if key in self.columns:
                column = dump.dtypes[key]
                part[key] = (column.counts.astype(np.int32),
                             self.strings[key].remap(column.values or [], column.items))
        if dump.frames is not None and "frames" in self.columns:
            part["frames"] = (dump.frames.counts, self.strings["frames"].remap(dump.frames.values or [],
                                                                              dump.frames.items))
        # membership: config where it is sound, else the ranks seen in entries
        base = self.rows
        names_in_dump, first_rows = np.unique(name_codes, return_index=True)
        for code, first in zip(names_in_dump.tolist(), first_rows.tolist(), strict=True):
            if code < 0:
                continue
            name = self.strings["pg_name"].values[code]
            self.group_members.setdefault(name, set()).add(dump.rank)
            self.group_first_row.setdefault(name, base + first)
            desc_code = part["pg_desc"][first]
            if desc_code >= 0:
                self.group_desc.setdefault(name, self.strings["pg_desc"].values[int(desc_code)])
            ranks = _config_ranks(dump.pg_config, name, self.max_world_size)
            if ranks is not None:
                # keyed by the cached tuple's identity: hashing a 16,384-rank tuple for every dump costs seconds
                key = (name, id(ranks))
                if key not in self.carried:
                    self.carried.add(key)
                    self.config_objects.append(ranks)  # keeps id() unique while the assembly lives
                    self.group_configs.setdefault(name, set()).add(ranks)
                    self.ranks_rows.append((base + first, ranks))
                    self.row_group[base + first] = name
        # status rows: one per pg_status group (or one marker)
        status_ids = [str(k) for k in status] or [None]
        id_to_name = dict(zip(id_values, name_codes[first_row_of_id].tolist(), strict=True))
        part["status"] = []
        for pid in status_ids:
            part["status"].append((
                pid, id_to_name.get(pid, -1),
                None if pid is None else _status_value(status, pid, "last_enqueued_collective"),
                None if pid is None else _status_value(status, pid, "last_started_collective"),
                None if pid is None else _status_value(status, pid, "last_completed_collective"),
            ))
        part["rank"] = dump.rank
        part["dump_id"] = self.strings["dump_id"].remap([dump_id], np.zeros(1, np.int32))[0]
        part["fr_version"] = self.strings["fr_version"].remap([dump.version], np.zeros(1, np.int32))[0] \
            if dump.version is not None else -1
        lib = _comm_lib(dump)
        part["comm_lib"] = self.strings["comm_lib"].remap([lib], np.zeros(1, np.int32))[0] if lib else -1
        part["node"] = dump.node
        created, created_valid = dump.ints["time_created_ns"]
        part["dump_ts"] = int(created[created_valid].max()) if created_valid.any() else dump.mtime_ns
        self.rows += n + len(status_ids)
        self.chunk_rows += n + len(status_ids)
        self.parts.append(part)

    # -- membership rebuilt where the config is broken

    def rebuild_membership(self) -> None:
        for name, members in self.group_members.items():
            if name in self.group_configs:
                continue
            ranks = set(members)
            if self.group_desc.get(name) == "default_pg":
                # the default group holds every rank: world_size when a dump says it, else 0..highest rank read
                ranks |= set(range(self.world_size or max(self.all_ranks, default=-1) + 1))
            rebuilt = tuple(sorted(ranks))
            self.ranks_rows.append((self.group_first_row[name], rebuilt))
            self.row_group[self.group_first_row[name]] = name

    # -- Arrow

    def flush_chunk(self, identity: NodeIdentity | None) -> None:
        """Build the parts so far into one Arrow chunk and drop them (memory: one chunk of parts at a time)."""
        if self.parts:
            self.chunks.append(self._chunk_table(identity))
            self.parts = []
            self.chunk_rows = 0

    def table(self, identity: NodeIdentity | None) -> pa.Table:
        """The whole set: the chunks (dictionaries rewrapped with the final, set-wide values) plus pg_ranks."""
        self.flush_chunk(identity)
        self.rebuild_membership()
        columns: dict[str, pa.ChunkedArray] = {}
        for name in self.chunks[0].column_names:
            pieces = [_with_dictionary(chunk.column(name).chunk(0), self.strings.get(name), self.dictionary)
                      for chunk in self.chunks]
            columns[name] = pa.chunked_array(pieces, type=pieces[0].type)
        self.chunks = []
        if "pg_ranks" in self.columns:
            columns["pg_ranks"] = pa.chunked_array([self._pg_ranks_array(self.rows)])
        if identity is not None:
            for name, value in identity.columns().items():
                if name in self.columns and name != "node" and value is not None:
                    if name == "attempt":
                        columns[name] = pa.chunked_array([pa.array(np.full(self.rows, int(value), np.int32))])
                    else:
                        columns[name] = pa.chunked_array([_repeat_strings([(self.rows, str(value))], self.rows,
                                                                          self.dictionary)])
        ordered = [c for c in SCHEMA.names if c in columns]
        return pa.table({c: columns[c] for c in ordered})

    def _chunk_table(self, identity: NodeIdentity | None) -> pa.Table:
        # row layout per part: n entry rows, then its status rows
        total = self.chunk_rows
        cols: dict[str, Any] = {}

        def gather_int(name: str) -> pa.Array:
            values = np.zeros(total, np.int64)
            valid = np.zeros(total, bool)
            pos = 0
            for part in self.parts:
                n = part["n"]
                v, ok = part[name]
                values[pos:pos + n] = v
                valid[pos:pos + n] = ok
                pos += n + len(part["status"])
            return values, valid

        def gather_codes(name: str, status_value: Any = None) -> np.ndarray:
            out = np.full(total, -1, np.int32)
            pos = 0
            for part in self.parts:
                n = part["n"]
                out[pos:pos + n] = part[name]
                pos += n + len(part["status"])
            return out

        wanted = self.columns

        def release(*names: str) -> None:
            # a column's per-dump pieces are dropped once it is built: peak memory ~ one table, not two
            for part in self.parts:
                for name in names:
                    part.pop(name, None)

        if "rank" in wanted:
            ranks = np.empty(total, np.int32)
            pos = 0
            for part in self.parts:
                m = part["n"] + len(part["status"])
                ranks[pos:pos + m] = part["rank"]
                pos += m
            cols["rank"] = pa.array(ranks, pa.int32())
        for name in ("dump_id", "fr_version", "comm_lib"):
            if name in wanted:
                codes = np.empty(total, np.int32)
                pos = 0
                for part in self.parts:
                    m = part["n"] + len(part["status"])
                    codes[pos:pos + m] = part[name]
                    pos += m
                cols[name] = self.strings[name].array(codes, True)
        for name in ("op", "state"):
            if name in wanted:
                cols[name] = self.strings[name].array(gather_codes(name), True)
            release(name)
        if "pg_desc" in wanted:
            cols["pg_desc"] = self.strings["pg_desc"].array(gather_codes("pg_desc"), True)
        if "pg_name" in wanted or "pg_id" in wanted:
            names = gather_codes("pg_name")
            ids = gather_codes("pg_id")
            pos = 0
            for part in self.parts:
                n = part["n"]
                for j, (pid, name_code, *_rest) in enumerate(part["status"]):
                    names[pos + n + j] = name_code
                    if pid is not None:
                        ids[pos + n + j] = self.strings["pg_id"].remap([pid], np.zeros(1, np.int32))[0]
                pos += n + len(part["status"])
            if "pg_name" in wanted:
                cols["pg_name"] = self.strings["pg_name"].array(names, True)
            if "pg_id" in wanted:
                cols["pg_id"] = self.strings["pg_id"].array(ids, True)
            release("pg_name", "pg_id")
            if "pg_desc" in wanted:
                # status rows get their group's desc when the name is known
                descs = gather_codes("pg_desc")
                desc_of_name = {}
                for name, desc in self.group_desc.items():
                    desc_of_name[self.strings["pg_name"].lookup[name]] = self.strings["pg_desc"].lookup[desc]
                status_rows = np.nonzero((descs < 0) & (names >= 0))[0]
                for row in status_rows:
                    descs[row] = desc_of_name.get(int(names[row]), -1)
                cols["pg_desc"] = self.strings["pg_desc"].array(descs, True)
                release("pg_desc")
        for name in [*_INT_COLUMNS, "pg_last_enqueued", "pg_last_started", "pg_last_completed"]:
            if name in wanted:
                values, valid = gather_int(name)
                if name.startswith("pg_last_"):
                    index = {"pg_last_enqueued": 2, "pg_last_started": 3, "pg_last_completed": 4}[name]
                    pos = 0
                    for part in self.parts:
                        n = part["n"]
                        for j, status in enumerate(part["status"]):
                            if status[index] is not None:
                                values[pos + n + j] = status[index]
                                valid[pos + n + j] = True
                        pos += n + len(part["status"])
                cols[name] = pa.array(values, pa.int64(), mask=~valid)
                release(name)
        for name in _TIME_COLUMNS:
            if name in wanted or (name == "time_created" and "ts" in wanted):
                values, valid = gather_int(name)
                arr = pa.array(values, pa.int64(), mask=~valid).cast(pa.timestamp("ns", tz="UTC"))
                if name in wanted:
                    cols[name] = arr
                if name == "time_created" and "ts" in wanted:
                    ts = values.copy()
                    pos = 0
                    for part in self.parts:
                        n = part["n"]
                        block = slice(pos, pos + n)
                        ts[block] = np.where(valid[block], values[block], part["dump_ts"])
                        ts[pos + n:pos + n + len(part["status"])] = part["dump_ts"]
                        pos += n + len(part["status"])
                    cols["ts"] = pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC"))
            release(name)
        for name in ("is_p2p", "retired"):
            if name in wanted:
                flags = np.full(total, -1, np.int8)
                pos = 0
                for part in self.parts:
                    n = part["n"]
                    flags[pos:pos + n] = part[name]
                    pos += n + len(part["status"])
                cols[name] = pa.array(flags == 1, pa.bool_(), mask=flags < 0)
                release(name)
        for name in ("input_sizes", "output_sizes"):
            if name in wanted:
                cols[name] = self._sizes_array(name, total)
            release(name)
        for name in ("input_dtypes", "output_dtypes", "frames"):
            if name in wanted:
                cols[name] = self._string_list_array(name, total)
            release(name)
        if "node" in wanted:
            codes = np.empty(total, np.int32)
            pos = 0
            for part in self.parts:
                node = identity.node if identity and identity.node else part["node"]
                m = part["n"] + len(part["status"])
                codes[pos:pos + m] = self.strings["node"].remap([node], np.zeros(1, np.int32))[0] if node else -1
                pos += m
            cols["node"] = self.strings["node"].array(codes, True)
        return pa.table(cols)

    def _layout(self, name: str, total: int) -> tuple[np.ndarray, list[Any]]:
        """Per-row counts for a list column (status rows null)."""
        counts = np.full(total, -1, np.int32)
        pos = 0
        for part in self.parts:
            n = part["n"]
            value = part.get(name)
            if value is not None:
                counts[pos:pos + n] = value.counts if isinstance(value, _SizesColumn) else value[0]
            pos += n + len(part["status"])
        return counts, [p.get(name) for p in self.parts]

    def _sizes_array(self, name: str, total: int) -> pa.Array:
        counts, per_part = self._layout(name, total)
        ndims = np.concatenate([p.ndims for p in per_part if p is not None] or [np.empty(0, np.int64)])
        dims = np.concatenate([p.dims for p in per_part if p is not None] or [np.empty(0, np.int64)])
        inner_offsets = np.zeros(ndims.shape[0] + 1, np.int32)
        np.cumsum(ndims, out=inner_offsets[1:])
        inner = pa.ListArray.from_arrays(pa.array(inner_offsets), pa.array(dims, pa.int64()))
        return _list_from_counts(counts, inner)

    def _string_list_array(self, name: str, total: int) -> pa.Array:
        counts, per_part = self._layout(name, total)
        codes = np.concatenate([p[1] for p in per_part if p is not None] or [np.empty(0, np.int32)])
        values = self.strings[name].array(codes.astype(np.int32), True)
        return _list_from_counts(counts, values)

    def _pg_ranks_array(self, total: int) -> pa.Array:
        counts = np.full(total, -1, np.int32)
        rows = sorted(self.ranks_rows)
        for row, ranks in rows:
            counts[row] = len(ranks)
        values = np.fromiter((r for _, ranks in rows for r in ranks), np.int32,
                             count=sum(len(r) for _, r in rows))
        return _list_from_counts(counts, pa.array(values, pa.int32()))


def _with_dictionary(array: pa.Array, strings: _Strings | None, dictionary: bool) -> pa.Array:
    """A chunk's dictionary column (or list of dictionary) with the set's final dictionary, or cast to plain
    strings. Dictionaries only grow by appending, so a chunk's indices are valid in the final one."""
    if strings is None:
        return array
    final = pa.array(strings.values, type=pa.string())
    if pa.types.is_dictionary(array.type):
        out = pa.DictionaryArray.from_arrays(array.indices, final)
        return out if dictionary else out.cast(pa.string())
    if pa.types.is_list(array.type) and pa.types.is_dictionary(array.type.value_type):
        values = pa.DictionaryArray.from_arrays(array.values.indices, final)
        if not dictionary:
            values = values.cast(pa.string())
        return pa.ListArray.from_arrays(array.offsets, values,
                                        mask=array.is_null() if array.null_count else None)
    return array


def _list_from_counts(counts: np.ndarray, values: pa.Array) -> pa.Array:
    offsets = np.zeros(counts.shape[0] + 1, np.int32)
    np.cumsum(np.maximum(counts, 0), out=offsets[1:])
    null = counts < 0
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                    mask=pa.array(null) if null.any() else None)


def _repeat_strings(runs: list[tuple[int, str | None]], total: int, dictionary: bool) -> pa.Array:
    values: list[str] = []
    lookup: dict[str, int] = {}
    codes = np.empty(total, np.int32)
    pos = 0
    for count, value in runs:
        if value is None:
            code = -1
        else:
            code = lookup.setdefault(value, len(values))
            if code == len(values):
                values.append(value)
        codes[pos:pos + count] = code
        pos += count
    arr = pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), pa.array(values, pa.string()))
    return arr if dictionary else arr.cast(pa.string())


# ---------------------------------------------------------------------------------------------------------------
# public API


PROCESS_MIN_FILES = 1024  # below this, threads in one process; above, the files are split over processes


@dataclass
class _Part:
    """What one reader (a process, or the caller) assembled from a contiguous range of files."""

    assembly: _Assembly
    errors: list[tuple[str, str]]
    seen: list[tuple[int, str]]
    skipped: list[str]


def _read_part(primary: list[Path], twins: dict[Path, Path], wanted: set[str], dictionary: bool, max_frames: int,
               fast_path: bool, workers: int, dir_name: str, identity: NodeIdentity | None,
               limits: DumpLimits | None = None) -> _Part:
    limits = limits or default_limits()

    def load(path: Path) -> _Dump | DumpFileError:
        try:
            return _load_file(path, max_frames, fast_path, limits)
        except DumpFileError as exc:
            twin = twins.get(path)
            if twin is not None:
                try:
                    return _load_file(twin, max_frames, fast_path, limits)
                except DumpFileError:
                    pass
            return exc

    def loaded() -> Iterator[_Dump | DumpFileError]:
        """Dumps in file order, parsed a window at a time (parsing releases the GIL), so that only a window of
        parsed dumps waits for assembly."""
        if workers <= 1 or len(primary) <= 1:
            yield from map(load, primary)
            return
        window = 8 * workers
        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending = [pool.submit(load, p) for p in primary[:window]]
            next_index = window
            while pending:
                result = pending.pop(0).result()
                if next_index < len(primary):
                    pending.append(pool.submit(load, primary[next_index]))
                    next_index += 1
                yield result

    assembly = _Assembly(columns=wanted, dictionary=dictionary, max_world_size=limits.max_world_size)
    part = _Part(assembly, [], [], [])
    seen_ranks: dict[int, str] = {}
    for result in loaded():
        if isinstance(result, DumpFileError):
            part.errors.append((result.path, result.problem))
            log.info("flight-recorder dump skipped: %s", result)
            continue
        if result.rank in seen_ranks:
            part.skipped.append(str(result.path))
            part.errors.append((str(result.path), f"second dump for rank {result.rank} (first: "
                                                  f"{seen_ranks[result.rank]}); ignored"))
            continue
        try:
            assembly.add(result, f"{dir_name}/{result.path.name}")
        except Exception as exc:  # a dump the readers accepted but the assembly cannot take: this file's problem
            log.debug("dump not assembled: %s", result.path, exc_info=True)
            part.errors.append((str(result.path), f"unusable ({type(exc).__name__}: {str(exc)[:200]})"))
            continue
        seen_ranks[result.rank] = str(result.path)
        part.seen.append((result.rank, str(result.path)))
        if assembly.chunk_rows >= CHUNK_ROWS:
            assembly.flush_chunk(identity)
    assembly.flush_chunk(identity)
    return part


def _read_part_in_process(args: tuple) -> _Part:
    """Process-pool entry: the part, with its chunks' dictionaries made final so the caller can read them."""
    part = _read_part(*args)
    assembly = part.assembly
    assembly.chunks = [
        pa.table({name: _with_dictionary(chunk.column(name).chunk(0), assembly.strings.get(name), True)
                  for name in chunk.column_names})
        for chunk in assembly.chunks]
    return part


def _merge_parts(parts: list[_Part], wanted: set[str], dictionary: bool) -> _Assembly:
    """One assembly from parts read by separate processes: dictionary indices remapped to set-wide codes, row
    numbers offset, membership evidence merged."""
    merged = _Assembly(columns=wanted, dictionary=dictionary)
    for part in parts:
        other = part.assembly
        offset = merged.rows
        for chunk in other.chunks:
            columns = {}
            for name in chunk.column_names:
                array = chunk.column(name).chunk(0)
                strings = merged.strings.get(name)
                if strings is not None and pa.types.is_dictionary(array.type):
                    codes = strings.remap(array.dictionary.to_pylist(),
                                          array.indices.fill_null(-1).to_numpy(zero_copy_only=False))
                    array = strings.array(codes, True)
                elif strings is not None and pa.types.is_list(array.type) \
                        and pa.types.is_dictionary(array.type.value_type):
                    values = array.values
                    codes = strings.remap(values.dictionary.to_pylist(),
                                          values.indices.fill_null(-1).to_numpy(zero_copy_only=False))
                    array = pa.ListArray.from_arrays(array.offsets, strings.array(codes, True),
                                                     mask=array.is_null() if array.null_count else None)
                columns[name] = array
            merged.chunks.append(pa.table(columns))
        for name, members in other.group_members.items():
            merged.group_members.setdefault(name, set()).update(members)
        for name, configs in other.group_configs.items():
            merged.group_configs.setdefault(name, set()).update(configs)
        for name, row in other.group_first_row.items():
            merged.group_first_row.setdefault(name, offset + row)
        for name, desc in other.group_desc.items():
            merged.group_desc.setdefault(name, desc)
        carried = {(merged_name(merged, row), ranks) for row, ranks in merged.ranks_rows}
        for row, ranks in other.ranks_rows:
            key = (merged_name(other, row), ranks)
            if key not in carried:
                carried.add(key)
                merged.ranks_rows.append((offset + row, ranks))
                merged.row_group[offset + row] = key[0]
        if other.world_size:
            merged.world_size = max(merged.world_size or 0, other.world_size)
        merged.all_ranks.update(other.all_ranks)
        merged.rows += other.rows
    return merged


def merged_name(assembly: _Assembly, row: int) -> str:
    return assembly.row_group.get(row, "")


def auto_processes(directory: str | os.PathLike[str]) -> int:
    """Processes worth starting for a directory: the CPU count (at most 8) from PROCESS_MIN_FILES files on, else 1
    (a process costs ~1 s of start-up: imports and the compiled scanner)."""
    try:
        count = sum(1 for _ in os.scandir(directory))
    except OSError:
        return 1
    cpus = os.cpu_count() or 1
    # with few cores the reader's threads already keep them busy (the scanner releases the GIL); measured on 2
    # cores, 2 processes were slower than 1 process with 2 threads
    return min(8, cpus // 2) if count >= PROCESS_MIN_FILES and cpus >= 4 else 1


#: dump sets smaller than this are read through the restricted unpickler (no numba compile on a first use); its
#: opcode pre-passes (safe_pickle.check_opcodes: limits, tuple hashing) cost ~3x the load, so above 16 MiB the
#: compiled scanner (which checks the same limits in its one pass) is the faster way
FAST_PATH_MIN_BYTES = 16 * 1024 * 1024


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_dump_dir(directory: str | os.PathLike[str], *, identity: NodeIdentity | None = None,
                  columns: Iterable[str] | None = None, max_frames: int = DEFAULT_MAX_FRAMES,
                  dictionary: bool = False, fast_path: bool | None = None, workers: int | None = None,
                  processes: int | None = None, limits: DumpLimits | None = None) -> DumpSet:
    """Read every dump in `directory` into `collectives` rows.

    columns: the subset of the table's columns to build (default all; analysis needs far fewer).
    dictionary: keep string columns dictionary-encoded (smaller and faster for analysis); the default gives the
    table exactly in the schema. fast_path=False loads pickles through the restricted unpickler only (the
    reference path the fast scanner is tested against); True uses the compiled scanner; None (default) uses it
    when the dump set holds at least FAST_PATH_MIN_BYTES, since its first use after install compiles the numba
    kernels (10-20 s), which a small set — a live hang of a small job — must not wait for.
    workers: threads per process (default: CPU count, at most
    8). processes: split the files over this many processes (spawned: a calling script needs the usual
    `if __name__ == "__main__":` guard); default 1; auto_processes() suggests a count for a directory.
    limits: resource limits on each dump (faultlens.collectors.artifacts.fr_limits; default: its defaults with the
    FAULTLENS_FR_*
    environment overrides); a dump beyond one is a per-file error.
    Per-file problems are in DumpSet.errors (whatever a file holds, it never ends the set); DumpDirError when the
    directory is missing or holds no dump.
    """
    limits = limits or default_limits()
    started = time.perf_counter()
    wanted = set(SCHEMA.names if columns is None else columns)
    unknown = wanted - set(SCHEMA.names)
    if unknown:
        raise ValueError(f"unknown collectives column(s): {', '.join(sorted(unknown))}")
    if "frames" not in wanted:
        max_frames = 0
    files = find_dump_files(directory)
    if not files:
        raise DumpDirError(f"{directory}: no flight-recorder dumps (expected files like rank_0.pkl, _dump_0, "
                           "comm_lib_trace_rank_0, rank_0.json)")
    # a JSON twin of a pickle is read only if the pickle fails
    primary: list[Path] = []
    twins: dict[Path, Path] = {}
    stems: dict[str, Path] = {}
    for path in files:
        stem = path.name[: -len(path.suffix)] if path.suffix.lower() in PICKLE_SUFFIXES + JSON_SUFFIXES else path.name
        if path.suffix.lower() in JSON_SUFFIXES and stem in stems:
            twins[stems[stem]] = path
            continue
        stems.setdefault(stem, path)
        primary.append(path)
    if fast_path is None:
        fast_path = sum(_size(p) for p in primary) >= FAST_PATH_MIN_BYTES
    cpus = os.cpu_count() or 1
    workers = workers or min(8, cpus)
    processes = processes or 1
    dir_name = Path(directory).resolve().name
    if processes > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        size = -(-len(primary) // processes)
        ranges = [primary[i:i + size] for i in range(0, len(primary), size)]
        args = [(paths, {p: twins[p] for p in paths if p in twins}, wanted, True, max_frames, fast_path,
                 max(1, workers // processes), dir_name, identity, limits) for paths in ranges]
        with ProcessPoolExecutor(max_workers=len(ranges), mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_read_part_in_process, args))
        seen_all = [rank for part in parts for rank, _ in part.seen]
        if len(seen_all) != len(set(seen_all)):
            # the same rank in two ranges (two names for one rank): read in one process, which keeps the first
            processes = 1
        else:
            assembly = _merge_parts(parts, wanted, dictionary)
    if processes <= 1:
        parts = [_read_part(primary, twins, wanted, dictionary, max_frames, fast_path, workers, dir_name,
                            identity, limits)]
        assembly = parts[0].assembly
    errors = [DumpFileError(path, problem) for part in parts for path, problem in part.errors]
    skipped = [str(twins[p]) for p in primary if p in twins] + [s for part in parts for s in part.skipped]
    seen = [(rank, path) for part in parts for rank, path in part.seen]
    if not seen:
        table = SCHEMA.empty_table().select([c for c in SCHEMA.names if c in wanted])
    else:
        table = assembly.table(identity)
    if columns is None and not dictionary:
        table = validate(TABLE, table)
    return DumpSet(table=table, ranks=tuple(sorted(rank for rank, _ in seen)), files=tuple(p for _, p in seen),
                   errors=tuple(errors), world_size=assembly.world_size, skipped=tuple(skipped),
                   seconds=time.perf_counter() - started)


def read_dump_file(path: str | os.PathLike[str], *, identity: NodeIdentity | None = None,
                   max_frames: int = DEFAULT_MAX_FRAMES, limits: DumpLimits | None = None) -> pa.Table:
    """One dump file -> conforming `collectives` rows. Raises DumpFileError naming the file."""
    path = Path(path)
    dump = _load_file(path, max_frames, True, limits)
    assembly = _Assembly(columns=set(SCHEMA.names), dictionary=False)
    assembly.add(dump, f"{path.resolve().parent.name}/{path.name}")
    return validate(TABLE, assembly.table(identity))
