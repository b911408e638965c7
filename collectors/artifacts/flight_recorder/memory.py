"""Arrays of the set's size (the chunks' column buffers and the table-wide pieces) in their own
anonymous mappings, not from numpy's allocator. numpy asks the kernel for transparent huge pages for
every array from 4 MiB on; on a machine whose free memory is fragmented (by the page cache of the
dumps being read) each huge page fault compacts memory first: reading 16,384 ranks, that cost ~0.7
ms of system time a dump (54 s against 29 s, two cores, 8.4 GB of dumps cached). A mapping is
released when its last array goes."""

from __future__ import annotations

import mmap

import numpy as np
import numpy.typing as npt


def mapped_empty(count: int, dtype: npt.DTypeLike) -> np.ndarray:
    """A zeroed, writable, C-contiguous array of `count` items (pages are mapped as they are first
    written).
    """
    dtype = np.dtype(dtype)
    # private (not mmap's default MAP_SHARED, which is shmem: its page faults cost more, and nothing
    # shares these)
    mapping = mmap.mmap(
        -1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    )
    return np.frombuffer(mapping, dtype, count=count)


def mapped_full(count: int, value: int, dtype: npt.DTypeLike) -> np.ndarray:
    out = mapped_empty(count, dtype)
    if value:
        out.fill(value)
    return out
