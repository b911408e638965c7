"""Arrow columns as NumPy arrays (nulls filled), decoded lazily where a pass may not need them."""


import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.small import sliced_take

# --------------------------------------------------------------------------------------------------
# columns


def single_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one array (no copy where it has one chunk)."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def primitive_values(array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """A fixed-width array's values as a (read-only) view of its buffer, nulls left as they lie, and
    its validity (None where it has no null): no copy, no fill (Arrow's fill_null copies the whole
    array)."""
    buffers = array.buffers()
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(buffers[1], np.uint8)
        count = array.offset + len(array)
        values = np.unpackbits(bits, bitorder="little", count=count)[array.offset :].view(bool)
    else:  # the buffer itself (Array.to_numpy imports pandas, 0.15-0.6 s, on its first call)
        dtype = np.dtype(np.int64) if pa.types.is_timestamp(array.type) else np.dtype(
            array.type.to_pandas_dtype()
        )
        values = np.frombuffer(buffers[1], dtype, count=array.offset + len(array))[array.offset :]
    if not array.null_count:
        return values, None
    bits = np.frombuffer(buffers[0], np.uint8)
    valid = np.unpackbits(bits, bitorder="little", count=array.offset + len(array))[
        array.offset :
    ].view(bool)
    return values, valid


def validity(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Where a column is not null, from its validity bitmap (Array.is_null().to_numpy() imports
    pandas)."""
    array = single_chunk(column)
    if array.null_count == 0:
        return np.ones(len(array), bool)
    bits = np.frombuffer(array.buffers()[0], np.uint8)
    count = array.offset + len(array)
    return np.unpackbits(bits, bitorder="little", count=count)[array.offset :].view(bool)


def filled_values(column: pa.ChunkedArray | pa.Array, fill: int | None = None) -> np.ndarray:
    """An integer column's values in its own width, nulls as `fill`: `fill_null(fill).to_numpy()`
    without pyarrow's pandas path (fill None: a column with nulls goes through to_numpy)."""
    array = single_chunk(column)
    plain = pa.types.is_integer(array.type) and (len(array) == 0 or array.buffers()[1] is not None)
    if not plain:  # (an all-null array may have no data buffer)
        return (array.fill_null(fill) if fill is not None else array).to_numpy(
            zero_copy_only=False
        )
    if len(array) == 0:
        return np.empty(0, array.type.to_pandas_dtype())
    values, valid = primitive_values(array)
    if valid is None:
        return values
    if fill is None:
        return array.to_numpy(zero_copy_only=False)
    return np.where(valid, values, values.dtype.type(fill))


def int_array(values: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    """A NumPy integer array as an Arrow array of its width, null where `null` is True, on its
    buffers (pa.array and pa.table of NumPy arrays import pandas)."""
    values = np.ascontiguousarray(values)
    nulls = int(np.count_nonzero(null)) if null is not None else 0
    bitmap = None
    if nulls:
        bitmap = pa.py_buffer(np.packbits(~np.asarray(null, bool), bitorder="little"))
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(values.dtype),
        values.shape[0],
        [bitmap, pa.py_buffer(values)],
        null_count=nulls,
    )


