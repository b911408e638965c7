"""Compiled helpers for the hang analysis: per-row signatures of list columns without Python
objects, and the decode of a slice's codes.

A 16,384-rank dump set has ~33 M entries; hashing their shapes and dtypes through Python lists would
take minutes. These kernels read the Arrow offsets and values buffers directly (numba, no GIL), in
one pass where NumPy would make a temporary array per step.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang import small
from faultlens.attribution.detectors.hang.columns import filled_values, validity
from faultlens.compiled import kernel

_MULT = np.uint64(0x9E3779B97F4A7C15)
_SEED = np.uint64(0x243F6A8885A308D3)


@kernel(cache=True, nogil=True)
def _mix(h, v):
    h ^= np.uint64(v) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(31)
    return h


@kernel(cache=True, nogil=True)
def _nested_hash(rows, valid, outer, inner, values):
    out = np.zeros(rows.shape[0], np.uint64)
    for i in range(rows.shape[0]):
        row = rows[i]
        if not valid[row]:
            continue
        h = np.uint64(0x243F6A8885A308D3)
        o0 = outer[row]
        o1 = outer[row + 1]
        h = _mix(h, o1 - o0)
        for t in range(o0, o1):
            i0 = inner[t]
            i1 = inner[t + 1]
            h = _mix(h, i1 - i0 + 1000003)
            for j in range(i0, i1):
                h = _mix(h, values[j])
        out[i] = h
    return out


@kernel(cache=True, nogil=True)
def _flat_hash(rows, valid, offsets, codes):
    out = np.zeros(rows.shape[0], np.uint64)
    for i in range(rows.shape[0]):
        row = rows[i]
        if not valid[row]:
            continue
        h = np.uint64(0x13198A2E03707344)
        o0 = offsets[row]
        o1 = offsets[row + 1]
        h = _mix(h, o1 - o0)
        for j in range(o0, o1):
            h = _mix(h, codes[j] + 7)
        out[i] = h
    return out


def _single(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        if pa.types.is_dictionary(getattr(column.type, "value_type", pa.null())):
            column = column.cast(pa.list_(pa.string()))
        return column.combine_chunks()
    return column


def _filled(array: pa.Array, fill: int) -> np.ndarray:
    """An integer array's values with nulls as `fill` (zero-copy where it has none: the children of
    a slice's list columns hold millions of values)."""
    return filled_values(array, fill)


def _list_of_lists_hash(array: pa.Array, rows: np.ndarray) -> np.ndarray:
    inner = array.values
    values = _filled(inner.values, -1).astype(np.int64, copy=False)
    return _nested_hash(
        rows, validity(array), filled_values(array.offsets), filled_values(inner.offsets), values
    )


@kernel(cache=True, nogil=True)
def _take_signatures(values_sig, indices, rows):
    """values_sig[indices[row]] for each row (0 where the index is null: -1)."""
    out = np.zeros(rows.shape[0], np.uint64)
    for i in range(rows.shape[0]):
        code = indices[rows[i]]
        if 0 <= code < values_sig.shape[0]:
            out[i] = values_sig[code]
    return out


