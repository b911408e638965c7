"""The scanner's pg_id grouping (fr_fastpickle.unique_first) against the reference path's numpy one
(flight_recorder.assembly._unique_first): the same distinct values, first rows and codes, with few
and with many distinct values (the linear search and the sorted fallback), nulls and empty columns.
"""

from __future__ import annotations

import numpy as np
import pytest

from faultlens.collectors.artifacts.flight_recorder.assembly import _unique_first
from faultlens.collectors.artifacts.fr_fastpickle import unique_first


@pytest.mark.parametrize("distinct", [1, 3, 16, 17, 40, 500])
def test_unique_first_is_numpy_unique(distinct: int) -> None:
    rng = np.random.default_rng(distinct)
    for _ in range(200):
        n = int(rng.integers(0, 2000))
        values = rng.integers(-3, distinct, n).astype(np.int64) * int(rng.choice([1, 10**15]))
        valid = rng.random(n) < 0.9
        expected = _unique_first(values, valid)
        for flags in (valid, valid.astype(np.int8)):
            got = unique_first(values, flags)
            for a, b in zip(got, expected, strict=True):
                assert np.array_equal(a, b)
                assert a.dtype == b.dtype or a.dtype.kind == b.dtype.kind == "i"
