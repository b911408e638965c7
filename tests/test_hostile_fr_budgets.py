"""The flight-recorder readers' budgets (issue 37): what a dump may make the reader build, what a
set may make it read, and the field limits JSON dumps share with pickles. Every hostile file sits
beside the real NCCL set (16 ranks); each must be refused with one line naming the file (and the
field), and every good rank read as if the hostile file were not there. Big files are generated
here (sparse where they may be); the RSS these cases reach is measured by bench/bench_fr_fuzz.py
(`--budgets`), not here.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pytest

from faultlens.attribution.detectors.hang import analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.artifacts.flight_recorder.parts import _loaded as loaded_window
from faultlens.collectors.artifacts.fr_limits import default_limits
from faultlens.collectors.artifacts.safe_pickle import PickleLoadError, safe_loads
from tests.test_fr_hostile import NCCL, _nccl_set

GOOD = set(range(16))


def _u(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _bomb(opcode: bytes, count: int, under: str) -> bytes:
    """A protocol-4 dump whose `under` key ('entries' or an extra key) holds `count` objects each
    made by the one-byte `opcode` (EMPTY_SET, EMPTY_LIST, EMPTY_DICT)."""
    many = b"](" + opcode * count + b"e"
    if under == "entries":
        return b"\x80\x04}(" + _u("version") + _u("2.9") + _u("entries") + many + b"u."
    return b"\x80\x04}(" + _u("version") + _u("2.9") + _u("entries") + b"]" + _u(under) + many \
        + b"u."


def _rows(dumps, drop: tuple[str, ...] = ()) -> pa.Table:
    """The rows (a DumpSet's or a table), in a comparable order."""
    table = dumps if isinstance(dumps, pa.Table) else dumps.table
    return table.drop_columns(list(drop)).sort_by([("rank", "ascending"),
                                                   ("record_id", "ascending")])


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> pa.Table:
    return _rows(read_dump_dir(_nccl_set(tmp_path_factory.mktemp("base") / "set")))


def _only_named(dumps, names: set[str]) -> dict[str, str]:
    errors = {Path(e.path).name: str(e) for e in dumps.errors}
    assert set(errors) == names, errors
    for name, text in errors.items():
        assert "\n" not in text and name in text, text
    return errors


@pytest.mark.parametrize(
    "opcode,under,fast",
    [(b"\x8f", "junk", False), (b"\x8f", "entries", True), (b"]", "entries", False),
     (b"]", "entries", True), (b"}", "junk", False), (b"]", "pg_status_x", False)],
    ids=["set-extra", "set-entries-fast", "list-entries", "list-entries-fast", "dict-extra",
         "list-extra"],
)
def test_a_dump_that_builds_far_more_than_its_bytes_is_refused_before_it_is_built(
    tmp_path: Path, baseline: pa.Table, opcode: bytes, under: str, fast: bool
) -> None:
    """12.6 MB of EMPTY_SET took 3.1 GB; here 2.5-3 MB of one-byte container opcodes (the budget is
    64 bytes a byte, at least 64 MiB): each builds 72-232 bytes a byte with its slots."""
    directory = _nccl_set(tmp_path / "set")
    count = 3_000_000 if opcode == b"\x8f" else 2_500_000
    (directory / "_dump_40").write_bytes(_bomb(opcode, count, under))
    dumps = read_dump_dir(directory, fast_path=fast)
    errors = _only_named(dumps, {"_dump_40"})
    assert "would build" in errors["_dump_40"] and "alloc" in errors["_dump_40"]
    assert set(dumps.ranks) == GOOD
    assert _rows(dumps).equals(baseline)


def test_the_allocation_estimate_admits_real_dumps_and_is_an_upper_bound() -> None:
    """Every real dump (NCCL, gloo) loads; a small bomb under the floor loads too (it is bounded by
    the floor), and the same bomb past it is refused."""
    import tracemalloc

    for path in [*NCCL.glob("_dump_*"), *(NCCL.parent / "gloo-fr-hang").glob("*.pkl")]:
        safe_loads(path.read_bytes(), str(path))
    small = _bomb(b"\x8f", 100_000, "junk")
    tracemalloc.start()
    safe_loads(small)
    built = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert 100_000 * 200 < built < default_limits().min_alloc_bytes
    tight = default_limits().with_(min_alloc_bytes=built // 2, alloc_per_byte=1.0)
    with pytest.raises(PickleLoadError, match="would build"):
        safe_loads(small, "small", limits=tight)


def test_a_set_of_big_files_never_hides_the_good_dumps(tmp_path: Path, baseline: pa.Table) -> None:
    """14 sparse zero-filled files of 255 MiB beside the 16 good dumps: 15.9 GB uncapped, 'out of
    memory' for the good ones under a cap. Now the set's budget admits the smaller files first
    and the rest are refused unread; the admitted zero files are refused after their first
    bytes."""
    directory = _nccl_set(tmp_path / "set")
    names = {f"_dump_{100 + i}" for i in range(14)}
    for name in names:
        with open(directory / name, "wb") as file:
            file.truncate(255 << 20)
    dumps = read_dump_dir(directory)
    errors = _only_named(dumps, names)
    budget = [n for n, e in errors.items() if "read budget" in e and "refused unread" in e]
    zeros = [n for n, e in errors.items() if "starts with NUL bytes" in e]
    assert len(budget) + len(zeros) == 14 and budget and zeros
    assert set(dumps.ranks) == GOOD and _rows(dumps).equals(baseline)


@pytest.mark.parametrize("fast", [False, True])
def test_many_valid_dumps_beyond_the_set_budget_keep_the_small_ones(
    tmp_path: Path, baseline: pa.Table, fast: bool
) -> None:
    """Dumps each under every per-file limit but together beyond the set's budget (scaled down
    here with the limits the caller passes): the largest are refused, named, unread."""
    directory = _nccl_set(tmp_path / "set")
    real = pickle.loads((NCCL / "_dump_3").read_bytes())
    # distinct objects (a repeated reference would be pickled as one), sequence numbers going on
    entries = []
    for k in range(40):
        for entry in pickle.loads(pickle.dumps(real["entries"])):
            for key in ("record_id", "collective_seq_id", "p2p_seq_id"):
                entry[key] += k * 100_000
            entries.append(entry)
    big = {**real, "entries": entries, "pg_status": {}}
    for i in range(6):
        (directory / f"_dump_{200 + i}").write_bytes(pickle.dumps({**big, "rank": 200 + i},
                                                                  protocol=2))
    good_bytes = sum(p.stat().st_size for p in NCCL.glob("_dump_*"))
    big_bytes = (directory / "_dump_200").stat().st_size
    limits = default_limits().with_(max_set_bytes=good_bytes + 2 * big_bytes,
                                    set_bytes_per_dump=1)
    dumps = read_dump_dir(directory, fast_path=fast, limits=limits)
    errors = {Path(e.path).name: str(e) for e in dumps.errors}
    assert len(errors) == 4 and all("read budget" in e for e in errors.values()), errors
    assert set(dumps.ranks) >= GOOD and len(dumps.ranks) == 18
    good = dumps.table.filter(pa.compute.less(dumps.table["rank"], 16))
    assert _rows(good, ("pg_ranks",)).equals(baseline.drop_columns(["pg_ranks"]))


def test_the_parse_ahead_window_holds_one_big_file_at_a_time(tmp_path: Path) -> None:
    """Two workers took four 255 MB files at once (4 GB of buffers); the window is bounded by
    bytes."""
    paths = []
    for i, size in enumerate([1 << 20] * 3 + [200 << 20] * 4 + [1 << 20] * 3):
        path = tmp_path / f"f{i}"
        with open(path, "wb") as file:
            file.truncate(size)
        paths.append(path)
    busy: list[int] = []
    peak = [0]

    def load(path: Path):
        busy.append(path.stat().st_size)
        peak[0] = max(peak[0], sum(busy))
        import time

        time.sleep(0.02)
        busy.remove(path.stat().st_size)
        return path

    done = list(loaded_window(paths, load, workers=2, max_ahead_bytes=256 << 20))
    assert done == paths
    assert peak[0] <= (200 << 20) + (2 << 20)


# --- JSON dumps under the pickles' field limits


def _json_set(tmp_path: Path, rank: int, edit) -> Path:
    """The NCCL set with rank `rank`'s pickle replaced by its JSON form, edited."""
    directory = _nccl_set(tmp_path / "set")
    obj = json.loads(json.dumps(pickle.loads((NCCL / f"_dump_{rank}").read_bytes()), default=str))
    edit(obj)
    (directory / f"_dump_{rank}").unlink()
    (directory / f"rank_{rank}.json").write_text(json.dumps(obj))
    return directory


def _set_field(key: str, value, at: int = 0):
    def edit(obj: dict) -> None:
        obj["entries"][at][key] = value

    return edit


@pytest.mark.parametrize(
    "key,value",
    [("collective_seq_id", "12"), ("collective_seq_id", True), ("collective_seq_id", 3.0),
     ("collective_seq_id", -1), ("collective_seq_id", None), ("collective_seq_id", 2**62),
     ("collective_seq_id", 2**70), ("p2p_seq_id", "0"), ("p2p_seq_id", -5), ("record_id", False),
     ("op_id", 1.5), ("pg_id", "0")],
)
def test_a_json_seq_id_of_the_wrong_type_or_range_is_named_and_the_verdict_kept(
    tmp_path: Path, key: str, value
) -> None:
    """A seq id of "12", true, null or -1 was read as a number (or none) and made its rank the
    culprit, dropping the real one. Now the file is refused naming the entry and the field, and
    the analysis is that of the set without it."""
    rank = 7
    directory = _json_set(tmp_path, rank, _set_field(key, value, at=1))
    dumps = read_dump_dir(directory)
    errors = _only_named(dumps, {f"rank_{rank}.json"})
    assert f"entry 1 {key}" in errors[f"rank_{rank}.json"]
    assert set(dumps.ranks) == GOOD - {rank}
    without = _nccl_set(tmp_path / "without")
    (without / f"_dump_{rank}").unlink()
    expected = analyze_collectives(read_dump_dir(without).table)
    got = analyze_collectives(dumps.table)
    assert (got.verdict, got.culprit_ranks) == (expected.verdict, expected.culprit_ranks)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("value", [True, -1, 2**62])
def test_pickles_meet_the_same_id_limits_on_both_paths(tmp_path: Path, fast: bool, value) -> None:
    directory = _nccl_set(tmp_path / "set")
    obj = pickle.loads((NCCL / "_dump_4").read_bytes())
    obj["entries"][2]["collective_seq_id"] = value
    (directory / "_dump_4").write_bytes(pickle.dumps(obj, protocol=2))
    dumps = read_dump_dir(directory, fast_path=fast)
    errors = _only_named(dumps, {"_dump_4"})
    assert "entry 2 collective_seq_id" in errors["_dump_4"]


@pytest.mark.parametrize(
    "edit,field",
    [(_set_field("profiling_name", "n" * (5 << 20)), "entry 0 profiling_name"),
     (_set_field("input_sizes", [[2**62, 4]]), "entry 0 input_sizes"),
     (_set_field("output_sizes", [[3], [-2]]), "entry 0 output_sizes")],
    ids=["5MB-name", "dim-2^62", "negative-dim"],
)
def test_json_strings_and_dims_meet_the_pickle_limits(tmp_path: Path, edit, field: str) -> None:
    directory = _json_set(tmp_path, 9, edit)
    dumps = read_dump_dir(directory)
    errors = _only_named(dumps, {"rank_9.json"})
    assert field in errors["rank_9.json"]
    assert set(dumps.ranks) == GOOD - {9}


def test_a_json_dump_of_millions_of_empty_lists_is_refused_before_it_is_parsed(
    tmp_path: Path, baseline: pa.Table
) -> None:
    """84 MB of empty lists took 2.3 GB (28x the file); 24 MB here, refused from a count of its
    brackets."""
    directory = _nccl_set(tmp_path / "set")
    body = b'{"version": "2.9", "entries": [], "x": [' + b"[]," * 8_000_000 + b"[]]}"
    (directory / "rank_50.json").write_bytes(body)
    dumps = read_dump_dir(directory)
    errors = _only_named(dumps, {"rank_50.json"})
    assert "would build" in errors["rank_50.json"]
    assert _rows(dumps).equals(baseline)


# --- a dump whose sequence numbers contradict each other


def _flipped(rank: int, entry: int, key: str, bit: int) -> bytes:
    obj = pickle.loads((NCCL / f"_dump_{rank}").read_bytes())
    obj["entries"][entry][key] ^= 1 << bit
    return pickle.dumps(obj, protocol=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    table = read_dump_dir(_nccl_set(tmp_path_factory.mktemp("ref") / "set")).table
    return analyze_collectives(table)


@pytest.mark.parametrize(
    "rank,entry,key,bit,named,why",
    [(2, 5, "collective_seq_id", 6, 5, "after"),  # a middle entry of a group goes back
     (2, 6, "collective_seq_id", 3, 7, "after"),  # one jumps ahead: the next one is named
     (6, 10, "collective_seq_id", 2, 10, "after"),
     (1, 0, "p2p_seq_id", 6, 2, "after"),  # a p2p entry jumps ahead of the next one
     (1, 2, "p2p_seq_id", 6, 2, "last enqueued"),  # the group's last entry beyond pg_status
     (2, 10, "collective_seq_id", 8, 10, "last enqueued")],
)
@pytest.mark.parametrize("fast", [False, True])
def test_a_flipped_seq_id_is_a_named_contradiction_never_a_culprit(
    tmp_path: Path, reference, rank: int, entry: int, key: str, bit: int, named: int, why: str,
    fast: bool
) -> None:
    """One flipped bit in a non-culprit rank's seq id (a valid pickle still) made that rank, or
    innocent ones, culprits with no note (43 of 1,067 mutants). Now the dump is refused with one
    line naming the entry, the field, the group and why; the verdict names no rank that is not a
    culprit of the intact set."""
    directory = _nccl_set(tmp_path / "set")
    (directory / f"_dump_{rank}").write_bytes(_flipped(rank, entry, key, bit))
    dumps = read_dump_dir(directory, fast_path=fast)
    errors = _only_named(dumps, {f"_dump_{rank}"})
    text = errors[f"_dump_{rank}"]
    assert f"entry {named} {key}" in text and why in text and "contradict" in text, text
    got = analyze_collectives(dumps.table)
    assert rank not in got.culprit_ranks
    assert set(got.culprit_ranks) <= set(reference.culprit_ranks), got.culprit_ranks
