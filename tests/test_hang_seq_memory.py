"""The cross-rank seq-id check (seq_consistency.py) read slice by slice in narrow widths: the same
answers whatever the table's chunking or the seq ids' width, and scratch bounded per row (it cost
~80 bytes a row of int64 copies: +160 MiB at 1,024 ranks x 2,000 entries, the run's peak)."""

from __future__ import annotations

import pickle
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from faultlens.attribution.detectors.hang import COLUMNS, seq_consistency
from faultlens.attribution.detectors.hang.seq_consistency import find_contradictions
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from tests.conftest import DATA_DIR

NCCL = DATA_DIR / "nccl-fr-gpu_error_2nd"  # truth: ranks 9 and 14


def _flipped(tmp_path: Path, rank: int, entry: int, change) -> tuple[Path, int, int]:
    directory = tmp_path / "set"
    shutil.copytree(NCCL, directory, ignore=shutil.ignore_patterns("*.json"))
    path = directory / f"_dump_{rank}"
    obj = pickle.loads(path.read_bytes())
    old = obj["entries"][entry]["collective_seq_id"]
    obj["entries"][entry]["collective_seq_id"] = new = change(old)
    path.write_bytes(pickle.dumps(obj, protocol=2))
    return directory, old, new


@pytest.mark.parametrize("high", [1 << 31, 1 << 32, (1 << 33) + (1 << 32), 1 << 40])
def test_a_seq_past_32_bits_still_contradicts_its_group(tmp_path: Path, high: int) -> None:
    """A seq past 32 bits (the column then int64) whose low bits are the peers' seq: a key of the
    low 32 bits would match the peers' entries and hide it. (In a file the dump's own pg_status
    check refuses it first; a table from elsewhere has no such check.)"""
    table = read_dump_dir(NCCL, columns=COLUMNS, max_frames=0, processes=1).table
    (row,) = _row_of(table, rank=0, entry=8)
    seq = table.column("collective_seq_id").combine_chunks()
    values = seq.cast(pa.int64()).fill_null(-1).to_numpy().copy()
    old = int(values[row])
    values[row] = old + high
    edited = table.set_column(
        table.column_names.index("collective_seq_id"),
        "collective_seq_id",
        pa.array(values, mask=~np.asarray(seq.is_valid())),
    )
    (found,) = find_contradictions(edited)
    assert (found.rank, found.entry, found.says, found.peers_seq) == (0, 8, old + high, old)


def _row_of(table: pa.Table, rank: int, entry: int) -> list[int]:
    ranks = table.column("rank").to_numpy()
    record = np.asarray(table.column("record_id").is_valid())
    rows = np.flatnonzero((ranks == rank) & record)
    return [int(rows[entry])]


def _rechunked(table: pa.Table, sizes: dict[str, int]) -> pa.Table:
    """The same rows, each column cut in chunks of its own size (columns not lined up)."""
    columns = {}
    for name in table.column_names:
        whole = table.column(name).combine_chunks()
        size = sizes.get(name, len(whole))
        pieces = [whole.slice(a, size) for a in range(0, len(whole), size)]
        columns[name] = pa.chunked_array(pieces, type=whole.type)
    return pa.table(columns)


@pytest.mark.parametrize(
    "sizes",
    [
        {},
        {"rank": 7, "collective_seq_id": 13, "record_id": 101, "pg_name": 5, "is_p2p": 3},
        {"rank": 1000, "collective_seq_id": 1, "record_id": 64},
    ],
)
def test_the_same_contradictions_whatever_the_chunking(tmp_path: Path, sizes) -> None:
    directory, old, new = _flipped(tmp_path, 3, 8, lambda v: v - 4)
    table = read_dump_dir(directory, columns=COLUMNS, max_frames=0, processes=1).table
    (found,) = find_contradictions(table)
    assert (found.rank, found.says, found.peers_seq) == (3, new, old)
    assert find_contradictions(_rechunked(table, sizes)) == (found,)
    shuffled = table.take(np.random.default_rng(3).permutation(table.num_rows))
    assert find_contradictions(shuffled) == (found,)


