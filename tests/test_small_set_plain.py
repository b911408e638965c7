"""Small dump sets read and analysed by the plain path (faultlens/compiled.py): no numba, scipy or
pandas loaded by `faultlens analyze-hang` on a real 16-rank NCCL set, the same reports as the
compiled kernels give on real sets, the same kernel results on random inputs, and the plain
strongly-connected split equal to scipy's.

Each comparison runs in a child process: use_compiled() is one way for the process that calls it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NCCL = REPO_ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"
MESH = REPO_ROOT / "tests" / "data" / "device-mesh-hangs"
GLOO = REPO_ROOT / "tests" / "data" / "gloo-fr-hang"
# (pyarrow.compute: imported by Arrow's first compute kernel, take or cast; numpy.ma: by numpy 2's
# np.unique; each costs more than the set's whole analysis)
HEAVY = ("numba", "scipy", "pandas", "fsspec", "asyncio", "duckdb", "torch", "sklearn",
         "pyarrow.compute", "numpy.ma")


def _child(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_analyze_hang_on_the_real_nccl_set_loads_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from faultlens.controller.cli.main import main\n"
        "rc = main(['analyze-hang', '--json', sys.argv[1]])\n"
        "sys.stdout.flush()\n"
        f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules), rc)\n"
    )
    out = _child(code, str(NCCL))
    document, loaded = out.rsplit("LOADED", 1)
    assert json.loads(document)["culprit_ranks"] == [9, 14]
    assert loaded.split() == ["[]", "0"]


_SAME_REPORTS = """
import json, sys
from faultlens.compiled import is_compiled, use_compiled
from faultlens.controller.hang_dump_dir import analyze_dump_dir

def reports():
    out = {}
    for directory in sys.argv[1:]:
        dumps, report = analyze_dump_dir(directory)
        out[directory] = report.to_dict()
    return out

plain = reports()
assert not is_compiled()
use_compiled()
compiled = reports()
print(json.dumps([plain, compiled], default=str))
"""


def test_the_plain_and_the_compiled_kernels_give_the_same_reports_on_real_sets() -> None:
    sets = [NCCL, GLOO, *sorted(p / "dumps" for p in (MESH / "raw").iterdir() if p.is_dir())]
    sets += sorted(p / "dumps" for p in (MESH / "stacks").iterdir() if p.is_dir())
    plain, compiled = json.loads(_child(_SAME_REPORTS, *map(str, sets)))
    assert len(plain) == len(sets) >= 20
    for directory in plain:
        assert plain[directory] == compiled[directory], directory
    assert plain[str(NCCL)]["culprit_ranks"] == [9, 14]


_SAME_KERNELS = """
import sys
import numpy as np
import pyarrow as pa
from faultlens.attribution.detectors.hang import kernels
from faultlens.attribution.detectors.hang.aggregate import SignatureTable
from faultlens.compiled import use_compiled

rng = np.random.default_rng(int(sys.argv[1]))

def sizes_column(n):
    rows = []
    for _ in range(n):
        if rng.random() < 0.1:
            rows.append(None)
            continue
        rows.append([[int(v) for v in rng.integers(-3, 1 << 40, rng.integers(0, 4))]
                     for _ in range(rng.integers(0, 3))])
    return pa.chunked_array([pa.array(rows, pa.list_(pa.list_(pa.int64())))])

def dtypes_column(n):
    names = ["Float", "BFloat16", "Half", "Long", None]
    rows = [None if rng.random() < 0.1 else
            [names[int(i)] for i in rng.integers(0, 5, rng.integers(0, 4))] for _ in range(n)]
    return pa.chunked_array([pa.array(rows, pa.list_(pa.string()))])

