"""A dump whose sequence ids contradict its group's (issue 37): one flipped bit in a non-culprit
rank's seq id, still a valid pickle, made that rank or innocent ones culprits, or (the dump refused)
dropped a real culprit. Each case here is a real set (the public NCCL set, 16 ranks; real gloo sets
of 8 and 4 ranks from torchrun jobs) with one entry edited the way a flipped bit edits it; the set
is read and analysed as `faultlens analyze-hang` does. The verdict must be the intact set's, and a
dump that contradicts itself or its group is named in one line. The full families (every entry,
bit and byte) are bench/bench_seq_flips.py's.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from faultlens.attribution.detectors.hang import COLUMNS
from faultlens.attribution.detectors.hang.seq_consistency import find_contradictions
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.controller.cli.main import main
from faultlens.controller.hang_dump_dir import analyze_dump_dir
from tests.conftest import DATA_DIR

NCCL = DATA_DIR / "nccl-fr-gpu_error_2nd"  # truth: ranks 9 and 14
MESH = DATA_DIR / "device-mesh-hangs" / "raw"  # 8 ranks each
SKIP = DATA_DIR / "skip-before-history" / "raw"  # 4 and 8 ranks


def _copy(source: Path, directory: Path) -> Path:
    """The set's pickles (a JSON twin would stand in for an edited pickle)."""
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("*.json"))
    return directory


def _file(directory: Path, rank: int) -> Path:
    named = directory / f"_dump_{rank}"
    return named if named.exists() else directory / f"rank_{rank}.pkl"


def _edit(path: Path, entry: int, field: str, change) -> tuple[int, int]:
    obj = pickle.loads(path.read_bytes())
    old = obj["entries"][entry][field]
    obj["entries"][entry][field] = new = change(old)
    path.write_bytes(pickle.dumps(obj, protocol=2))
    return old, new


def _verdict(report) -> tuple[str, tuple[int, ...]]:
    return str(report.verdict), tuple(report.culprit_ranks)


_INTACT: dict[Path, tuple[str, tuple[int, ...]]] = {}


def _intact(source: Path) -> tuple[str, tuple[int, ...]]:
    if source not in _INTACT:
        dumps, report = analyze_dump_dir(source, processes=1)
        assert not dumps.errors
        _INTACT[source] = _verdict(report)
    return _INTACT[source]


def _one_line_naming(dumps, path: Path) -> str:
    errors = [str(e) for e in dumps.errors]
    assert len(errors) == 1 and "\n" not in errors[0] and path.name in errors[0], errors
    return errors[0]


# --- nothing in the file to contradict: the group's last entry, read against its peers


@pytest.mark.parametrize(
    "rank,entry,bit",
    [
        (0, 8, 4),  # TCP all_reduce 7504, the group's only entry in the dump: says 7488
        (3, 8, 12),  # the same, 3408
        (2, 9, 5),  # the expert group's all_gather 7475: says 7443
        (4, 9, 10),  # 6451
        (13, 22, 6),  # a rank of the other stage: its TCP all_reduce 7503 says 7439
        (10, 22, 6),
    ],
)
def test_a_last_entry_that_contradicts_its_group_is_named_and_read_as_unknown(
    tmp_path: Path, rank: int, entry: int, bit: int
) -> None:
    """It made that rank a culprit beside 9 and 14 with no note: its peers recorded the same
    collective between the same neighbours at another seq, and no rank at its own."""
    directory = _copy(NCCL, tmp_path / "set")
    path = _file(directory, rank)
    old, new = _edit(path, entry, "collective_seq_id", lambda v: v ^ (1 << bit))
    dumps, report = analyze_dump_dir(directory, processes=1)
    line = _one_line_naming(dumps, path)
    assert f"entry {entry} " in line and f"collective_seq_id {new} " in line, line
    assert "contradicts its group" in line and f"at seq {old}," in line, line
    assert _verdict(report) == _intact(NCCL) == ("never_joined", (9, 14))


