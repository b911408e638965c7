"""The CI's small seed set of bench/bench_parse_fuzz.py (the bench runs >= 10^5 inputs per parser):
mutants of the real kernel-log lines and dcgm-exporter scrapes of tests/data/gpu/ never escape the
parsers, and every row they return fits its table."""

from __future__ import annotations

import pytest

from bench.bench_parse_fuzz import fuzz_dcgm, fuzz_kmsg


@pytest.mark.parametrize("seed", [1, 16])
def test_kmsg_seed_set_never_crashes(seed):
    result = fuzz_kmsg(800, seed, timing=False)
    assert result["crashes"] == 0, result["first_crash"]
    assert result["rows_refused_by_batch"] == 0
    assert result["internal_errors_contained"] == 0
    assert result["bad_lines"] > 0  # the mutants do reach the parser's refusals


def test_dcgm_seed_set_never_crashes():
    result = fuzz_dcgm(150, 7, timing=False)
    assert result["crashes"] == 0, result["first_crash"]
    assert result["rows_refused_by_batch"] == 0
    assert result["internal_errors_contained"] == 0
    assert result["bad_lines"] > 0
