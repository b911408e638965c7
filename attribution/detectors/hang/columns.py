"""Arrow columns as NumPy arrays (nulls filled), decoded lazily where a pass may not need them."""


import numpy as np
import pyarrow as pa

# ---------------------------------------------------------------------------------------------------------------
# columns


def int_column(column: pa.ChunkedArray, fill: int = -1) -> tuple[np.ndarray, np.ndarray]:
    if pa.types.is_timestamp(column.type):  # ns since the epoch, whatever the store's unit
        column = column.cast(pa.timestamp("ns", tz=column.type.tz)).cast(pa.int64())
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not array.null_count:  # (no copy to fill nulls)
        return array.to_numpy(zero_copy_only=False).astype(np.int64, copy=False), np.ones(len(array), bool)
    valid = ~array.is_null().to_numpy(zero_copy_only=False)
    values = array.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return values, valid


def take_rows(data: pa.Table | pa.ChunkedArray, rows: np.ndarray) -> pa.Table | pa.ChunkedArray:
    """data.take(rows), chunk by chunk: Arrow's take of a chunked column concatenates every chunk first (a copy of
    the whole column: ~0.5 s for a list column of 8 M rows, for any number of rows taken)."""
    rows = np.asarray(rows, np.int64)
    column = data.column(0) if isinstance(data, pa.Table) and data.num_columns else data
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if len(chunks) <= 1 or rows.shape[0] == 0:
        return data.take(pa.array(rows))
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    offsets = np.cumsum([0] + [len(c) for c in chunks])
    which = np.searchsorted(offsets, ordered, side="right") - 1
    bounds = np.searchsorted(which, np.arange(len(chunks) + 1))
    pieces = [data.slice(int(offsets[c]), int(offsets[c + 1] - offsets[c])).take(
        pa.array(ordered[bounds[c]:bounds[c + 1]] - offsets[c])) for c in range(len(chunks))
        if bounds[c + 1] > bounds[c]]
    taken = pa.concat_tables(pieces) if isinstance(data, pa.Table) else pa.chunked_array(
        [chunk for piece in pieces for chunk in piece.chunks], type=data.type)
    if np.all(order[1:] > order[:-1]):
        return taken
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0])
    return taken.take(pa.array(inverse))


class LazyColumn:
    """An int64 column read only at the rows asked for (time_created, record_id: needed for a few rows; a full
    copy of 33 M rows would cost 260 MB each)."""

    def __init__(self, table: pa.Table, name: str) -> None:
        self.column = table.column(name) if name in table.column_names else None

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows, np.int64)
        if self.column is None or rows.shape[0] == 0:
            return np.zeros(rows.shape[0], np.int64), np.zeros(rows.shape[0], bool)
        return int_column(take_rows(self.column, rows))


def bool_column(column: pa.ChunkedArray | None, n: int) -> np.ndarray:
    if column is None:
        return np.zeros(n, bool)
    filled = column.fill_null(False) if column.null_count else column
    return filled.to_numpy(zero_copy_only=False).astype(bool, copy=False)


