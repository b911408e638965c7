"""The chunk being filled: one growing buffer per wanted column, which the assembly writes each
dump's rows into as it comes (its n entry rows, then its status rows), and their build into one
Arrow chunk. Each value is written once, straight into its column: no per-dump pieces are held and
gathered again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.arrow import (
    SetStrings,
    list_from_counts,
    numeric_array,
)
from faultlens.collectors.artifacts.flight_recorder.memory import mapped_empty
from faultlens.collectors.artifacts.flight_recorder.model import (
    INT_COLUMNS,
    TIME_COLUMNS,
    SizesColumn,
)
from faultlens.collectors.artifacts.flight_recorder.shapes import SetShapes, SetStringLists
from faultlens.collectors.sources.source import NodeIdentity

STATUS_COLUMNS = ("pg_last_enqueued", "pg_last_started", "pg_last_completed")
_CODES = ("dump_id", "fr_version", "comm_lib", "op", "state", "pg_desc", "pg_name", "pg_id", "node")
_LISTS = ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "frames")
# kept as codes of their values' dictionaries in dictionary reads (outputs share the inputs'
# dictionaries: a job's output shapes and dtypes are mostly its input ones)
CODED_LISTS = ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes")
_FIRST_CAPACITY = 1 << 16
# integer columns a dictionary read keeps as int32 in a chunk whose values fit (the hang analysis
# reads them in any width: most at a few rows; collective_seq_id's decode keeps a view of it)
NARROW_INTS = ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "timeout_ms")
_NARROW_MAX = 1 << 30  # fits int32 with room: a consumer's seq + 1 never wraps


class ChunkBuffers:
    """The columns of the chunk being filled (the wanted ones, and those another needs: time_created
    for ts, pg_name for the status rows' pg_desc)."""

    def __init__(self, wanted: set[str], compiled: bool = False, coded_lists: bool = False) -> None:
        self.wanted = wanted
        # the writes through fill.py's kernels (sets the fast path reads), else numpy (no numba
        # compile)
        self.fill = _fill() if compiled else None
        # rows a new chunk's buffers hold: small for a small set; after a chunk is built, that
        # chunk's size and an eighth, so that the chunks after the first are written once (outgrown,
        # buffers are copied into twice the room)
        self.first_capacity = _FIRST_CAPACITY
        self.rows = 0
        group_wanted = bool(wanted & {"pg_name", "pg_id"})
        self.codes = [c for c in _CODES if c in wanted or (c == "pg_name" and group_wanted)]
        self.ints = [c for c in (*INT_COLUMNS, *STATUS_COLUMNS, *TIME_COLUMNS) if c in wanted
                     or (c == "time_created" and "ts" in wanted)]
        self.flags = [c for c in ("is_p2p", "retired") if c in wanted]
        # the sizes and dtypes lists as codes of set-wide dictionaries of their values (shapes.py),
        # where the read keeps dictionaries
        self.coded_lists = [c for c in CODED_LISTS if coded_lists and c in wanted]
        self.narrow = [c for c in NARROW_INTS if coded_lists and c in wanted]
        self.lists = [c for c in _LISTS if c in wanted and c not in self.coded_lists]
        # status rows take their group's desc
        self.status_desc = "pg_desc" in wanted and group_wanted
        self._reset()

    def _reset(self) -> None:
        self.first_capacity = max(self.first_capacity, self.rows * 9 // 8)
        self.rows = 0
        self.capacity = 0
        self.values: dict[str, np.ndarray] = {}
        self.valid: dict[str, np.ndarray] = {}
        self.items: dict[str, list[np.ndarray]] = {name: [] for name in self.lists}
        self.inner: dict[str, list[np.ndarray]] = {
            name: [] for name in ("input_sizes", "output_sizes")
        }
        # (row, local pg id): coded when the chunk is built
        self.status_ids: list[tuple[int, str]] = []
        self.nodes: list[tuple[int, int, str | None]] = []  # (first row, end row, node) per dump
        self._grow(self.first_capacity)

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        capacity = max(need, 2 * self.capacity)
        dtypes = {**dict.fromkeys(self.codes, np.int32), **dict.fromkeys(self.ints, np.int64),
                  **dict.fromkeys(self.flags, np.int8), **dict.fromkeys(self.lists, np.int32)}
        if "rank" in self.wanted:
            dtypes["rank"] = np.int32
        for name in self.coded_lists:
            dtypes[name] = np.int32
        if "ts" in self.wanted:
            dtypes["ts"] = np.int64
        for name, dtype in dtypes.items():
            grown = mapped_empty(capacity, dtype)
            if name in self.values:
                grown[:self.rows] = self.values[name][:self.rows]
            self.values[name] = grown
        for name in self.ints:
            grown = mapped_empty(capacity, bool)
            if name in self.valid:
                grown[:self.rows] = self.valid[name][:self.rows]
            self.valid[name] = grown
        self.capacity = capacity

    def take(self, rows: int) -> int:
        """Room for a dump's rows; returns its first row."""
        first = self.rows
        self._grow(first + rows)
        self.rows = first + rows
        return first

    # -- a dump's rows: [first, first + n) entries, [first + n, end) status rows

    def put_value(self, name: str, first: int, end: int, value: int) -> None:
        """One value on every row of the dump (rank, dump_id, ...)."""
        if name in self.values:
            self.values[name][first:end] = value

    def put_codes(self, name: str, first: int, n: int, end: int, entries: np.ndarray | None,
                  status: Sequence[int] | int = -1) -> None:
        """Entries' codes (None: written already, by put_mapped) and the status rows'."""
        if name in self.values:
            column = self.values[name]
            if entries is not None:
                if self.fill is not None and isinstance(status, int) and entries.shape[0] == n:
                    self.fill.put_copy(column, first, n, end, entries, status)
                    return
                column[first:first + n] = entries
            column[first + n:end] = status

    def put_mapped(self, name: str, first: int, n: int, end: int, strings: SetStrings,
                   column_values: Sequence[str], codes: np.ndarray) -> np.ndarray:
        """A dump's local string codes as the set's (strings.remap) on its entries, status rows -1;
        returns the entries' set-wide codes (a view of the column while the dump is added)."""
        if self.fill is None or name not in self.values:
            mapped = strings.remap(column_values, codes)
            self.put_codes(name, first, n, end, mapped)
            return mapped
        column = self.values[name]
        self.fill.put_mapped(column, first, n, end, strings.table(column_values), codes, -1)
        return column[first:first + n]

    def put_ints(
        self,
        name: str,
        first: int,
        n: int,
        end: int,
        values: np.ndarray,
        valid: np.ndarray,
        status: Sequence[int | None] = (),
        nonzero: bool = False,
    ) -> None:
        """Entries' values and validity (nonzero: a 0 is not valid); status rows null (0), or the
        given values where not None."""
        if name not in self.values:
            return
        column, known = self.values[name], self.valid[name]
        if self.fill is not None:
            self.fill.put_ints(column, known, first, n, end, values, valid, nonzero)
        else:
            column[first:first + n] = values
            known[first:first + n] = valid & (values != 0) if nonzero else valid
            column[first + n:end] = 0
            known[first + n:end] = False
        for j, value in enumerate(status):
            if value is not None:
                column[first + n + j] = value
                known[first + n + j] = True

    def put_list(self, name: str, first: int, n: int, end: int, counts: np.ndarray | None,
                 items: np.ndarray | SizesColumn | None = None) -> None:
        """A list column's per-entry counts (None: null on every entry) and items; status rows null.
        """
        if name not in self.values:
            return
        column = self.values[name]
        if self.fill is not None and counts is not None:
            self.fill.put_copy(column, first, n, end, counts, -1)
        else:
            column[first:first + n] = -1 if counts is None else counts
            column[first + n:end] = -1
        if isinstance(items, SizesColumn):
            self.inner[name].append(items.ndims)
            self.items[name].append(items.dims)
        elif items is not None:
            self.items[name].append(items)

    def put_status_ids(self, first: int, ids: Sequence[str | None]) -> None:
        for j, pid in enumerate(ids):
            if pid is not None:
                self.status_ids.append((first + j, pid))

    def put_node(self, first: int, end: int, node: str | None) -> None:
        if "node" in self.values:
            self.nodes.append((first, end, node))

    # -- the Arrow chunk

    def build(self, strings: dict[str, SetStrings], group_desc: dict[str, str],
              identity: NodeIdentity | None,
              vocabularies: Mapping[str, SetShapes | SetStringLists] | None = None) -> pa.Table:
        """The chunk as an Arrow table (in the original reader's column order), and empty buffers
        for the next.
        """
        total = self.rows
        values = {name: column[:total] for name, column in self.values.items()}
        valid = {name: known[:total] for name, known in self.valid.items()}
        if "pg_id" in values:
            ids = values["pg_id"]
            for row, pid in self.status_ids:
                ids[row] = strings["pg_id"].remap([pid], np.zeros(1, np.int32))[0]
        if "node" in values:
            nodes = values["node"]
            for first, end, node in self.nodes:
                node = identity.node if identity and identity.node else node
                nodes[first:end] = (
                    strings["node"].remap([node], np.zeros(1, np.int32))[0] if node else -1
                )
        if self.status_desc:
            self._status_descs(values["pg_desc"], values["pg_name"], strings, group_desc)
        cols: dict[str, pa.Array] = {}
        if "rank" in values:
            cols["rank"] = numeric_array(values["rank"], pa.int32())
        for name in self.codes:
            if name in self.wanted:
                cols[name] = strings[name].array(values[name], True)
        for name in self.ints:
            int_type = _int_type(name in self.narrow, values[name])
            if name in TIME_COLUMNS and int_type == pa.int64():
                # built on its int64 buffer: Array.cast imports pyarrow.compute (more than a
                # small set's whole analysis)
                int_type = pa.timestamp("ns", tz="UTC")
            arr = numeric_array(values[name], int_type, ~valid[name])
            if name in TIME_COLUMNS and arr.type != int_type:
                arr = arr.cast(pa.timestamp("ns", tz="UTC"))
            if name in self.wanted:
                cols[name] = arr
            if name == "time_created" and "ts" in self.wanted:
                cols["ts"] = numeric_array(values["ts"], pa.timestamp("ns", tz="UTC"))
        for name in self.flags:
            flags = values[name]
            cols[name] = numeric_array(flags == 1, pa.bool_(), flags < 0)
        for name in self.coded_lists:
            if vocabularies is None or name not in vocabularies:
                raise ValueError(f"{name} kept as codes: the set's dictionary of its values is "
                                 "needed")
            cols[name] = vocabularies[name].array(values[name])
        for name in self.lists:
            cols[name] = self._list_array(name, values[name], strings)
        self._reset()
        return pa.table(cols)

    @staticmethod
    def _status_descs(descs: np.ndarray, names: np.ndarray, strings: dict[str, SetStrings],
                      group_desc: dict[str, str]) -> None:
        """Rows without a desc take their group's, where the name is known."""
        desc_of_name = {strings["pg_name"].lookup[name]: strings["pg_desc"].lookup[desc]
                        for name, desc in group_desc.items()}
        for row in np.nonzero((descs < 0) & (names >= 0))[0].tolist():
            descs[row] = desc_of_name.get(int(names[row]), -1)

    def _list_array(self, name: str, counts: np.ndarray,
                    strings: dict[str, SetStrings]) -> pa.Array:
        items = self.items[name]
        if name in self.inner:
            ndims = _joined(self.inner[name], np.int32)
            dims = _joined(items, np.int64)
            inner_offsets = mapped_empty(ndims.shape[0] + 1, np.int32)
            np.cumsum(ndims, out=inner_offsets[1:])
            values = pa.ListArray.from_arrays(
                numeric_array(inner_offsets, pa.int32()), numeric_array(dims, pa.int64())
            )
        else:
            values = strings[name].array(_joined(items, np.int32), True)
        return list_from_counts(counts, values)


def _int_type(narrow: bool, values: np.ndarray) -> pa.DataType:
    """int32 where the column may be narrowed and its values (nulls as 0) fit, else int64."""
    if narrow and (values.shape[0] == 0 or (
            int(values.min()) >= -_NARROW_MAX and int(values.max()) <= _NARROW_MAX)):
        return pa.int32()
    return pa.int64()


def _fill() -> ModuleType:
    """fill.py, imported where used: numba loads for the sets the fast path reads only."""
    from faultlens.collectors.artifacts.flight_recorder import fill

    return fill


def _joined(pieces: list[np.ndarray], dtype: type) -> np.ndarray:
    """The pieces end to end, as `dtype` (memory.py: outside numpy's allocator)."""
    out = mapped_empty(sum(piece.shape[0] for piece in pieces), dtype)
    if pieces:
        np.concatenate(pieces, out=out, casting="same_kind")
    return out
