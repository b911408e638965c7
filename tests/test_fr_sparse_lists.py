"""pg_ranks' list column built sparsely (flight_recorder.arrow.sparse_lists) is the one the per-row
counts build (list_from_counts): the same values, nulls and type, with no, some and every row
set."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.arrow import list_from_counts, sparse_lists


def _from_counts(total: int, rows: list[int], values: list[tuple[int, ...]]) -> pa.Array:
    counts = np.full(total, -1, np.int32)
    for row, items in zip(rows, values, strict=True):
        counts[row] = len(items)
    flat = np.array([r for items in values for r in items], np.int32)
    return list_from_counts(counts, pa.array(flat, pa.int32()))


def test_sparse_lists_are_the_lists_from_counts() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        total = int(rng.integers(1, 200))
        count = int(rng.choice([0, total, int(rng.integers(0, total + 1))]))
        rows = sorted(rng.choice(total, count, replace=False).tolist())
        values = [tuple(rng.integers(0, 64, int(rng.integers(0, 5))).tolist()) for _ in rows]
        got = sparse_lists(total, rows, values)
        got.validate(full=True)
        expected = _from_counts(total, rows, values)
        assert (
            got.equals(expected)
            and got.type == expected.type
            and got.null_count == expected.null_count
        )
