"""The set-wide dictionaries of input_sizes and input_dtypes values (flight_recorder/shapes.py) that
a dictionary read keeps: the compiled and the Python forms give the same codes in first-seen order,
each value decodes to what the entry held, the hash table grows past its first size, a value's
signature in the hang analysis is the same as a dictionary code or as a list (dtypes: the same lists
tell apart), and a dictionary read decodes to the plain read's rows (one process and several)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from faultlens.attribution.detectors.hang import COLUMNS
from faultlens.attribution.detectors.hang.kernels import row_signatures
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.artifacts.flight_recorder.arrow import SetStrings
from faultlens.collectors.artifacts.flight_recorder.shapes import SetShapes, SetStringLists

NCCL_SET = Path(__file__).parent / "data" / "nccl-fr-gpu_error_2nd"


def _entries(seed: int, count: int) -> list[list[list[int]] | None]:
    """Entries' input_sizes: nulls, empty lists, scalars ([]), one or several tensors, repeats,
    negative and 64-bit dims (what a hostile dump may hold), values that differ only in where a dim
    sits."""
    rng = random.Random(seed)
    pool: list[list[list[int]] | None] = [
        None,
        [],
        [[]],
        [[1, 2]],
        [[1], [2]],
        [[2], [1]],
        [[12]],
        [[-1, 3]],
        [[2**62, 5]],
        [[1, 2], []],
        [[], [1, 2]],
    ]
    pool += [
        [
            [rng.randrange(1, 9000) for _ in range(rng.randrange(0, 4))]
            for _ in range(rng.randrange(0, 4))
        ]
        for _ in range(300)
    ]
    return [rng.choice(pool) for _ in range(count)]


def _columns(entries: list[list[list[int]] | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    counts = np.array([-1 if e is None else len(e) for e in entries], np.int64)
    ndims = np.array([len(s) for e in entries if e is not None for s in e], np.int64)
    dims = np.array([d for e in entries if e is not None for s in e for d in s], np.int64)
    return counts, ndims, dims


def _decoded(shapes: SetShapes, codes: np.ndarray) -> list[list[list[int]] | None]:
    return shapes.array(codes).to_pylist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_and_python_forms_give_the_same_codes_and_values(seed: int) -> None:
    entries = _entries(seed, 5000)
    counts, ndims, dims = _columns(entries)
    compiled, python = SetShapes(), SetShapes()
    # in pieces, as dumps come: the dictionary carries over (and its table is rehashed as it grows)
    cuts = [0, 1, 700, 2500, 5000]
    for a, b in itertools.pairwise(cuts):
        t0, t1 = int(counts[:a].clip(0).sum()), int(counts[:b].clip(0).sum())
        d0, d1 = int(ndims[:t0].sum()), int(ndims[:t1].sum())
        got_c = compiled.codes(counts[a:b], ndims[t0:t1], dims[d0:d1], compiled=True)
        got_p = python.codes(counts[a:b], ndims[t0:t1], dims[d0:d1], compiled=False)
        assert got_c.tolist() == got_p.tolist()
        assert _decoded(compiled, got_c) == entries[a:b]
    distinct = list(dict.fromkeys(repr(e) for e in entries if e is not None))
    assert len(compiled) == len(python) == len(distinct)
    assert [repr(v) for v in compiled.dictionary().to_pylist()] == distinct  # first-seen order
    assert compiled.slots.shape[0] >= 2 * len(compiled)


def test_the_two_forms_find_each_others_values() -> None:
    entries = _entries(7, 2000)
    counts, ndims, dims = _columns(entries)
    shapes = SetShapes()
    first = shapes.codes(counts, ndims, dims, compiled=True)
    assert shapes.codes(counts, ndims, dims, compiled=False).tolist() == first.tolist()
    shapes = SetShapes()
    first = shapes.codes(counts, ndims, dims, compiled=False)
    assert shapes.codes(counts, ndims, dims, compiled=True).tolist() == first.tolist()


def test_dims_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(ValueError, match="do not add up"):
        SetShapes().codes(np.array([2], np.int64), np.array([1], np.int64), np.array([5], np.int64),
                          compiled=True)
    with pytest.raises(ValueError, match="do not add up"):
        SetShapes().codes(np.array([1], np.int64), np.array([3], np.int64), np.array([5], np.int64),
                          compiled=True)


def test_a_values_signature_is_the_same_as_a_code_or_a_list() -> None:
    entries = _entries(3, 3000)
    counts, ndims, dims = _columns(entries)
    shapes = SetShapes()
    coded = shapes.array(shapes.codes(counts, ndims, dims, compiled=True))
    plain = pa.array(entries, pa.list_(pa.list_(pa.int64())))
    rows = np.array([5, 0, 2999, 17, 17, 1200], np.int64)
    for column in (coded, coded.slice(100, 2000)):
        listed = plain.slice(100, 2000) if len(column) == 2000 else plain
        got, _ = row_signatures(pa.chunked_array([column]), None, rows[rows < len(column)])
        want, _ = row_signatures(pa.chunked_array([listed]), None, rows[rows < len(column)])
        assert got.tolist() == want.tolist()
    sig, _ = row_signatures(pa.chunked_array([coded]), None, np.arange(3000, dtype=np.int64))
    assert all((s == 0) == (e is None) for s, e in zip(sig.tolist(), entries, strict=True))


def test_string_lists_decode_to_the_entries_lists() -> None:
    """input_dtypes values: lists of names (null lists, empty lists, a null name, repeats), stored
    as one-shape values of the names' set-wide codes; the dictionary grows with new names and keeps
    the earlier codes."""
    strings = SetStrings()
    lists = SetStringLists(strings)
    rng = random.Random(5)
    pool = [
        None,
        [],
        ["Float"],
        ["Float", "Float"],
        ["BFloat16"],
        [None],
        ["Float", None, "Int"],
        ["Half"],
    ]
    batches = [[rng.choice(pool[:5]) for _ in range(300)], [rng.choice(pool) for _ in range(300)]]
    seen: list[np.ndarray] = []
    for batch in batches:
        names = sorted({n for e in batch if e for n in e if n is not None})
        local = {n: i for i, n in enumerate(names)}
        counts = np.array([-1 if e is None else len(e) for e in batch], np.int64)
        items = strings.remap(names, np.array([local.get(n, -1) if n is not None else -1
                                               for e in batch if e for n in e], np.int32))
        codes = lists.codes(counts, items.astype(np.int64), compiled=True)
        assert lists.array(codes).to_pylist() == batch
        seen.append(codes)
    # earlier codes under the grown dictionary
    assert lists.array(seen[0]).to_pylist() == batches[0]
    assert len(lists) == len({repr(e) for b in batches for e in b if e is not None})


@pytest.mark.parametrize("processes", [1, 3])
def test_a_dictionary_read_decodes_to_the_plain_read(processes: int) -> None:
    plain = read_dump_dir(NCCL_SET, columns=COLUMNS)
    coded = read_dump_dir(NCCL_SET, columns=COLUMNS, dictionary=True, processes=processes)
    for name in ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes"):
        column = coded.table.column(name)
        assert pa.types.is_dictionary(column.type)
        assert column.to_pylist() == plain.table.column(name).to_pylist()
        assert len(column.chunk(0).dictionary) < len(column) // 2  # values stored once


def test_dtype_signatures_tell_the_same_lists_apart_as_plain_lists() -> None:
    """Signatures of input_dtypes as a dictionary read keeps them: rows with the same list have the
    same signature and rows with different lists different ones, as the plain column's signatures
    do."""
    plain = read_dump_dir(NCCL_SET, columns=COLUMNS).table.column("input_dtypes")
    coded = read_dump_dir(NCCL_SET, columns=COLUMNS, dictionary=True).table.column("input_dtypes")
    rows = np.arange(len(plain), dtype=np.int64)
    _, got = row_signatures(None, coded, rows)
    _, want = row_signatures(None, plain, rows)
    values = [repr(v) for v in plain.to_pylist()]
    for sigs in (got, want):
        by_value: dict[str, int] = {}
        for value, sig in zip(values, sigs.tolist(), strict=True):
            assert by_value.setdefault(value, sig) == sig
        assert len(set(by_value.values())) == len(by_value)


def test_sizes_that_do_not_add_up_leave_no_rows_and_the_next_dump_is_read() -> None:
    """An assembly refuses a dump whose input_sizes do not add up before it takes any row for it
    (the reader then reports the file), and the next dump's rows are whole."""
    from faultlens.collectors.artifacts.flight_recorder.assembly import Assembly
    from faultlens.collectors.artifacts.flight_recorder.files import find_dump_files, load_file
    from faultlens.collectors.artifacts.flight_recorder.model import SizesColumn

    paths = find_dump_files(NCCL_SET)
    good, bad = (load_file(path, 0, True) for path in paths[:2])
    sizes = bad.sizes["input_sizes"]
    # one dim short
    bad.sizes["input_sizes"] = SizesColumn(sizes.counts, sizes.ndims, sizes.dims[:-1])
    assembly = Assembly(columns=set(COLUMNS), dictionary=True, compiled=True)
    with pytest.raises(ValueError, match="do not add up"):
        assembly.add(bad, "set/_dump_1")
    assert assembly.rows == assembly.buffers.rows == 0
    assembly.add(good, "set/_dump_0")
    table = assembly.table(None)
    alone = Assembly(columns=set(COLUMNS), dictionary=True, compiled=True)
    alone.add(load_file(paths[0], 0, True), "set/_dump_0")
    assert table.equals(alone.table(None))
