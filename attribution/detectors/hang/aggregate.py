"""Pass-1 aggregates in compiled code: progress per (group, rank) and collective signatures per
(group, seq), kept in open-addressing hash tables across the table's slices (numba, no GIL).

A 16,384-rank set has ~33 M rows and ~4 M (group, seq) keys: an Arrow group-by per slice, then
another over the concatenated parts, cost ~4 s of the analysis' 8; these tables are filled in one
pass over each slice's rows and never merged. Keys come out in first-seen order (the order of the
rows), as the group-bys gave them.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.columns import int_array
from faultlens.attribution.detectors.hang.decode import key_parts
from faultlens.compiled import kernel

_MULT = np.uint64(0x9E3779B97F4A7C15)
_INT_MIN = np.iinfo(np.int64).min
_INT_MAX = np.iinfo(np.int64).max
_UINT_MAX = np.iinfo(np.uint64).max


@kernel(cache=True, nogil=True)
def _find(keys, used, shift, key):
    """The slot holding `key`, else the free slot where it goes (linear probing; the table is at
    most half full).
    """
    mask = keys.shape[0] - 1
    slot = np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))
    while used[slot]:
        if keys[slot] == key:
            return slot
        slot = (slot + 1) & mask
    return slot


@kernel(cache=True, nogil=True)
def _rehash(keys, used, new_keys, new_used, new_shift):
    """Every used slot's key into the new (empty, larger) table; returns old slot -> new slot (-1:
    unused).
    """
    moved = np.full(keys.shape[0], -1, np.int64)
    for i in range(keys.shape[0]):
        if used[i]:
            slot = _find(new_keys, new_used, new_shift, keys[i])
            new_keys[slot] = keys[i]
            new_used[slot] = 1
            moved[i] = slot
    return moved


class _KeyTable:
    """Slots of int64 keys with value arrays beside them, grown (and rehashed) before they are half
    full; `order` holds the slots in insertion order."""

    def __init__(self, values: dict[str, tuple[type, int]], capacity: int = 1 << 12) -> None:
        self._spec = values
        self.count = 0
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.keys = np.zeros(capacity, np.int64)
        self.used = np.zeros(capacity, np.int8)
        self.order = np.empty(capacity // 2 + 1, np.int64)
        self.shift = 64 - (capacity.bit_length() - 1)
        self.values = {
            name: np.full(capacity, init, dtype) for name, (dtype, init) in self._spec.items()
        }

    @property
    def limit(self) -> int:
        """Keys the table takes before it must grow."""
        return self.keys.shape[0] // 2

    def grow(self) -> None:
        old_keys, old_used, old_values, old_order = self.keys, self.used, self.values, self.order
        self._allocate(old_keys.shape[0] * 4)
        moved = _rehash(old_keys, old_used, self.keys, self.used, self.shift)
        taken = np.flatnonzero(old_used)
        for name, array in old_values.items():
            self.values[name][moved[taken]] = array[taken]
        self.order[:self.count] = moved[old_order[:self.count]]

    def slots(self) -> np.ndarray:
        """The used slots in insertion order."""
        return self.order[:self.count]


@kernel(cache=True, nogil=True)
def _add_progress(
    keys,
    used,
    order,
    count,
    limit,
    shift,
    group_of,
    rank_of,
    s_max,
    inc_min,
    inc_max,
    started_max,
    complete_max,
    d_min,
    group,
    rank,
    seq,
    coll,
    complete,
    started,
    desc,
    collectives,
    start,
):
    """Rows start.. of a slice in a named group (group >= 0), its collective entries (collectives)
    or its other rows (not collectives: only the desc counts), into the (group, rank) table; returns
    (next row, keys) when the table is at its limit, else (rows, keys)."""
    n = group.shape[0]
    i = start
    while i < n:
        g = group[i]
        if g < 0 or coll[i] != collectives:
            i += 1
            continue
        key = (np.int64(g) << 32) | (np.int64(rank[i]) & 0xFFFFFFFF)
        slot = _find(keys, used, shift, key)
        s = seq[i]
        if not used[slot]:
            if count >= limit:
                return i, count
            used[slot] = 1
            keys[slot] = key
            group_of[slot] = g
            rank_of[slot] = rank[i]
            s_max[slot] = s
            order[count] = slot
            count += 1
        d = desc[i]
        if d >= 0 and d < d_min[slot]:
            d_min[slot] = d
        if collectives:
            if s > s_max[slot]:
                s_max[slot] = s
            if complete[i]:
                if s > complete_max[slot]:
                    complete_max[slot] = s
            else:
                if s < inc_min[slot]:
                    inc_min[slot] = s
                if s > inc_max[slot]:
                    inc_max[slot] = s
            if started[i] and s > started_max[slot]:
                started_max[slot] = s
        i += 1
    return n, count


class ProgressTable:
    """Per (group, rank): over its collective entries, the highest sequence id entered, the lowest
    and highest not completed, the highest started and completed, and the group's desc code
    (`progress`); over its other named rows (status rows, p2p entries), the desc code (`seen`). Each
    in its own table, keys in first-seen order of its rows."""

    _SPEC: ClassVar[dict[str, tuple[type, int]]] = {
        "group": (np.int32, -1),
        "rank": (np.int32, -1),
        "s_max": (np.int64, 0),
        "inc_min": (np.int64, _INT_MAX),
        "inc_max": (np.int64, _INT_MIN),
        "started_max": (np.int64, _INT_MIN),
        "complete_max": (np.int64, _INT_MIN),
        "d_min": (np.int32, np.iinfo(np.int32).max),
    }

    def __init__(self) -> None:
        self.collectives = _KeyTable(self._SPEC)
        self.others = _KeyTable(self._SPEC)

    def add(
        self,
        group: np.ndarray,
        rank: np.ndarray,
        seq: np.ndarray,
        coll: np.ndarray,
        complete: np.ndarray,
        started: np.ndarray,
        desc: np.ndarray,
    ) -> None:
        """One slice's rows (group -1: not in a named group, skipped)."""
        for t, collectives in ((self.collectives, True), (self.others, False)):
            start = 0
            while True:
                v = t.values
                start, t.count = _add_progress(
                    t.keys,
                    t.used,
                    t.order,
                    t.count,
                    t.limit,
                    t.shift,
                    v["group"],
                    v["rank"],
                    v["s_max"],
                    v["inc_min"],
                    v["inc_max"],
                    v["started_max"],
                    v["complete_max"],
                    v["d_min"],
                    group,
                    rank,
                    seq,
                    coll,
                    complete,
                    started,
                    desc,
                    collectives,
                    start,
                )
                if start >= group.shape[0]:
                    break
                t.grow()

    def progress(self) -> pa.Table:
        """The (group, rank) pairs with collective entries: g, r, s_max_max, s_incomplete_min_min,
        s_incomplete_max_max, s_started_max_max, s_complete_max_max, d_min_min (null where nothing
        counted)."""
        slots = self.collectives.slots()
        v = self.collectives.values
        inc_min, inc_max = v["inc_min"][slots], v["inc_max"][slots]
        started, done = v["started_max"][slots], v["complete_max"][slots]
        desc = v["d_min"][slots]
        has_inc = inc_min <= inc_max  # both set together
        return pa.table({
            "g": int_array(v["group"][slots]), "r": int_array(v["rank"][slots]),
            "s_max_max": int_array(v["s_max"][slots]),
            "s_incomplete_min_min": int_array(inc_min, ~has_inc),
            "s_incomplete_max_max": int_array(inc_max, ~has_inc),
            "s_started_max_max": int_array(started, started == _INT_MIN),
            "s_complete_max_max": int_array(done, done == _INT_MIN),
            "d_min_min": int_array(desc, desc == np.iinfo(np.int32).max)})

    def seen(self) -> pa.Table:
        """The (group, rank) pairs with other named rows: g, r, d_min_min."""
        slots = self.others.slots()
        v = self.others.values
        desc = v["d_min"][slots]
        return pa.table({"g": int_array(v["group"][slots]), "r": int_array(v["rank"][slots]),
                         "d_min_min": int_array(desc, desc == np.iinfo(np.int32).max)})