def test_the_contradiction_names_the_group_the_peers_and_the_entry(tmp_path: Path) -> None:
    directory = _copy(NCCL, tmp_path / "set")
    _edit(_file(directory, 0), 8, "collective_seq_id", lambda v: v - 4)
    table = read_dump_dir(directory, columns=COLUMNS, max_frames=0, processes=1).table
    (found,) = find_contradictions(table)
    assert (found.rank, found.entry, found.says, found.peers_seq) == (0, 8, 7500, 7504)
    assert found.peers == (1, 2, 3) and found.op == "nccl:all_reduce"


# --- a dump refused for its own seq ids: the culprits the other dumps show stay


@pytest.mark.parametrize(
    "rank,entry,field,bit",
    [
        (1, 3, "collective_seq_id", 1),  # goes back in the default group
        (1, 5, "collective_seq_id", 4),  # the next entry goes back
        (1, 8, "collective_seq_id", 0),  # beyond the group's pg_status
        (1, 2, "p2p_seq_id", 1),  # a send beyond pg_status
        (6, 2, "collective_seq_id", 0),
        (6, 3, "p2p_seq_id", 10),
        (6, 5, "collective_seq_id", 13),
    ],
)
def test_a_refused_dump_of_a_culprits_partner_keeps_the_culprit(
    tmp_path: Path, rank: int, entry: int, field: str, bit: int
) -> None:
    """Ranks 1 and 6 are the send/recv partners of the culprits 9 and 14. With the partner's dump
    refused, the culprit 'waited on' it (a send/recv not completed) and was dropped."""
    directory = _copy(NCCL, tmp_path / "set")
    path = _file(directory, rank)
    _edit(path, entry, field, lambda v: v ^ (1 << bit))
    dumps, report = analyze_dump_dir(directory, processes=1)
    assert "contradict" in _one_line_naming(dumps, path)
    assert _verdict(report) == ("never_joined", (9, 14))
    assert rank in report.missing_dumps


@pytest.mark.parametrize("ranks", [(1,), (6,), (1, 6)])
def test_unreadable_dumps_of_the_culprits_partners_keep_the_culprits(
    tmp_path: Path, ranks: tuple[int, ...]
) -> None:
    directory = _copy(NCCL, tmp_path / "set")
    for rank in ranks:
        _file(directory, rank).write_bytes(b"\x80\x02}q\x00(X\x07\x00\x00")  # cut short
    dumps, report = analyze_dump_dir(directory, processes=1)
    assert len(dumps.errors) == len(ranks)
    assert _verdict(report) == ("never_joined", (9, 14))


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_a_refused_dump_beside_a_rank_that_wrote_none_is_not_named_for_it(
    tmp_path: Path, rank: int
) -> None:
    """A real DDP job with rank 2 stopped (SIGSTOP: no dump). With another rank's dump refused too,
    both were named below any failover; the refused one was alive to write its dump."""
    directory = _copy(DATA_DIR / "ddp-stopped-rank" / "sigstop-one-rank" / "dumps", tmp_path / "s")
    _edit(_file(directory, rank), 0, "collective_seq_id", lambda v: v + (1 << 20))
    dumps, report = analyze_dump_dir(directory, processes=1)
    assert "contradict" in _one_line_naming(dumps, _file(directory, rank))
    assert report.culprit_ranks == (2,) and report.confidence >= 0.85


# --- the family on real gloo sets: first, middle and last entries of non-culprit ranks