def valid_rows(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The rows (int64, ascending) where a column is not null, from its validity bitmaps: only the
    bytes with a set bit are expanded (pg_ranks is set on a few thousand of millions of rows: a
    boolean array of every row was ~0.2 s at 16,384 ranks)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[np.ndarray] = []
    base = 0
    for chunk in chunks:
        n = len(chunk)
        if chunk.null_count == 0:
            out.append(np.arange(base, base + n, dtype=np.int64))
        elif chunk.null_count < n:
            bits = np.frombuffer(chunk.buffers()[0], np.uint8, count=(chunk.offset + n + 7) // 8)
            marked = np.flatnonzero(bits)
            expanded = np.unpackbits(bits[marked][:, None], axis=1, bitorder="little")
            rows = (marked[:, None] * 8 + np.arange(8))[expanded.view(bool)] - chunk.offset
            out.append(rows[(rows >= 0) & (rows < n)] + base)
        base += n
    return np.concatenate(out) if out else np.empty(0, np.int64)


def int_column(column: pa.ChunkedArray | pa.Array, fill: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """An integer (or timestamp) column as int64 values with nulls as `fill`, and its validity."""
    filled, valid, _ = int_column_raw(column, fill)
    return filled, valid


def int_column_raw(column: pa.ChunkedArray | pa.Array,
                   fill: int = -1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int_column, and the values with nulls as they lie, in the column's own width (a view of the
    column's buffer where it is one chunk: what is kept of a column long after its decode then
    costs no memory of its own; a dictionary read keeps collective_seq_id as int32 where it
    fits)."""
    # ns since the epoch, whatever the store's unit (ns already: its int64 buffer as it is, no
    # cast: a cast imports pyarrow.compute)
    if pa.types.is_timestamp(column.type) and column.type.unit != "ns":
        column = column.cast(pa.timestamp("ns", tz=column.type.tz)).cast(pa.int64())
    array = single_chunk(column)
    if len(array) == 0:
        return np.empty(0, np.int64), np.empty(0, bool), np.empty(0, np.int64)
    raw, valid = primitive_values(array)
    values = raw.astype(np.int64, copy=False)
    if valid is None:
        return values, np.ones(len(array), bool), raw
    return np.where(valid, values, fill), valid, raw


def code_column(array: pa.Array) -> np.ndarray:
    """An integer array (a dictionary's indices) as int32 values, -1 where null."""
    if len(array) == 0:
        return np.empty(0, np.int32)
    values, valid = primitive_values(array)
    values = values.astype(np.int32, copy=False)
    return values if valid is None else np.where(valid, values, np.int32(-1))


def row_indices(rows: np.ndarray) -> pa.Array:
    """Row numbers as an Arrow int64 array for take(), on their buffer (pa.array imports pandas)."""
    rows = np.ascontiguousarray(rows, np.int64)
    return pa.Array.from_buffers(pa.int64(), rows.shape[0], [None, pa.py_buffer(rows)])


def take_rows(data: pa.Table | pa.ChunkedArray, rows: np.ndarray) -> pa.Table | pa.ChunkedArray:
    """data.take(rows), chunk by chunk: Arrow's take of a chunked column concatenates every chunk
    first (a copy of the whole column: ~0.5 s for a list column of 8 M rows, for any number of rows
    taken)."""
    rows = np.asarray(rows, np.int64)
    few = sliced_take(data, rows)  # (small.py: a few rows without pyarrow.compute's import)
    if few is not None:
        return few
    column = data.column(0) if isinstance(data, pa.Table) and data.num_columns else data
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if len(chunks) <= 1 or rows.shape[0] == 0:
        return data.take(row_indices(rows))
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    offsets = np.cumsum([0] + [len(c) for c in chunks])
    which = np.searchsorted(offsets, ordered, side="right") - 1
    bounds = np.searchsorted(which, np.arange(len(chunks) + 1))
    pieces = [data.slice(int(offsets[c]), int(offsets[c + 1] - offsets[c])).take(
        row_indices(ordered[bounds[c]:bounds[c + 1]] - offsets[c])) for c in range(len(chunks))
        if bounds[c + 1] > bounds[c]]
    taken = pa.concat_tables(pieces) if isinstance(data, pa.Table) else pa.chunked_array(
        [chunk for piece in pieces for chunk in piece.chunks], type=data.type)
    if np.all(order[1:] > order[:-1]):
        return taken
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.shape[0])
    return taken.take(row_indices(inverse))


class LazyColumn:
    """An int64 column read only at the rows asked for (time_created, record_id: needed for a few
    rows; a full copy of 33 M rows would cost 260 MB each)."""

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
    array = single_chunk(column)
    values, valid = primitive_values(array)
    values = values.astype(bool, copy=False)
    return values if valid is None else values & valid


