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


class LazyColumn:
    """An int64 column read only at the rows asked for (time_created, record_id: needed for a few rows; a full
    copy of 33 M rows would cost 260 MB each)."""

    def __init__(self, table: pa.Table, name: str) -> None:
        self.column = table.column(name) if name in table.column_names else None

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows, np.int64)
        if self.column is None or rows.shape[0] == 0:
            return np.zeros(rows.shape[0], np.int64), np.zeros(rows.shape[0], bool)
        return int_column(self.column.take(pa.array(rows)))


def bool_column(column: pa.ChunkedArray | None, n: int) -> np.ndarray:
    if column is None:
        return np.zeros(n, bool)
    filled = column.fill_null(False) if column.null_count else column
    return filled.to_numpy(zero_copy_only=False).astype(bool, copy=False)