def _positions(path: Path) -> dict[str, int]:
    entries = pickle.loads(path.read_bytes())["entries"]
    return {"first": 0, "middle": len(entries) // 2, "last": len(entries) - 1}


@pytest.mark.parametrize(
    "dumps,rank",
    [
        (MESH / "A_tp" / "dumps", 2),
        (MESH / "H_2d42" / "dumps", 1),
        (MESH / "J_1d" / "dumps", 0),
        (DATA_DIR / "gloo-fr-hang", 1),
        (DATA_DIR / "desync-pipe-world-r1-dumps", 3),
    ],
    ids=["A_tp-8", "H_2d42-8", "J_1d-8", "hang-4", "desync-pipe-4"],
)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_flipped_seq_ids_of_gloo_sets_keep_the_verdict(
    tmp_path: Path, dumps: Path, rank: int, where: str
) -> None:
    intact = _intact(dumps)
    assert rank not in intact[1]
    directory = _copy(dumps, tmp_path / "set")
    path = _file(directory, rank)
    entry = _positions(path)[where]
    original = path.read_bytes()
    for bit in (0, 1, 3, 6):
        path.write_bytes(original)
        old, new = _edit(path, entry, "collective_seq_id", lambda v, b=bit: v ^ (1 << b))
        dumps, report = analyze_dump_dir(directory, processes=1)
        assert _verdict(report) == intact, (where, bit, old, new, [str(e) for e in dumps.errors])
        if dumps.errors:
            _one_line_naming(dumps, path)


# --- what no rule may call a contradiction


def test_no_real_set_contradicts_itself() -> None:
    """The stored real sets (NCCL, gloo meshes, skips, mismatches, a stopped rank): none has an
    entry the cross-rank check names (423 real sets with the hang corpora were checked once)."""
    sets = [NCCL, MESH / "F_skip" / "dumps", MESH / "M_skip_early" / "dumps"]
    sets += [p / "dumps" for p in sorted(SKIP.iterdir())]
    sets += [p / "dumps" for p in sorted((DATA_DIR / "completed-mismatch" / "raw").iterdir())]
    for directory in sets:
        table = read_dump_dir(directory, columns=COLUMNS, max_frames=0, processes=1).table
        assert find_contradictions(table) == (), directory


def test_one_rank_against_one_with_nothing_before_is_no_contradiction(tmp_path: Path) -> None:
    """A two-member group whose members recorded one entry each, at different seqs: nothing says
    which one is wrong (the analysis reads them as they are)."""
    directory = _copy(SKIP / "pair_4" / "dumps", tmp_path / "set")
    _edit(_file(directory, 2), 0, "collective_seq_id", lambda v: v + 64)
    obj = pickle.loads(_file(directory, 2).read_bytes())
    obj.pop("pg_status")  # (else the reader refuses it: beyond the group's last enqueued op)
    _file(directory, 2).write_bytes(pickle.dumps(obj, protocol=2))
    table = read_dump_dir(directory, columns=COLUMNS, max_frames=0, processes=1).table
    assert find_contradictions(table) == ()


def test_a_rank_whose_own_history_backs_its_seq_is_no_contradiction(tmp_path: Path) -> None:
    """Its previous collective of the group is one below: it may have skipped one (a real
    culprit); only a seq its own history does not back is questioned."""
    directory = _copy(MESH / "A_tp" / "dumps", tmp_path / "set")
    path = _file(directory, 2)
    obj = pickle.loads(path.read_bytes())
    obj.pop("pg_status")
    # every entry of the group shifted by one: consecutive in the dump, one above its peers'
    for e in obj["entries"]:
        if e["process_group"][0] == "5":
            e["collective_seq_id"] += 1
    path.write_bytes(pickle.dumps(obj, protocol=2))
    table = read_dump_dir(directory, columns=COLUMNS, max_frames=0, processes=1).table
    assert [c for c in find_contradictions(table) if c.rank == 2] == []


def test_analyze_hang_warns_in_one_line_and_keeps_the_verdict(tmp_path: Path, capsys) -> None:
    directory = _copy(NCCL, tmp_path / "set")
    _edit(_file(directory, 5), 8, "collective_seq_id", lambda v: v ^ (1 << 6))
    assert main(["analyze-hang", "--json", str(directory)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["culprit_ranks"] == [9, 14]
    warnings = [line for line in err.splitlines() if "contradicts its group" in line]
    assert len(warnings) == 1 and "_dump_5" in warnings[0], err