def row_signatures(sizes: pa.ChunkedArray | None, dtypes: pa.ChunkedArray | None,
                   rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint64 signatures of input_sizes (list<list<int>>) and input_dtypes (list<str>), or
    dictionaries of those values as a dictionary read keeps them, for the given rows (0 where the
    column is absent or null); comparable within one table (a sizes value's signature is the same in
    either form)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    size_sig = np.zeros(rows.shape[0], np.uint64)
    dtype_sig = np.zeros(rows.shape[0], np.uint64)
    if sizes is not None and rows.shape[0]:
        array = _single(sizes)
        # a reader's shapes dictionary: each distinct value hashed once
        if pa.types.is_dictionary(array.type):
            values_sig = _list_of_lists_hash(
                array.dictionary, np.arange(len(array.dictionary), dtype=np.int64)
            )
            size_sig = _take_signatures(
                values_sig, _filled(array.indices, -1).astype(np.int64, copy=False), rows
            )
        else:
            size_sig = _list_of_lists_hash(array, rows)
    if dtypes is not None and rows.shape[0]:
        array = _single(dtypes)
        # a reader's dictionary of the lists: each hashed once
        if pa.types.is_dictionary(array.type):
            values = array.dictionary
            values_sig = _string_lists_hash(values, np.arange(len(values), dtype=np.int64))
            dtype_sig = _take_signatures(
                values_sig, _filled(array.indices, -1).astype(np.int64, copy=False), rows
            )
        else:
            dtype_sig = _string_lists_hash(array, rows)
    return size_sig, dtype_sig


def _string_lists_hash(array: pa.Array, rows: np.ndarray) -> np.ndarray:
    """Signatures of list<string> (or list<dictionary<string>>) rows, from their strings' codes:
    comparable within one array (the codes are its own)."""
    child = array.values
    if pa.types.is_dictionary(child.type):
        codes = _filled(child.indices, -1)
    elif len(child) <= PLAIN_ENCODE_MAX and not small.compute_imported():
        codes = first_seen_codes(child.to_pylist())
    else:
        codes = _filled(child.dictionary_encode().indices, -1)
    return _flat_hash(rows, validity(array), filled_values(array.offsets), codes)


#: strings encoded by plain Python up to this many while pyarrow.compute is not imported (a
#: reader's dictionary of dtype lists holds a few dozen): Arrow's dictionary_encode imports it
#: (~48 ms of CPU); plain Python costs ~0.05 us a string more (~3 ms at this bound)
PLAIN_ENCODE_MAX = 65_536


def first_seen_codes(values: list) -> np.ndarray:
    """int32 codes in order of first appearance, -1 for a null: what dictionary_encode's indices
    give."""
    seen: dict = {}
    return np.array(
        [-1 if v is None else seen.setdefault(v, len(seen)) for v in values], np.int32
    )


@kernel(cache=True, nogil=True)
def combine_signatures(a, b, c):
    """One uint64 per row from three (op, sizes, dtypes), for a single group-by."""
    out = np.empty(a.shape[0], np.uint64)
    for i in range(a.shape[0]):
        out[i] = _mix(_mix(_mix(np.uint64(0x452821E638D01377), a[i]), b[i]), c[i])
    return out


@kernel(cache=True, nogil=True)
def remap_codes(values, valid, table):
    """table[values] as int32, -1 where not valid (an empty `valid`: all are) or out of the table;
    returns (codes, count of values out of it)."""
    out = np.empty(values.shape[0], np.int32)
    bad = 0
    check = valid.shape[0] > 0
    for i in range(values.shape[0]):
        if check and not valid[i]:
            out[i] = -1
            continue
        v = values[i]
        if v < 0 or v >= table.shape[0]:
            out[i] = -1
            bad += 1
        else:
            out[i] = table[v]
    return out, bad


@kernel(cache=True, nogil=True)
def group_codes(name_codes, id_codes, name_group, name_empty, id_group, is_entry):
    """Each row's group: by its name, else (no name) by its local pg id; -1 for a status row (not an
    entry) whose name is missing or empty (it names no group). Codes -1 (null) index nothing."""
    out = np.empty(name_codes.shape[0], np.int32)
    for i in range(name_codes.shape[0]):
        n = name_codes[i]
        g = name_group[n] if n >= 0 else -1
        if g < 0:
            d = id_codes[i]
            g = id_group[d] if d >= 0 else -1
        if not is_entry[i] and (n < 0 or name_empty[n]):
            g = -1
        out[i] = g
    return out


@kernel(cache=True, nogil=True)
def member_of(values, wanted):
    """values[i] in wanted (int64, distinct) for each i, through an open-addressing set of the
    wanted values.
    """
    size = 16
    bits = 4
    while size < 2 * wanted.shape[0]:
        size *= 2
        bits += 1
    mask = size - 1
    shift = np.uint64(64 - bits)
    slots = np.empty(size, np.int64)
    used = np.zeros(size, np.bool_)
    for j in range(wanted.shape[0]):
        v = wanted[j]
        slot = np.int64((np.uint64(v) * np.uint64(0x9E3779B97F4A7C15)) >> shift) & mask
        while used[slot] and slots[slot] != v:
            slot = (slot + 1) & mask
        used[slot] = True
        slots[slot] = v
    out = np.zeros(values.shape[0], np.bool_)
    for i in range(values.shape[0]):
        v = values[i]
        slot = np.int64((np.uint64(v) * np.uint64(0x9E3779B97F4A7C15)) >> shift) & mask
        while used[slot]:
            if slots[slot] == v:
                out[i] = True
                break
            slot = (slot + 1) & mask
    return out
