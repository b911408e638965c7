"""The chunk buffers' per-dump writes, compiled (numba, no GIL) for the sets the fast path reads:
one call writes a column's rows for a dump (an entry's local string code through the set-wide table,
or an integer column with its validity, status rows null), where the numpy form takes a remap array,
a slice copy and a fill each. Small sets (read by the restricted unpickler) keep the numpy forms in
chunks.py: they must not wait for a numba compile."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def put_mapped(
    column: np.ndarray,
    first: int,
    n: int,
    end: int,
    table: np.ndarray,
    codes: np.ndarray,
    status: int,
) -> None:
    """column[first:first+n] = the set-wide code of each local code (table; -1 and below: -1);
    status rows `status`."""
    size = table.shape[0] - 1  # table[-1] is -1, where a null lands
    for i in range(n):
        code = codes[i]
        column[first + i] = table[code] if 0 <= code < size else -1
    for row in range(first + n, end):
        column[row] = status


@njit(cache=True, nogil=True)
def put_ints(
    column: np.ndarray,
    known: np.ndarray,
    first: int,
    n: int,
    end: int,
    values: np.ndarray,
    valid: np.ndarray,
    nonzero: bool,
) -> None:
    """An integer column's entries and validity (nonzero: a 0 is not valid); status rows null."""
    for i in range(n):
        value = values[i]
        column[first + i] = value
        known[first + i] = valid[i] and (value != 0 or not nonzero)
    for row in range(first + n, end):
        column[row] = 0
        known[row] = False


@njit(cache=True, nogil=True)
def put_by_id(
    column: np.ndarray,
    known: np.ndarray,
    first: int,
    n: int,
    end: int,
    by_id: np.ndarray,
    by_id_known: np.ndarray,
    local_codes: np.ndarray,
) -> None:
    """A per-group value on each entry by its local group code (-1: the last slot); status rows
    null.
    """
    last = by_id.shape[0] - 1
    for i in range(n):
        code = local_codes[i]
        slot = code if 0 <= code < last else last
        column[first + i] = by_id[slot]
        known[first + i] = by_id_known[slot]
    for row in range(first + n, end):
        column[row] = 0
        known[row] = False


@njit(cache=True, nogil=True)
def put_copy(
    column: np.ndarray, first: int, n: int, end: int, values: np.ndarray, status: int
) -> None:
    """Entries' values as they are (flags, list counts: -1 null); status rows `status`."""
    for i in range(n):
        column[first + i] = values[i]
    for row in range(first + n, end):
        column[row] = status


@njit(cache=True, nogil=True)
def put_ts(column: np.ndarray, first: int, n: int, end: int, created: np.ndarray, valid: np.ndarray,
           fallback: int) -> None:
    """ts: an entry's creation time, else (and on status rows) the dump's time."""
    for i in range(n):
        column[first + i] = created[i] if valid[i] else fallback
    for row in range(first + n, end):
        column[row] = fallback


@njit(cache=True, nogil=True)
def first_rows(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct codes in [0, size) (ascending) and the first row of each: np.unique(codes,
    return_index=True) without its sort, for codes of a set-wide dictionary of `size` values."""
    first = np.full(size, -1, np.int64)
    for row in range(codes.shape[0]):
        code = codes[row]
        if 0 <= code < size and first[code] < 0:
            first[code] = row
    count = 0
    for code in range(size):
        if first[code] >= 0:
            count += 1
    distinct = np.empty(count, np.int64)
    rows = np.empty(count, np.int64)
    j = 0
    for code in range(size):
        if first[code] >= 0:
            distinct[j] = code
            rows[j] = first[code]
            j += 1
    return distinct, rows
