"""take_rows: Arrow's take, chunk by chunk (a take of a chunked column concatenates the whole column first), in the
order asked for, on tables and columns of any chunking, with repeats and empty selections."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from faultlens.attribution.detectors.hang.columns import take_rows


@pytest.mark.parametrize("chunk_rows", [1, 3, 10, 50])
def test_take_rows_is_arrows_take(chunk_rows: int) -> None:
    rows_total = 50
    starts = range(0, rows_total, chunk_rows)
    table = pa.concat_tables([pa.table({
        "n": pa.array(np.arange(s, min(s + chunk_rows, rows_total))),
        "sizes": pa.array([[[j, j + 1]] for j in range(s, min(s + chunk_rows, rows_total))]),
        "op": pa.array([f"op{j % 3}" for j in range(s, min(s + chunk_rows, rows_total))]).dictionary_encode(),
    }) for s in starts])
    rng = np.random.default_rng(chunk_rows)
    for _ in range(100):
        rows = rng.integers(0, rows_total, rng.integers(0, 40))
        expected = table.combine_chunks().take(pa.array(rows, pa.int64()))
        # (values compared: a dictionary column's dictionary may differ between the two, its values may not)
        assert take_rows(table, rows).to_pylist() == expected.to_pylist()
        assert take_rows(table.column("sizes"), rows).to_pylist() == expected.column("sizes").to_pylist()