def run():
    out = []
    for n in (0, 1, 7, 300):
        rows = np.arange(n, dtype=np.int64)
        sizes, dtypes = sizes_column(n), dtypes_column(n)
        size_sig, dtype_sig = kernels.row_signatures(sizes, dtypes, rows)
        ops = rng.integers(0, 5, n).astype(np.uint64)
        out += [size_sig, dtype_sig, kernels.combine_signatures(ops, size_sig, dtype_sig)]
        values = rng.integers(-5, 50, n)
        valid = rng.random(n) < 0.9
        table = rng.integers(0, 9, 40).astype(np.int32)
        codes, bad = kernels.remap_codes(values, valid, table)
        out += [codes, np.array([bad])]
        wanted = np.unique(rng.integers(-(1 << 62), 1 << 62, 1 + n // 3))
        probe = np.concatenate([wanted[: n // 2], rng.integers(-(1 << 62), 1 << 62, n)])
        out.append(kernels.member_of(probe, wanted))
        signatures = SignatureTable()
        group = rng.integers(0, 3, n).astype(np.int32)
        seq = rng.integers(0, 20, n).astype(np.int64)
        sig = rng.integers(0, 4, n).astype(np.uint64)
        signatures.add(rows, group, seq, sig, n)
        out.append(np.array(sorted(map(tuple, signatures.differing(1000)))).reshape(-1))
    return out

state = rng.bit_generator.state
plain = run()
rng.bit_generator.state = state
use_compiled()
compiled = run()
assert len(plain) == len(compiled)
for i, (a, b) in enumerate(zip(plain, compiled)):
    assert a.dtype == b.dtype and np.array_equal(a, b), (i, a, b)
print("same", len(plain))
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_each_kernel_gives_the_same_values_plain_and_compiled(seed: int) -> None:
    assert _child(_SAME_KERNELS, str(seed)).split() == ["same", "28"]


def test_the_plain_strongly_connected_split_is_scipys() -> None:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    from faultlens.attribution.detectors.hang.graph import strongly_connected

    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 80))
        m = int(rng.integers(0, 3 * n))
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        plain = strongly_connected(n, src, dst)
        graph = csr_matrix((np.ones(m, np.int8), (src, dst)), shape=(n, n))
        _, labels = connected_components(graph, directed=True, connection="strong")
        # one partition: each plain label maps to one scipy label and back
        pairs = set(zip(plain.tolist(), labels.tolist(), strict=True))
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})


def test_the_buffer_built_arrays_equal_pyarrows_own() -> None:
    import pyarrow as pa

    from faultlens.attribution.detectors.hang.columns import filled_values, int_array, validity
    from faultlens.collectors.artifacts.flight_recorder.arrow import (
        coded_array,
        numeric_array,
        string_array,
    )

    rng = np.random.default_rng(3)
    for n in (0, 1, 9, 64, 1001):
        values = rng.integers(-(1 << 40), 1 << 40, n)
        null = rng.random(n) < 0.3
        for type_ in (pa.int64(), pa.timestamp("ns", tz="UTC")):
            assert numeric_array(values, type_, null).equals(pa.array(values, type_, mask=null))
        small = rng.integers(-5, 100, n).astype(np.int64)
        assert numeric_array(small, pa.int32()).equals(pa.array(small, pa.int32()))
        flags = rng.random(n) < 0.5
        assert numeric_array(flags, pa.bool_(), null).equals(pa.array(flags, mask=null))
        assert int_array(values, null).equals(pa.array(values, mask=null))
        texts = [f"v{i}é" for i in rng.integers(0, 7, n)]
        assert string_array(texts).equals(pa.array(texts, pa.string()))
        codes = rng.integers(-1, 7, n).astype(np.int32)
        words = pa.array([f"w{i}" for i in range(7)])
        expected = pa.DictionaryArray.from_arrays(codes, words, from_pandas=True, safe=False)
        coded = coded_array(codes, words)
        # the same values, its indices as narrow as 7 words allow (int8)
        assert coded.type.index_type == pa.int8()
        assert coded.dictionary_decode().equals(expected.dictionary_decode())
        assert coded.indices.cast(pa.int32()).equals(expected.indices)
        arrow = pa.array(values, mask=null)
        for piece in (arrow, arrow.slice(n // 3), pa.chunked_array([arrow, arrow.slice(1)])):
            filled = piece.fill_null(-1).to_numpy()
            assert np.array_equal(filled_values(piece, -1), filled)
            assert np.array_equal(validity(piece), ~np.asarray(piece.is_null()))
    with pytest.raises(pa.ArrowInvalid):
        numeric_array(np.array([1 << 40]), pa.int32())
    assert np.array_equal(filled_values(pa.nulls(3, pa.int64()), -1), [-1, -1, -1])


def _real_dump_sets() -> list[Path]:
    """Every real dump set under tests/data (NCCL, gloo raw and repaired, with stacks or not)."""
    data = REPO_ROOT / "tests" / "data"
    found = {p.parent for p in data.rglob("*") if p.is_file() and (
        p.name.startswith("_dump_") or (p.suffix == ".pkl" and p.parent.name != "stacks"))}
    return sorted(found)


_SAME_WITHOUT_FEW = """
import json, sys
from faultlens.attribution.detectors.hang import kernels, small
from faultlens.controller.hang_dump_dir import analyze_dump_dir

def reports():
    out = {}
    for directory in sys.argv[1:]:
        dumps, report = analyze_dump_dir(directory)
        out[directory] = [report.to_dict(), [str(e) for e in dumps.errors]]
    return out

# every set as the first of its process (a take of a few rows by slices however many the process
# took before, whatever imported Arrow's kernels since)
small.SLICED_ROWS_BUDGET = 1 << 62
small.compute_imported = lambda: False
few = reports()
sliced = small._sliced
small.FEW_ROWS = -1  # every take through Arrow's kernel
kernels.PLAIN_ENCODE_MAX = -1  # every string list through dictionary_encode
kernel = reports()
print(json.dumps([few, kernel, sliced], default=str))
"""


def test_the_small_set_shortcuts_give_the_kernels_answers_on_every_real_set() -> None:
    """Takes of a few rows by slices and dtype codes by plain Python (small.py, kernels.py) change
    no report and no error line on any real set under tests/data nor on the hang corpus."""
    from tests.torch_jobs.hang_corpus.generate import corpus

    sets = _real_dump_sets() + [path / "dumps" for _, path in sorted(corpus().items())]
    few, kernel, sliced = json.loads(_child(_SAME_WITHOUT_FEW, *map(str, sets)))
    assert len(few) == len(sets) >= 60
    assert sliced > 1000  # the slices did answer
    for directory in few:
        assert few[directory] == kernel[directory], directory


def test_take_few_and_distinct_equal_arrows_take_and_numpys_unique_on_real_columns() -> None:
    import pyarrow as pa

    from faultlens.attribution.detectors.hang.small import distinct, take_few
    from faultlens.collectors.artifacts.flight_recorder import read_dump_dir

    rng = np.random.default_rng(11)
    for directory in (NCCL, GLOO, MESH / "raw" / "E_first" / "dumps"):
        for dictionary in (True, False):
            table = read_dump_dir(directory, dictionary=dictionary, max_frames=0).table
            halves = pa.Table.from_batches(table.to_batches(max_chunksize=max(1, len(table) // 3)))
            n = table.num_rows
            for rows in ([], [0], [n - 1, 0, n - 1], rng.integers(0, n, 40).tolist()):
                rows = np.array(rows, np.int64)
                for data in (table, halves, halves.column("collective_seq_id"),
                             table.column(0).chunk(0)):
                    assert take_few(data, rows).equals(data.take(pa.array(rows, pa.int64())))
            assert take_few(table, np.array([n])) is None  # out of range: take's IndexError
            seqs = table.column("collective_seq_id").to_numpy(zero_copy_only=False)
            seqs = seqs[~np.isnan(seqs)].astype(np.int64) if seqs.dtype.kind == "f" else seqs
            for values in (seqs, seqs[:1], seqs[:0], rng.integers(-3, 3, (5, 4))):
                got, want = distinct(values), np.unique(values)
                assert got.dtype == want.dtype and np.array_equal(got, want)


def test_plain_codes_of_strings_are_dictionary_encodes() -> None:
    import pyarrow as pa

    from faultlens.attribution.detectors.hang.kernels import first_seen_codes

    rng = np.random.default_rng(4)
    words = ["Float", "BFloat16", None, "Long", "Half", "é"]
    for n in (0, 1, 5, 300):
        values = [words[int(i)] for i in rng.integers(0, len(words), n)]
        expected = pa.array(values, pa.string()).dictionary_encode().indices
        null = np.array([v is None for v in values], bool)
        assert pa.array(first_seen_codes(values), mask=null).equals(
            expected
        )