@kernel(cache=True, nogil=True)
def _find_row(table, used, shift, key):
    """_find on a table whose rows are (key, ...)."""
    mask = table.shape[0] - 1
    slot = np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))
    while used[slot]:
        if np.int64(table[slot, 0]) == key:
            return slot
        slot = (slot + 1) & mask
    return slot


@kernel(cache=True, nogil=True)
def _add_signatures(table, used, order, count, limit, shift, rows, group, seq, sig, start):
    """Rows rows[start:] (collective entries) into a (key, lowest, highest signature) table, as
    _add_progress.
    """
    i = start
    while i < rows.shape[0]:
        row = rows[i]
        key = (np.int64(group[row]) << 40) + seq[row]  # decode.key_codes
        slot = _find_row(table, used, shift, key)
        s = sig[i]
        if not used[slot]:
            if count >= limit:
                return i, count
            used[slot] = 1
            table[slot, 0] = np.uint64(key)
            table[slot, 1] = s
            table[slot, 2] = s
            order[count] = slot
            count += 1
        else:
            if s < table[slot, 1]:
                table[slot, 1] = s
            if s > table[slot, 2]:
                table[slot, 2] = s
        i += 1
    return rows.shape[0], count


@kernel(cache=True, nogil=True)
def _merge_signatures(table, used, order, count, limit, shift, source, slots, start):
    """The rows source[slots[start:]] of another such table into this one, in that order, as
    _add_signatures.
    """
    i = start
    while i < slots.shape[0]:
        other = slots[i]
        key = np.int64(source[other, 0])
        slot = _find_row(table, used, shift, key)
        if not used[slot]:
            if count >= limit:
                return i, count
            used[slot] = 1
            table[slot, 0] = source[other, 0]
            table[slot, 1] = source[other, 1]
            table[slot, 2] = source[other, 2]
            order[count] = slot
            count += 1
        else:
            if source[other, 1] < table[slot, 1]:
                table[slot, 1] = source[other, 1]
            if source[other, 2] > table[slot, 2]:
                table[slot, 2] = source[other, 2]
        i += 1
    return slots.shape[0], count


