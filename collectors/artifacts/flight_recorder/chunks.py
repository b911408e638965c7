"""One Arrow chunk from the parts the assembly holds. Row layout per part: its n entry rows, then its status rows.
A column's per-dump pieces are dropped once it is built, so the peak is about one table, not two."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.arrow import _list_from_counts, _Strings
from faultlens.collectors.artifacts.flight_recorder.model import _INT_COLUMNS, _TIME_COLUMNS, _SizesColumn
from faultlens.collectors.sources.source import NodeIdentity

_STATUS_INDEX = {"pg_last_enqueued": 2, "pg_last_started": 3, "pg_last_completed": 4}  # in a part's status rows


class _ChunkBuilder:
    """The columns of one chunk, built a family at a time (in the table's column order of the original reader)."""

    def __init__(self, parts: list[dict[str, Any]], total: int, strings: dict[str, _Strings], wanted: set[str],
                 group_desc: dict[str, str], identity: NodeIdentity | None) -> None:
        self.parts = parts
        self.total = total
        self.strings = strings
        self.wanted = wanted
        self.group_desc = group_desc
        self.identity = identity
        self.cols: dict[str, Any] = {}
        # per part: (the part, its first row, its entry rows, its entry + status rows)
        self.spans: list[tuple[dict[str, Any], int, int, int]] = []
        pos = 0
        for part in parts:
            n, m = part["n"], part["n"] + len(part["status"])
            self.spans.append((part, pos, n, m))
            pos += m

    def build(self) -> pa.Table:
        self._per_dump_columns()
        self._entry_strings()
        self._groups()
        self._ints()
        self._times()
        self._flags()
        self._lists()
        self._node()
        return pa.table(self.cols)

    # -- helpers

    def _release(self, *names: str) -> None:
        for part in self.parts:
            for name in names:
                part.pop(name, None)

    def _gather_int(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        values = np.zeros(self.total, np.int64)
        valid = np.zeros(self.total, bool)
        for part, pos, n, _m in self.spans:
            v, ok = part[name]
            values[pos:pos + n] = v
            valid[pos:pos + n] = ok
        return values, valid

    def _gather_codes(self, name: str) -> np.ndarray:
        out = np.full(self.total, -1, np.int32)
        for part, pos, n, _m in self.spans:
            out[pos:pos + n] = part[name]
        return out

    def _layout(self, name: str) -> tuple[np.ndarray, list[Any]]:
        """Per-row counts for a list column (status rows null)."""
        counts = np.full(self.total, -1, np.int32)
        for part, pos, n, _m in self.spans:
            value = part.get(name)
            if value is not None:
                counts[pos:pos + n] = value.counts if isinstance(value, _SizesColumn) else value[0]
        return counts, [p.get(name) for p in self.parts]

    # -- the column families

    def _per_dump_columns(self) -> None:
        """rank, dump_id, fr_version, comm_lib: one value per dump on all its rows."""
        if "rank" in self.wanted:
            ranks = np.empty(self.total, np.int32)
            for part, pos, _n, m in self.spans:
                ranks[pos:pos + m] = part["rank"]
            self.cols["rank"] = pa.array(ranks, pa.int32())
        for name in ("dump_id", "fr_version", "comm_lib"):
            if name in self.wanted:
                codes = np.empty(self.total, np.int32)
                for part, pos, _n, m in self.spans:
                    codes[pos:pos + m] = part[name]
                self.cols[name] = self.strings[name].array(codes, True)

    def _entry_strings(self) -> None:
        for name in ("op", "state"):
            if name in self.wanted:
                self.cols[name] = self.strings[name].array(self._gather_codes(name), True)
            self._release(name)
        if "pg_desc" in self.wanted:
            self.cols["pg_desc"] = self.strings["pg_desc"].array(self._gather_codes("pg_desc"), True)

    def _groups(self) -> None:
        """pg_name and pg_id, with the status rows' values; then pg_desc of the status rows by their name."""
        if "pg_name" not in self.wanted and "pg_id" not in self.wanted:
            return
        names = self._gather_codes("pg_name")
        ids = self._gather_codes("pg_id")
        for part, pos, n, _m in self.spans:
            for j, (pid, name_code, *_rest) in enumerate(part["status"]):
                names[pos + n + j] = name_code
                if pid is not None:
                    ids[pos + n + j] = self.strings["pg_id"].remap([pid], np.zeros(1, np.int32))[0]
        if "pg_name" in self.wanted:
            self.cols["pg_name"] = self.strings["pg_name"].array(names, True)
        if "pg_id" in self.wanted:
            self.cols["pg_id"] = self.strings["pg_id"].array(ids, True)
        self._release("pg_name", "pg_id")
        if "pg_desc" in self.wanted:
            self._status_descs(names)

    def _status_descs(self, names: np.ndarray) -> None:
        """Status rows get their group's desc when the name is known."""
        descs = self._gather_codes("pg_desc")
        desc_of_name = {}
        for name, desc in self.group_desc.items():
            desc_of_name[self.strings["pg_name"].lookup[name]] = self.strings["pg_desc"].lookup[desc]
        status_rows = np.nonzero((descs < 0) & (names >= 0))[0]
        for row in status_rows:
            descs[row] = desc_of_name.get(int(names[row]), -1)
        self.cols["pg_desc"] = self.strings["pg_desc"].array(descs, True)
        self._release("pg_desc")

    def _ints(self) -> None:
        for name in [*_INT_COLUMNS, *_STATUS_INDEX]:
            if name in self.wanted:
                values, valid = self._gather_int(name)
                if name in _STATUS_INDEX:
                    index = _STATUS_INDEX[name]
                    for part, pos, n, _m in self.spans:
                        for j, status in enumerate(part["status"]):
                            if status[index] is not None:
                                values[pos + n + j] = status[index]
                                valid[pos + n + j] = True
                self.cols[name] = pa.array(values, pa.int64(), mask=~valid)
                self._release(name)

    def _times(self) -> None:
        for name in _TIME_COLUMNS:
            if name in self.wanted or (name == "time_created" and "ts" in self.wanted):
                values, valid = self._gather_int(name)
                arr = pa.array(values, pa.int64(), mask=~valid).cast(pa.timestamp("ns", tz="UTC"))
                if name in self.wanted:
                    self.cols[name] = arr
                if name == "time_created" and "ts" in self.wanted:
                    self.cols["ts"] = self._ts(values, valid)
            self._release(name)

    def _ts(self, values: np.ndarray, valid: np.ndarray) -> pa.Array:
        """An entry's creation time, else (and on status rows) the dump's time."""
        ts = values.copy()
        for part, pos, n, m in self.spans:
            block = slice(pos, pos + n)
            ts[block] = np.where(valid[block], values[block], part["dump_ts"])
            ts[pos + n:pos + m] = part["dump_ts"]
        return pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC"))

    def _flags(self) -> None:
        for name in ("is_p2p", "retired"):
            if name in self.wanted:
                flags = np.full(self.total, -1, np.int8)
                for part, pos, n, _m in self.spans:
                    flags[pos:pos + n] = part[name]
                self.cols[name] = pa.array(flags == 1, pa.bool_(), mask=flags < 0)
                self._release(name)

    def _lists(self) -> None:
        for name in ("input_sizes", "output_sizes"):
            if name in self.wanted:
                self.cols[name] = self._sizes_array(name)
            self._release(name)
        for name in ("input_dtypes", "output_dtypes", "frames"):
            if name in self.wanted:
                self.cols[name] = self._string_list_array(name)
            self._release(name)

    def _sizes_array(self, name: str) -> pa.Array:
        counts, per_part = self._layout(name)
        ndims = np.concatenate([p.ndims for p in per_part if p is not None] or [np.empty(0, np.int64)])
        dims = np.concatenate([p.dims for p in per_part if p is not None] or [np.empty(0, np.int64)])
        inner_offsets = np.zeros(ndims.shape[0] + 1, np.int32)
        np.cumsum(ndims, out=inner_offsets[1:])
        inner = pa.ListArray.from_arrays(pa.array(inner_offsets), pa.array(dims, pa.int64()))
        return _list_from_counts(counts, inner)

    def _string_list_array(self, name: str) -> pa.Array:
        counts, per_part = self._layout(name)
        codes = np.concatenate([p[1] for p in per_part if p is not None] or [np.empty(0, np.int32)])
        values = self.strings[name].array(codes.astype(np.int32), True)
        return _list_from_counts(counts, values)

    def _node(self) -> None:
        if "node" not in self.wanted:
            return
        codes = np.empty(self.total, np.int32)
        identity = self.identity
        for part, pos, _n, m in self.spans:
            node = identity.node if identity and identity.node else part["node"]
            codes[pos:pos + m] = self.strings["node"].remap([node], np.zeros(1, np.int32))[0] if node else -1
        self.cols["node"] = self.strings["node"].array(codes, True)
