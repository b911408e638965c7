"""The compiled pass-1 aggregates (attribution/detectors/hang/aggregate.py) against Arrow's
group-by, the reference they replace: the same keys and values (keys in the order their first rows
come; Arrow's order is its own), over several slices, with tables that grow many times, keys
spanning slices, null ranks and negative sequence ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from faultlens.attribution.detectors.hang.aggregate import ProgressTable, SignatureTable


def _slices(
    seed: int, n_slices: int, rows: int, groups: int, ranks: int, seqs: int
) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_slices):
        group = rng.integers(-1, groups, rows).astype(np.int32)
        coll = (rng.random(rows) < 0.8) & (group >= 0)
        out.append({
            "group": group,
            "rank": rng.integers(-1, ranks, rows).astype(np.int32),
            "seq": rng.integers(-3, seqs, rows).astype(np.int64),
            "coll": coll,
            "complete": rng.random(rows) < 0.6,
            "started": rng.random(rows) < 0.7,
            "desc": rng.integers(-1, 5, rows).astype(np.int32),
            "sig": rng.integers(0, 3, rows).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15),
        })
    return out


def _reference_progress(slices: list[dict[str, np.ndarray]]) -> tuple[pa.Table, pa.Table]:
    whole = {k: np.concatenate([s[k] for s in slices]) for k in slices[0]}
    named = whole["group"] >= 0
    coll = whole["coll"]
    other = named & ~coll
    desc = whole["desc"]
    seen = (
        pa.table(
            {
                "g": whole["group"][other],
                "r": whole["rank"][other],
                "d": pa.array(desc[other], mask=desc[other] < 0),
            }
        )
        .group_by(["g", "r"], use_threads=False)
        .aggregate([("d", "min")])
    )
    seq = whole["seq"][coll]
    complete = whole["complete"][coll]
    progress = (
        pa.table(
            {
                "g": whole["group"][coll],
                "r": whole["rank"][coll],
                "s": seq,
                "s_incomplete": pa.array(seq, mask=complete),
                "s_started": pa.array(seq, mask=~whole["started"][coll]),
                "s_complete": pa.array(seq, mask=~complete),
                "d": pa.array(desc[coll], mask=desc[coll] < 0),
            }
        )
        .group_by(["g", "r"], use_threads=False)
        .aggregate(
            [
                ("s", "max"),
                ("s_incomplete", "min"),
                ("s_incomplete", "max"),
                ("s_started", "max"),
                ("s_complete", "max"),
                ("d", "min"),
            ]
        )
    )
    return seen, progress


def _rows(table: pa.Table) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


@pytest.mark.parametrize(("seed", "n_slices", "rows", "groups", "ranks", "seqs"), [
    (0, 1, 50, 3, 4, 10),  # a handful of keys
    (1, 3, 20_000, 40, 300, 50),  # keys spanning slices, the table grown several times
    (2, 5, 30_000, 2_000, 2_000, 5),  # mostly distinct keys
])
def test_progress_matches_arrow_group_by(
    seed: int, n_slices: int, rows: int, groups: int, ranks: int, seqs: int
) -> None:
    slices = _slices(seed, n_slices, rows, groups, ranks, seqs)
    table = ProgressTable()
    for s in slices:
        table.add(
            s["group"], s["rank"], s["seq"], s["coll"], s["complete"], s["started"], s["desc"]
        )
    seen, progress = _reference_progress(slices)
    got_progress = table.progress()
    assert got_progress.column_names == [
        "g",
        "r",
        "s_max_max",
        "s_incomplete_min_min",
        "s_incomplete_max_max",
        "s_started_max_max",
        "s_complete_max_max",
        "d_min_min",
    ]
    assert sorted(_rows(got_progress)) == sorted(
        _rows(progress.rename_columns(got_progress.column_names))
    )
    got_seen = table.seen()
    assert sorted(_rows(got_seen)) == sorted(_rows(seen.rename_columns(got_seen.column_names)))
    for got, collectives in ((got_progress, True), (got_seen, False)):
        keys = [(g, r) for g, r, *_ in _rows(got)]
        assert keys == _first_seen(
            [
                (int(g), int(r))
                for s in slices
                for g, r, c in zip(s["group"], s["rank"], s["coll"], strict=True)
                if g >= 0 and c == collectives
            ]
        )


def _first_seen(keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return list(dict.fromkeys(keys))


@pytest.mark.parametrize(("seed", "n_slices", "rows", "groups", "seqs", "hint"), [
    (3, 1, 40, 2, 6, True),
    (4, 4, 25_000, 60, 400, True),  # ~24,000 keys: grown from 4,096 slots
    (5, 6, 20_000, 3_000, 30, False),  # no size hint: grown step by step
])
def test_signatures_match_arrow_group_by(
    seed: int, n_slices: int, rows: int, groups: int, seqs: int, hint: bool
) -> None:
    slices = _slices(seed, n_slices, rows, groups, 10, seqs)
    # keys decode as decode.key_parts does: sequence ids are not negative (0 .. 2^40)
    for s in slices:
        s["seq"] = np.abs(s["seq"])
    table = SignatureTable(n_slices * rows if hint else 0)
    for s in slices:
        picked = np.flatnonzero(s["coll"])
        table.add(picked, s["group"], s["seq"], s["sig"][picked], rows)
    keys = {"g": np.concatenate([s["group"][s["coll"]] for s in slices]),
            "s": np.concatenate([s["seq"][s["coll"]] for s in slices]),
            "sig": np.concatenate([s["sig"][s["coll"]] for s in slices])}
    reference = (
        pa.table(keys)
        .group_by(["g", "s"], use_threads=False)
        .aggregate([("sig", "min"), ("sig", "max")])
    )
    differ = {(g, s) for g, s, low, high in _rows(reference) if low != high}
    assert differ, "the data must hold mismatching keys"
    got = table.differing(10 ** 9)
    assert sorted(got) == sorted(differ)
    in_order = [
        key
        for key in _first_seen(list(zip(keys["g"].tolist(), keys["s"].tolist(), strict=True)))
        if key in differ
    ]
    assert got == in_order
    assert table.differing(7) == in_order[:7]


def test_signatures_agree_everywhere_means_no_key() -> None:
    table = SignatureTable(1000)
    group = np.repeat(np.arange(10, dtype=np.int32), 100)
    seq = np.tile(np.arange(100, dtype=np.int64), 10)
    table.add(np.arange(1000), group, seq, np.full(1000, 42, np.uint64), 1000)
    table.add(np.arange(1000), group, seq, np.full(1000, 42, np.uint64), 1000)
    assert table.differing(256) == []
    odd = np.full(1000, 42, np.uint64)
    odd[517] = 43
    table.add(np.arange(1000), group, seq, odd, 1000)
    assert table.differing(256) == [(5, 17)]