@pytest.mark.parametrize("lonely", [False, True])
def test_the_scratch_is_a_few_bytes_a_row(monkeypatch: pytest.MonkeyPatch, lonely: bool) -> None:
    """A 64-rank set of 6,000 entries a rank in two groups each: the check's allocations stay under
    32 bytes a row (the table itself aside; the old int64 copies cost ~80), with blocks far smaller
    than the set (at the default a block's scratch is ~10 MiB whatever the set's size)."""
    monkeypatch.setattr(seq_consistency, "_BLOCK", 4096)
    ranks, per_rank = 64, 6000
    n = ranks * per_rank
    rank = np.repeat(np.arange(ranks, dtype=np.int32), per_rank)
    step = np.tile(np.arange(per_rank, dtype=np.int32), ranks)
    tp = rank // 8
    group = np.where(step % 2 == 0, tp, 8 + rank % 8).astype(np.int8)
    seq = (step // 2 + 1).astype(np.int32)
    if lonely:  # rank 5's last entry says a seq no peer has: the full check runs
        seq[6 * per_rank - 2] += 7
    names = pa.array([f"g{i}" for i in range(16)])
    table = pa.table(
        {
            "rank": rank,
            "pg_name": pa.DictionaryArray.from_arrays(pa.array(group), names),
            "record_id": np.tile(np.arange(per_rank, dtype=np.int32), ranks),
            "collective_seq_id": seq,
            "is_p2p": np.zeros(n, bool),
            "op": pa.array(["nccl:all_reduce"] * n),
        }
    )
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        found = find_contradictions(table)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert [(f.rank, f.says, f.peers_seq) for f in found] == ([(5, 3007, 3000)] if lonely else [])
    assert peak / n < (32 if lonely else 4), f"{peak / n:.1f} bytes a row"


def _sets() -> list[Path]:
    roots = [NCCL, *sorted((DATA_DIR / "device-mesh-hangs" / "raw").iterdir())]
    roots += sorted((DATA_DIR / "skip-before-history" / "raw").iterdir())
    roots = [r / "dumps" if (r / "dumps").is_dir() else r for r in roots]
    return [r for r in roots if r.is_dir()]


@pytest.mark.parametrize("seed,dictionary", [(1, True), (2, False)])
def test_the_streamed_precheck_passes_only_sets_without_a_candidate(
    seed: int, dictionary: bool
) -> None:
    """The two-pass precheck (nothing of the set's size built) says "none" only where the full
    check finds no lonely last entry: real sets as read, and with seq ids edited at random (the
    last entries of random ranks and groups moved by small and large amounts)."""
    rng = np.random.default_rng(seed)
    checked = {True: 0, False: 0}
    for directory in _sets():
        table = read_dump_dir(
            directory, columns=COLUMNS, max_frames=0, processes=1, dictionary=dictionary
        ).table
        for edit in range(4):
            if edit:
                table = _moved_seq(table, rng)
            rows = seq_consistency._Rows.of(table)
            coll = seq_consistency._indices(rows.coll, rows.row.dtype)
            rows.pairs, last = seq_consistency._last_of(rows, coll)
            full = not seq_consistency._lonely(rows, coll, last)
            assert seq_consistency._none_lonely(table) == full, (directory, edit)
            checked[full] += 1
    assert checked[True] and checked[False], checked


def _moved_seq(table: pa.Table, rng: np.random.Generator) -> pa.Table:
    seq = table.column("collective_seq_id").combine_chunks()
    values = seq.cast(pa.int64()).fill_null(-1).to_numpy().copy()
    rows = np.flatnonzero(np.asarray(seq.is_valid()))
    row = int(rows[-1 - rng.integers(0, min(40, rows.shape[0]))])
    values[row] += int(rng.choice([1, -1, 2, 1 << 12, 1 << 33]))
    index = table.column_names.index("collective_seq_id")
    column = pa.array(values, mask=~np.asarray(seq.is_valid()))
    return table.set_column(index, "collective_seq_id", column)
