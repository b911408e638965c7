"""The collectives table decoded in slices into dense group/rank/op codes (bounded memory at 33 M
rows).
"""

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang import kernels
from faultlens.attribution.detectors.hang.columns import (
    bool_column,
    code_column,
    int_column_raw,
    primitive_values,
    single_chunk,
)
from faultlens.attribution.detectors.hang.kernels import group_codes, remap_codes
from faultlens.attribution.detectors.hang.report import P2P_OP
from faultlens.attribution.detectors.hang.small import distinct
from faultlens.compiled import compile_above

# --------------------------------------------------------------------------------------------------
# analysis


SLICE_ROWS = 1 << 22  # rows decoded at a time: bounds the analysis' own memory on 33 M-row sets
#: tables of fewer rows are analysed by the kernels' plain-Python form (faultlens/compiled.py):
#: importing numba and loading the kernels costs more than their whole work there
COMPILE_ROWS = 20_000
_NO_MASK = np.empty(0, bool)  # remap_codes: every value valid
_SHIFT = 40  # (group, seq) -> group << 40 | seq: sequence ids stay below 2^40


def key_codes(groups: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    return groups.astype(np.int64) * (1 << _SHIFT) + seqs


def key_parts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(groups, seqs) of key codes."""
    return keys >> _SHIFT, keys & ((1 << _SHIFT) - 1)


class _GlobalCodes:
    """One code space for a string column across slices and chunks (dictionary-encoded or plain)."""

    def __init__(self) -> None:
        self.lookup: dict[Any, int] = {}
        self.values: list[Any] = []
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def _remap(self, dictionary: pa.Array) -> np.ndarray:
        key = (
            dictionary.buffers()[1].address if dictionary.buffers()[1] is not None else 0,
            len(dictionary),
        )
        cached = self._cache.get(key)
        if cached is not None and len(cached) == len(dictionary):
            return cached
        table = np.empty(len(dictionary) + 1, np.int32)
        for i, value in enumerate(dictionary.to_pylist()):
            code = self.lookup.get(value)
            if code is None:
                code = self.lookup[value] = len(self.values)
                self.values.append(value)
            table[i] = code
        table[-1] = -1  # index -1 (null) stays -1
        self._cache[key] = table
        return table

    def codes(self, column: pa.ChunkedArray | None, n: int) -> np.ndarray:
        if column is None:
            return np.full(n, -1, np.int32)
        pieces = []
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = chunk.dictionary_encode()
            values, valid = primitive_values(chunk.indices)
            codes, bad = remap_codes(
                values, _NO_MASK if valid is None else valid, self._remap(chunk.dictionary)[:-1]
            )
            if bad:
                raise IndexError(f"dictionary index out of range in {bad} row(s)")
            pieces.append(codes)
        return np.concatenate(pieces) if pieces else np.empty(0, np.int32)


@dataclass
class DecodedSlice:
    """The columns of one slice the analysis needs, as NumPy arrays (global codes)."""

    start: int
    rank: np.ndarray
    group: np.ndarray
    is_entry: np.ndarray
    seq: np.ndarray
    coll: np.ndarray  # an entry of a collective (not p2p) with a sequence id and a group
    p2p: np.ndarray
    op: np.ndarray
    pg_id: np.ndarray
    complete: np.ndarray
    started: np.ndarray
    # seq with nulls as they lie (a view of the table's column where it can be): read at coll rows
    seq_raw: np.ndarray


@dataclass(frozen=True)
class SliceIndex:
    """What the later reads need of a slice's collective entries, kept from its first decode (5
    bytes a row of its own, and views of the table's rank and seq columns: the passes after the
    first read these instead of decoding the slice again)."""

    start: int
    group: np.ndarray  # int32 group code of each row, -1 where it is no collective entry
    # int64 or int32 (the column's width), read only where group >= 0 (elsewhere a null's value as
    # it lies)
    seq: np.ndarray
    rank: np.ndarray  # int32
    complete: np.ndarray  # bool


_STATES = {"scheduled": 0, "started": 1, "completed": 2}


class SliceDecoder:
    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.names = _GlobalCodes()
        self.ids = _GlobalCodes()
        self.descs = _GlobalCodes()
        self.ops = _GlobalCodes()
        self.states = _GlobalCodes()
        self.group_of: dict[tuple[str, Any], int] = {}
        self.group_names: list[str] = []
        # per name code, its group (-1: an empty name) and whether it is empty; per id code, its
        # group (_groups)
        self._name_group: list[int] = []
        self._name_empty: list[bool] = []
        self._id_group: list[int] = []
        # per slice start: the ranks and the groups of its collective entries (sorted codes), noted
        # as a slice is first decoded, so that a later pass after a few ranks or groups decodes only
        # the slices holding them
        self.holds: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.index: dict[int, SliceIndex] = {}  # per slice start, from its first decode (indexed())

    def column(self, part: pa.Table, name: str) -> pa.ChunkedArray | None:
        return part.column(name) if name in part.column_names else None

    def _groups(
        self, name_codes: np.ndarray, id_codes: np.ndarray, is_entry: np.ndarray
    ) -> np.ndarray:
        """Group codes of rows (group_codes), the group of each new name and then of each new id
        numbered as first met (names before ids, as the decode of each slice meets them)."""
        for code in range(len(self._name_group), len(self.names.values)):
            value = self.names.values[code]
            self._name_group.append(
                self.group_of.setdefault(("name", value), len(self.group_of)) if value else -1
            )
            self._name_empty.append(not value)
        for code in range(len(self._id_group), len(self.ids.values)):
            self._id_group.append(
                self.group_of.setdefault(("id", self.ids.values[code]), len(self.group_of))
            )
        return group_codes(
            name_codes,
            id_codes,
            np.asarray(self._name_group, np.int32),
            np.asarray(self._name_empty, bool),
            np.asarray(self._id_group, np.int32),
            is_entry,
        )

    def labels(self) -> list[str]:
        out = [""] * len(self.group_of)
        for (kind, value), code in self.group_of.items():
            out[code] = str(value) if kind == "name" else f"pg_id {value}"
        return out

    def decode(self, start: int, length: int) -> DecodedSlice:
        return self.decode_part(self.table.slice(start, length), start)

    def decode_part(self, part: pa.Table, start: int) -> DecodedSlice:
        """Rows of the table (`part`, its first row at `start`; or rows of the same columns read
        elsewhere) decoded.
        """
        n = part.num_rows
        compile_above(max(start, 0) + n, COMPILE_ROWS)  # plain Python below: numba not loaded
        rank = code_column(single_chunk(part.column("rank")))  # -1 where null
        name_codes = self.names.codes(self.column(part, "pg_name"), n)
        id_codes = self.ids.codes(self.column(part, "pg_id"), n)
        record = self.column(part, "record_id")
        is_entry = np.ones(n, bool)
        if record is not None and record.null_count:
            is_entry = primitive_values(single_chunk(record))[1]
        # status rows (pg_status, record_id null) count only where the dump named their group
        group = self._groups(name_codes, id_codes, is_entry)
        seq, seq_valid, seq_raw = int_column_raw(part.column("collective_seq_id"))
        op = self.ops.codes(self.column(part, "op"), n)
        p2p_op = np.array([bool(P2P_OP.search(str(o))) for o in self.ops.values] + [False], bool)
        p2p = bool_column(self.column(part, "is_p2p"), n) | p2p_op[op]
        state_codes = self.states.codes(self.column(part, "state"), n)
        state_rank = np.array([_STATES.get(str(v), 0) for v in self.states.values] + [0], np.int8)
        state = state_rank[state_codes]
        complete = (state == 2) | bool_column(self.column(part, "retired"), n)
        coll = is_entry & seq_valid & ~p2p & (group >= 0)
        return DecodedSlice(
            start,
            rank,
            group,
            is_entry,
            seq,
            coll,
            p2p & is_entry & (group >= 0),
            op,
            id_codes,
            complete,
            state >= 1,
            seq_raw,
        )

    def _bounds(
        self, ranks: np.ndarray | None, groups: np.ndarray | None
    ) -> Iterator[tuple[int, int]]:
        """(start, stop) of the slices, on the table's own chunk boundaries, each at most SLICE_ROWS
        rows; with `ranks` or `groups`, only those whose collective entries may hold one of them
        (see slices)."""
        bounds = [0]
        for chunk in self.table.column("rank").chunks:
            end = bounds[-1] + len(chunk)
            while end - bounds[-1] > SLICE_ROWS:
                bounds.append(bounds[-1] + SLICE_ROWS)
            if end > bounds[-1]:
                bounds.append(end)
        for start, stop in itertools.pairwise(bounds):
            held = self.holds.get(start)
            if held is not None and (ranks is not None or groups is not None) \
                    and not (ranks is not None and _meets(held[0], ranks)) \
                    and not (groups is not None and _meets(held[1], groups)):
                continue
            yield start, stop

    def slices(
        self, ranks: np.ndarray | None = None, groups: np.ndarray | None = None
    ) -> Iterator[DecodedSlice]:
        """Slices on the table's own chunk boundaries (zero-copy), each at most SLICE_ROWS rows.
        With `ranks` or `groups` (sorted codes): the slices whose collective entries may hold one of
        them (every slice not yet decoded once, and those whose noted ranks or groups meet them);
        the others hold none of their rows."""
        for start, stop in self._bounds(ranks, groups):
            yield self._decode_noted(start, stop)

    def indexed(
        self, ranks: np.ndarray | None = None, groups: np.ndarray | None = None
    ) -> Iterator[SliceIndex]:
        """The index of each slice slices() would give, decoding only those never decoded before."""
        for start, stop in self._bounds(ranks, groups):
            if start not in self.index:
                self._decode_noted(start, stop)
            yield self.index[start]

    def bounds(self) -> list[tuple[int, int]]:
        """(start, stop) of every slice of the table."""
        return list(self._bounds(None, None))

    def _decode_noted(self, start: int, stop: int) -> DecodedSlice:
        """A slice decoded; at its first decode, what it holds and its index are noted."""
        return self.noted(self.decode(start, stop - start))

    def noted(self, part: DecodedSlice) -> DecodedSlice:
        """At a slice's first decode, what it holds and its index are noted."""
        start = part.start
        if start not in self.holds:
            self.holds[start] = (
                present_codes(part.rank[part.coll]),
                present_codes(part.group[part.coll]),
            )
            self.index[start] = SliceIndex(
                start,
                np.where(part.coll, part.group, -1).astype(np.int32),
                part.seq_raw,
                part.rank,
                part.complete,
            )
        return part


def present_codes(codes: np.ndarray) -> np.ndarray:
    """The distinct non-negative codes, sorted (a count per code: no sort of a slice's millions of
    rows).
    """
    codes = codes[codes >= 0]
    if codes.shape[0] == 0:
        return np.empty(0, np.int64)
    # sparse (a hostile rank number): sort instead
    if int(codes.max()) > 4 * codes.shape[0] + (1 << 20):
        return distinct(codes).astype(np.int64)
    return np.flatnonzero(np.bincount(codes))


def member_of(values: np.ndarray, wanted_sorted: np.ndarray) -> np.ndarray:
    """values in wanted_sorted (sorted, unique), as np.isin but without sorting `values` (a slice of
    4 M rows): one compiled pass through a hash set of the wanted values (a binary search per value,
    and its temporaries, cost ~4x more)."""
    if wanted_sorted.shape[0] == 0:
        return np.zeros(values.shape[0], bool)
    return kernels.member_of(
        np.ascontiguousarray(values, np.int64), np.ascontiguousarray(wanted_sorted, np.int64)
    )


def _meets(held: np.ndarray, wanted: np.ndarray) -> bool:
    """Do two sorted code arrays share a value?"""
    return bool(member_of(wanted, held).any())