@kernel(cache=True, nogil=True)
def _first_differing(table, order, count, at_most):
    """The keys of the first `at_most` used slots (insertion order) whose lowest and highest
    signatures differ.
    """
    out = np.empty(max(0, min(at_most, count)), np.int64)
    found = 0
    for i in range(count):
        if found >= out.shape[0]:
            break
        slot = order[i]
        if table[slot, 1] != table[slot, 2]:
            out[found] = np.int64(table[slot, 0])
            found += 1
    return out[:found]


class _Signatures:
    """Rows (key, lowest signature, highest signature) in one array (one cache line per key looked
    up), grown before half full; `order` holds the used slots in insertion order."""

    def __init__(self, capacity: int) -> None:
        capacity = 1 << max(10, (capacity - 1).bit_length())
        self.table = np.zeros((capacity, 3), np.uint64)
        self.used = np.zeros(capacity, np.int8)
        self.order = np.empty(capacity // 2 + 1, np.int64)
        self.shift = 64 - (capacity.bit_length() - 1)
        self.count = 0

    @property
    def limit(self) -> int:
        return self.table.shape[0] // 2

    def add_rows(
        self, rows: np.ndarray, group: np.ndarray, seq: np.ndarray, signatures: np.ndarray
    ) -> None:
        start = 0
        while True:
            start, self.count = _add_signatures(
                self.table,
                self.used,
                self.order,
                self.count,
                self.limit,
                self.shift,
                rows,
                group,
                seq,
                signatures,
                start,
            )
            if start >= rows.shape[0]:
                return
            self.grow(4 * self.table.shape[0])

    def add_table(self, other: _Signatures) -> None:
        slots = other.slots()
        start = 0
        while True:
            start, self.count = _merge_signatures(
                self.table,
                self.used,
                self.order,
                self.count,
                self.limit,
                self.shift,
                other.table,
                slots,
                start,
            )
            if start >= slots.shape[0]:
                return
            self.grow(4 * self.table.shape[0])

    def grow(self, capacity: int) -> None:
        """Rehashed into `capacity` slots (insertion order kept)."""
        old = _Signatures(capacity)
        self.table, old.table = old.table, self.table
        self.used, old.used = old.used, self.used
        self.order, old.order = old.order, self.order
        self.shift, old.shift = old.shift, self.shift
        old.count, self.count = self.count, 0
        self.add_table(old)

    def clear(self) -> None:
        self.used[:] = 0
        self.count = 0

    def slots(self) -> np.ndarray:
        return self.order[:self.count]


class SignatureTable:
    """Per (group, seq) key: the lowest and highest signature of its ranks' entries (op, sizes,
    dtypes). A slice's rows go into a slice-sized table first (it stays in cache; the ranks of a
    group sit close together, so it holds several times fewer keys than rows), and that into the
    set's: one random access per key, not per row. The set's table is sized once from the keys of
    the first slices and the rows to come (`rows`: the table's), not grown step by step (each step
    rehashes every key)."""

    def __init__(self, rows: int = 0) -> None:
        self.rows_total = rows
        self.rows_seen = 0
        self.table = _Signatures(1 << 12)
        self._slice = _Signatures(1 << 12)

    def add(self, rows: np.ndarray, group: np.ndarray, seq: np.ndarray, signatures: np.ndarray,
            slice_rows: int = 0) -> None:
        """The signatures of a slice's rows `rows` (one per row, in that order); slice_rows: the
        slice's length.
        """
        local = self._slice
        local.clear()
        local.add_rows(rows, group, seq, signatures)
        self.rows_seen += slice_rows
        if self.rows_seen and self.rows_total > self.rows_seen:
            projected = (self.table.count + local.count) * self.rows_total // self.rows_seen
            if projected > self.table.limit:
                self.table.grow(2 * projected + (projected >> 2))
        self.table.add_table(local)

    def differing(self, at_most: int) -> list[tuple[int, int]]:
        """The first `at_most` (group, seq) keys, in first-seen order, whose signatures differ."""
        # a scan in insertion order that stops at `at_most` (a gather of every key's row was ~0.4 GB
        # at 16,384 ranks)
        keys = _first_differing(self.table.table, self.table.order, self.table.count, at_most)
        groups, seqs = key_parts(keys)
        return list(zip(groups.tolist(), seqs.tolist(), strict=True))
