"""Small inputs without the imports that cost more than their whole analysis: Arrow's compute
kernels (take, cast, dictionary_encode: `pyarrow.compute` is imported on the first call of any)
and `numpy.ma` (numpy 2's `np.unique` imports it to ask whether its input is masked). A 16-rank
job's hang reads a few hundred rows; these imports were a third of `faultlens analyze-hang`'s CPU
there (bench/bench_small_start.py)."""

import sys

import numpy as np
import pyarrow as pa

#: a take of up to this many rows is made of one-row slices (no kernel), while it saves an import:
#: slices cost ~25 us a row of a hang table (~2 us of one column), Arrow's take ~0.14 ms a call
#: once pyarrow.compute is imported, and that import ~48 ms of CPU (measured on the 16-rank NCCL
#: set's table, 2 cores, load ~50)
FEW_ROWS = 64
#: rows a process takes by slicing before the kernel takes over: ~2,000 rows x 25 us is the
#: import's 48 ms, so a run that would have imported it anyway pays at most that once more
SLICED_ROWS_BUDGET = 2_000
_sliced = 0


def compute_imported() -> bool:
    """Whether Arrow's compute kernels are imported in this process (nothing left to save)."""
    return "pyarrow.compute" in sys.modules


def sliced_take(data: pa.Table | pa.ChunkedArray | pa.Array, rows: np.ndarray):
    """take_few where it saves pyarrow.compute's import (not imported yet, few rows, within the
    process' budget); None where Arrow's take should answer."""
    global _sliced
    rows = np.asarray(rows, np.int64)
    if rows.shape[0] > FEW_ROWS or compute_imported():
        return None
    if _sliced + rows.shape[0] > SLICED_ROWS_BUDGET:
        return None
    _sliced += rows.shape[0]  # (threads may race here: the budget is a bound, not a count)
    return take_few(data, rows)


def take_few(data: pa.Table | pa.ChunkedArray | pa.Array, rows: np.ndarray):
    """data.take(rows) for a few rows (the same type and values), one-row slices concatenated;
    None where take must answer (a row out of range: its IndexError; pieces Arrow cannot
    concatenate)."""
    rows = np.asarray(rows, np.int64)
    n = data.num_rows if isinstance(data, pa.Table) else len(data)
    if rows.shape[0] and (int(rows.min()) < 0 or int(rows.max()) >= n):
        return None
    if rows.shape[0] == 0:
        return data.slice(0, 0)
    pieces = [data.slice(i, 1) for i in rows.tolist()]
    try:
        if isinstance(data, pa.Table):
            return pa.concat_tables(pieces).combine_chunks()
        if isinstance(data, pa.ChunkedArray):
            arrays = [chunk for piece in pieces for chunk in piece.chunks]
            return pa.chunked_array([pa.concat_arrays(arrays)], type=data.type)
        return pa.concat_arrays(pieces)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values) of integers (the sorted distinct values, flattened) without numpy.ma."""
    ordered = np.sort(np.asarray(values).ravel())
    if ordered.shape[0] <= 1:
        return ordered
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]]
