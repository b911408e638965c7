"""The chunk buffers' compiled writes (flight_recorder/fill.py) against their numpy forms."""

from __future__ import annotations

import numpy as np

from faultlens.collectors.artifacts.flight_recorder import fill
from faultlens.collectors.artifacts.flight_recorder.arrow import SetStrings


def test_first_rows_is_unique_with_index() -> None:
    rng = np.random.default_rng(0)
    codes = rng.integers(-1, 7, 500).astype(np.int32)
    distinct, rows = fill.first_rows(codes, 9)
    want, want_rows = np.unique(codes[codes >= 0], return_index=True)
    valid_rows = np.flatnonzero(codes >= 0)
    assert distinct.tolist() == want.tolist()
    assert rows.tolist() == valid_rows[want_rows].tolist()


def test_put_mapped_is_remap() -> None:
    strings = SetStrings()
    strings.remap(["x"], np.zeros(1, np.int32))
    codes = np.array([1, 0, -1, 2, 1], np.int32)
    column = np.full(10, 99, np.int32)
    fill.put_mapped(column, 2, 5, 8, strings.table(["b", "a", "x"]), codes, -1)
    assert column[2:7].tolist() == strings.remap(["b", "a", "x"], codes).tolist()
    assert column.tolist()[:2] == [99, 99] and column.tolist()[7:] == [-1, 99, 99]


def test_put_ints_nonzero_and_status_rows() -> None:
    column, known = np.full(6, 7, np.int64), np.ones(6, bool)
    fill.put_ints(column, known, 1, 3, 5, np.array([0, 5, 6]), np.array([True, True, False]), True)
    assert column.tolist() == [7, 0, 5, 6, 0, 7]
    assert known.tolist() == [True, False, True, False, False, True]
