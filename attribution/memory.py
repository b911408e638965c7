"""Handing freed memory back to the operating system between the batch pass's attempts.

pandas and numpy free through glibc's malloc, which keeps freed blocks in its arenas (one per thread
that allocated: DuckDB's and Arrow's worker threads each get one), so a long pass's RSS ratchets up
to the sum of its largest attempts' leftovers; Arrow's pool keeps its own. `release_freed_memory`
returns both, once an attempt's frames are dropped, so the next attempt starts from what is really
held.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> None:
    """Return freed heap memory to the operating system (Arrow's pool, then every glibc arena);
    holds nothing.
    """
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
