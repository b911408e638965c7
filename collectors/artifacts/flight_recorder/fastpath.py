"""The fast path: columns straight from the pickle bytes, through the compiled scanner
(faultlens.collectors.artifacts.fr_fastpickle), which fills a tape of nodes and the entry columns in
one pass. Here the tape's small parts (the top level, pg_config, pg_status) are decoded into Python
values and its string nodes into codes. Any doubt returns None, and the restricted unpickler (the
reference) decides."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from faultlens.collectors.artifacts import fr_fastpickle as fast
from faultlens.collectors.artifacts.flight_recorder.model import (
    STRING_FIELDS,
    Dump,
    FastPathDeclined,
    ListColumn,
    SizesColumn,
    StrColumn,
)
from faultlens.collectors.artifacts.flight_recorder.values import as_int, check_top, dump_header
from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits

log = logging.getLogger(__name__)


class _Decoder:
    """Turns tape nodes into Python values (small parts only) and string nodes into codes."""

    def __init__(self, buf: np.ndarray, kind: np.ndarray, ival: np.ndarray, ilen: np.ndarray,
                 links: tuple[np.ndarray, ...], limits: DumpLimits | None = None) -> None:
        limits = limits or default_limits()
        # values decoded (shared references count each time)
        self.left = limits.element_budget(int(buf.shape[0]))
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
        raw = self.raw(node)
        return _long_text(raw) if len(raw) >= _LONG_TEXT else raw.decode("utf-8", "replace")

    def value(self, node: int, depth: int = 0) -> Any:
        self.left -= 1
        if depth > self.max_depth or self.left < 0:
            raise FastPathDeclined("nesting or expansion beyond the limits")
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
            self.text(int(key)) if self.kind[key] == fast.K_STR else self.value(int(key)): {
                "name": self._opt(int(name)),
                "desc": self._opt(int(desc)),
                "ranks": self._opt(int(ranks)),
            }
            for key, name, desc, ranks in cfg.tolist()
        }
        keys = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
        out["pg_status"] = {
            (
                self.text(int(row[0]))
                if self.kind[row[0]] == fast.K_STR
                else self.value(int(row[0]))
            ): dict(zip(keys, row[1:], strict=True))
            for row in status.tolist()
        }
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

    def strings(self, nodes: np.ndarray, workspace: fast.Workspace) -> StrColumn:
        return self.interned(*workspace.intern(nodes))

    def interned(self, codes: np.ndarray, distinct: np.ndarray) -> StrColumn:
        """A string column from its codes and distinct nodes (fr_fastpickle.intern)."""
        texts = [self.text(node) for node in distinct.tolist()]
        if len(set(texts)) == len(texts):
            return StrColumn(codes, texts)
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
        return StrColumn(out, values)


_local = threading.local()
_LONG_TEXT = 4096  # bytes: a group's ranks as pg_config writes them, from a few hundred ranks on
_LONG_TEXTS_KEPT = 256


def _long_text(raw: bytes) -> str:
    """A long string's text, as the same str object as the last one of its length when the bytes are
    the same (compared, never hashed): the default group's ranks (~100 KB at 16,384 ranks) are the
    same in every dump, and the caches keyed by that text (groups.parse_ranks) then hash it once,
    not once a dump. Per thread; bounded."""
    kept: dict[int, tuple[bytes, str]] | None = getattr(_local, "long_texts", None)
    if kept is None or len(kept) >= _LONG_TEXTS_KEPT:
        kept = _local.long_texts = {}
    last = kept.get(len(raw))
    if last is not None and last[0] == raw:
        return last[1]
    text = raw.decode("utf-8", "replace")
    kept[len(raw)] = (raw, text)
    return text


#: nodes of scratch arrays a thread keeps between files (~150 bytes each)
_KEPT_WORKSPACE = 1 << 22


def _workspace() -> fast.Workspace:
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = fast.Workspace()
    return ws


def dump_fast(buf: np.ndarray, path: Path, max_frames: int,
              limits: DumpLimits | None = None) -> Dump | None:
    """Columns straight from the pickle bytes, or None when the scanner declines (then the
    restricted unpickler decides: it is the reference, and gives the error message of a bad file).
    """
    limits = limits or default_limits()
    size = int(buf.shape[0])
    bounds = np.array(
        [limits.max_string_bytes, limits.element_budget(size), limits.entry_budget(size)], np.int64
    )
    workspace = _workspace()
    try:
        result = workspace.parse(buf, max_frames, bounds)
        return _dump_from_tape(workspace, result, buf, path, max_frames, limits)
    except Exception:  # any doubt: the reference decides (and words the error)
        log.debug("fast path declined %s", path, exc_info=True)
        return None
    finally:
        workspace.release()
        if workspace.capacity > _KEPT_WORKSPACE:  # a large file's arrays are not kept for the next
            _local.workspace = None


def _frame_column(decoder: _Decoder, workspace: fast.Workspace, frames: tuple,
                  counts: np.ndarray) -> ListColumn:
    """The frames of every entry as codes into one text per distinct (name, file, line)."""
    name_nodes, file_nodes, lines = frames
    names = decoder.strings(name_nodes, workspace)
    files = decoder.strings(file_nodes, workspace)
    # one text per distinct (name, file, line): vectorised, frames repeat across thousands of
    # entries; keys are composed from dense codes two at a time, so they stay below (frames + 1)^2
    # (no int64 overflow)
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
    return ListColumn(counts, inverse.reshape(-1).astype(np.int32), texts)


def _dump_from_tape(workspace: fast.Workspace, result: tuple, buf: np.ndarray, path: Path,
                    max_frames: int, limits: DumpLimits | None = None) -> Dump | None:
    status, root, kind, ival, ilen, links, _nodes = result[:7]
    if status != fast.OK:
        return None
    (
        (ints, valid, _strs, flags),
        counts,
        sizes,
        _dtypes,
        frames,
        small,
        (codes, distinct),
        groups,
    ) = result[7:]
    decoder = _Decoder(buf, kind, ival, ilen, links, limits)
    top = check_top(decoder.top_fields(small) if small[0] else decoder.top_level(root))
    valid = valid.astype(bool)
    slot = {name: i for i, name in enumerate(fast.INT_FIELDS)}
    int_columns = {
        name: (ints[slot[name]], valid[slot[name]]) for name in fast.INT_FIELDS if name != "pg_id"
    }
    strings = {name: decoder.interned(codes[i], distinct[i])
               for i, name in enumerate(STRING_FIELDS)}
    dtype_columns = {}
    for i, key in enumerate(("input_dtypes", "output_dtypes")):
        column = decoder.interned(codes[4 + i], distinct[4 + i])
        dtype_columns[key] = ListColumn(counts[2 + i], column.codes, column.values)
    frame_column = _frame_column(decoder, workspace, frames, counts[4]) if max_frames > 0 else None
    dump = Dump(
        path=path,
        fmt="pickle",
        rank=-1,
        n=int(ints.shape[1]),
        **dump_header(top),
        ints=int_columns,
        pg_id=(ints[slot["pg_id"]], valid[slot["pg_id"]]),
        is_p2p=flags[0],
        retired=flags[1],
        strings=strings,
        sizes={
            "input_sizes": SizesColumn(counts[0], sizes[0], sizes[1]),
            "output_sizes": SizesColumn(counts[1], sizes[2], sizes[3]),
        },
        dtypes=dtype_columns,
        frames=frame_column,
        pg_groups=groups,
    )
    dump.rank = -1 if top.get("rank") is None else as_int(top.get("rank"), "rank")
    return dump
