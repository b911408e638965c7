"""take_rows: Arrow's take, chunk by chunk (a take of a chunked column concatenates the whole column
first), in the order asked for, on tables and columns of any chunking, with repeats and empty
selections."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from faultlens.attribution.detectors.hang.columns import take_rows


@pytest.mark.parametrize("chunk_rows", [1, 3, 10, 50])
def test_take_rows_is_arrows_take(chunk_rows: int) -> None:
    rows_total = 50
    starts = range(0, rows_total, chunk_rows)
    table = pa.concat_tables(
        [
            pa.table(
                {
                    "n": pa.array(np.arange(s, min(s + chunk_rows, rows_total))),
                    "sizes": pa.array(
                        [[[j, j + 1]] for j in range(s, min(s + chunk_rows, rows_total))]
                    ),
                    "op": pa.array(
                        [f"op{j % 3}" for j in range(s, min(s + chunk_rows, rows_total))]
                    ).dictionary_encode(),
                }
            )
            for s in starts
        ]
    )
    rng = np.random.default_rng(chunk_rows)
    for _ in range(100):
        rows = rng.integers(0, rows_total, rng.integers(0, 40))
        expected = table.combine_chunks().take(pa.array(rows, pa.int64()))
        # (values compared: a dictionary column's dictionary may differ between the two, its values
        # may not)
        assert take_rows(table, rows).to_pylist() == expected.to_pylist()
        assert (
            take_rows(table.column("sizes"), rows).to_pylist()
            == expected.column("sizes").to_pylist()
        )


@pytest.mark.parametrize("seed", range(4))
def test_valid_rows_are_the_rows_that_are_not_null(seed: int) -> None:
    """valid_rows reads the validity bitmaps (only bytes with a set bit expanded): the same rows as
    is_null, on columns with no nulls, all nulls, a few values, sliced at any bit, and chunked."""
    from faultlens.attribution.detectors.hang.columns import valid_rows

    rng = np.random.default_rng(seed)
    for _ in range(150):
        n = int(rng.integers(0, 300))
        share = rng.choice([0.0, 0.5, 0.97, 1.0])
        array = pa.array(
            [None if rng.random() < share else [1, 2] for _ in range(n)], pa.list_(pa.int32())
        )
        offset = int(rng.integers(0, n + 1))
        length = int(rng.integers(0, n - offset + 1))
        for column in (array, array.slice(offset, length),
                       pa.chunked_array([array.slice(0, offset), array.slice(offset)], array.type)):
            expected = (
                np.flatnonzero(~column.is_null().to_numpy(zero_copy_only=False))
                if len(column)
                else []
            )
            got = valid_rows(column)
            assert got.dtype == np.int64
            assert got.tolist() == list(expected)


@pytest.mark.parametrize("seed", range(3))
def test_member_of_is_numpys_isin(seed: int) -> None:
    """decode.member_of (a compiled hash set of the wanted values): np.isin on small and 60-bit
    values (group/seq keys), negatives, repeats, no values, no wanted values, and more wanted values
    than the first table holds."""
    from faultlens.attribution.detectors.hang.decode import member_of

    rng = np.random.default_rng(seed)
    for trial in range(200):
        high = 50 if trial % 2 else 1 << 60
        wanted = np.unique(
            rng.integers(-50, high, int(rng.integers(0, 3000 if trial % 7 == 0 else 100)))
        )
        values = rng.integers(-60, min(high, 60) if trial % 2 else high, int(rng.integers(0, 500)))
        if wanted.shape[0]:
            values = np.concatenate([values, rng.choice(wanted, 20)])
        assert member_of(values, wanted).tolist() == np.isin(values, wanted).tolist()


def test_rows_by_value_groups_rows_as_a_mask_per_value_does() -> None:
    """analyze.rows_by_value (one sort): each distinct value and its rows, as np.unique and a mask
    per value give them; no rows (an empty pass 1: a set of status rows only) give no groups."""
    from faultlens.attribution.detectors.hang.analyze import rows_by_value

    assert rows_by_value(np.empty(0, np.int32)) == []
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 300):
        values = rng.integers(-3, 9, n).astype(np.int32)
        got = rows_by_value(values)
        assert [v for v, _ in got] == np.unique(values).tolist()
        for value, rows in got:
            assert rows.tolist() == np.flatnonzero(values == value).tolist()
