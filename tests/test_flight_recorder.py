"""The flight-recorder reader on the real public NCCL set, on real gloo dumps from torchrun, and on
NCCL-flavoured dump sets built from the reference's fields (pickle and JSON, every 2.x version, odd
file names, broken files)."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faultlens.attribution.reading.store import Store
from faultlens.collectors.artifacts.flight_recorder import (
    DumpDirError,
    DumpFileError,
    find_dump_files,
    rank_from_name,
    read_dump_dir,
    read_dump_file,
)
from faultlens.collectors.artifacts.safe_pickle import safe_load
from faultlens.collectors.store.schema import TABLES
from tests import fr_builders as fb
from tests.conftest import DATA_DIR, REPO_ROOT

NCCL_SET = DATA_DIR / "nccl-fr-gpu_error_2nd"
GLOO_SCENARIOS = ("hang", "subgroup_hang", "mismatch", "crash_sigkill", "crash_exception")


def _entries(table: pa.Table) -> pa.Table:
    return table.filter(table.column("record_id").is_valid())


def _small_set(version: str = "2.9") -> dict[int, dict]:
    config = fb.pg_config(
        {"0": ("default_pg", [0, 1, 2, 3]), "5": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1])}
    )
    dumps = {}
    for rank in range(4):
        entries = [fb.entry(record_id=i, seq=i + 1, t=fb.T0 + i * 10**6) for i in range(3)]
        if rank in (0, 1):
            entries.append(
                fb.entry(
                    record_id=3,
                    seq=1,
                    group=("5", "TENSOR_MODEL_PARALLEL_GROUP"),
                    pg_id=1,
                    op="nccl:_all_gather_base",
                    sizes=[[2048, 5120]],
                    out_sizes=[[4096, 5120]],
                    dtype="BFloat16",
                    state="started",
                )
            )
        dumps[rank] = fb.dump(entries, config, version=version)
    return dumps


# -- the real NCCL set


def test_real_nccl_set_reads_every_rank_and_every_entry() -> None:
    dumps = read_dump_dir(NCCL_SET)
    assert dumps.ranks == tuple(range(16))
    assert dumps.errors == ()
    entries = _entries(dumps.table)
    expected = sum(len(safe_load(NCCL_SET / f"_dump_{r}")["entries"]) for r in range(16))
    assert entries.num_rows == expected == 278
    assert dumps.table.schema.equals(TABLES["collectives"], check_metadata=False)
    first = entries.filter(pa.compute.equal(entries.column("rank"), 9)).slice(0, 1).to_pylist()[0]
    assert (
        first["pg_name"] == "37"
        and first["pg_desc"] == "TENSOR_MODEL_PARALLEL_GROUP"
        and first["pg_id"] == "5"
    )
    assert first["collective_seq_id"] == 87749 and first["op"] == "nccl:_all_gather_base"
    assert first["input_sizes"] == [[2048, 1, 5120]] and first["output_sizes"] == [[8192, 1, 5120]]
    assert (
        first["state"] == "scheduled" and first["retired"] is False and first["comm_lib"] == "nccl"
    )
    assert first["pg_last_enqueued"] == 87760 and first["pg_last_completed"] == 87748
    assert first["fr_version"] == "2.9" and first["dump_id"] == "nccl-fr-gpu_error_2nd/_dump_9"
    carried = {
        (row["pg_name"], tuple(row["pg_ranks"]))
        for row in dumps.table.filter(dumps.table.column("pg_ranks").is_valid())
        .select(["pg_name", "pg_ranks"])
        .to_pylist()
    }
    assert ("37", (8, 9, 10, 11)) in carried and ("0", tuple(range(16))) in carried
    assert len({name for name, _ in carried}) == len(carried)  # once per group


def test_fast_scanner_and_restricted_unpickler_give_the_same_rows() -> None:
    fast = read_dump_dir(NCCL_SET, fast_path=True).table
    slow = read_dump_dir(NCCL_SET, fast_path=False).table
    assert fast.equals(slow)


# -- built NCCL-flavoured sets, pickle and JSON


def test_pickle_and_json_forms_give_the_same_rows(tmp_path: Path) -> None:
    dumps = _small_set()
    from_pickle = read_dump_dir(fb.write_set(tmp_path / "p", dumps)).table
    from_json = read_dump_dir(
        fb.write_set(tmp_path / "j", dumps, fmt="json", name="rank_{rank}.json")
    ).table
    drop = ["frames", "dump_id"]
    assert from_pickle.drop_columns(drop).equals(from_json.drop_columns(drop))
    rows = _entries(from_pickle).to_pylist()
    tp = [r for r in rows if r["pg_name"] == "5"]
    assert [r["rank"] for r in tp] == [0, 1]
    assert (
        tp[0]["state"] == "started"
        and tp[0]["time_started"] is not None
        and tp[0]["time_completed"] is None
    )
    assert tp[0]["input_dtypes"] == ["BFloat16"] and tp[0]["output_sizes"] == [[4096, 5120]]
    assert rows[0]["frames"] == ["all_reduce (/opt/torch/distributed/distributed_c10d.py:3245)",
                                 "forward (/workspace/model/layers.py:513)"]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_pickle_protocol_reads_the_same(tmp_path: Path, protocol: int) -> None:
    dumps = _small_set()
    reference = read_dump_dir(fb.write_set(tmp_path / "ref", dumps), fast_path=False).table
    table = read_dump_dir(
        fb.write_set(tmp_path / "p", dumps, protocol=protocol), fast_path=True
    ).table
    assert table.drop_columns(["dump_id"]).equals(reference.drop_columns(["dump_id"]))


@pytest.mark.parametrize("version", ["2.0", "2.2", "2.9", "2.10"])
def test_format_versions_2x_are_read(tmp_path: Path, version: str) -> None:
    dumps = read_dump_dir(fb.write_set(tmp_path, _small_set(version)))
    assert dumps.errors == () and set(dumps.table.column("fr_version").to_pylist()) == {version}


@pytest.mark.parametrize("version", ["1.5", "3.0", "latest"])
def test_other_versions_are_refused_naming_the_file(tmp_path: Path, version: str) -> None:
    sets = _small_set()
    sets[2]["version"] = version
    dumps = read_dump_dir(fb.write_set(tmp_path, sets))
    assert dumps.ranks == (0, 1, 3)
    assert (
        len(dumps.errors) == 1
        and "_dump_2" in str(dumps.errors[0])
        and version in str(dumps.errors[0])
    )


def test_file_names_and_the_pickle_json_twin_rule(tmp_path: Path) -> None:
    sets = _small_set()
    fb.write_set(tmp_path, {0: sets[0]}, name="_dump_{rank}")
    fb.write_set(tmp_path, {1: sets[1]}, name="comm_lib_trace_rank_{rank}")
    fb.write_set(tmp_path, {2: sets[2]}, name="rank_{rank}.pkl")
    fb.write_set(tmp_path, {2: sets[2]}, fmt="json", name="rank_{rank}.json")
    fb.write_set(tmp_path, {3: sets[3]}, fmt="json", name="rank_{rank}.json")
    (tmp_path / ".rank_5.pkl.123.tmp").write_bytes(b"partial")  # a dump being written: ignored
    (tmp_path / "LICENSE.txt").write_text("not a dump")
    assert [rank_from_name(p) for p in find_dump_files(tmp_path)] == [0, 1, 2, 2, 3]
    dumps = read_dump_dir(tmp_path)
    assert dumps.ranks == (0, 1, 2, 3) and dumps.errors == ()
    assert [Path(f).name for f in dumps.files] == [
        "_dump_0",
        "comm_lib_trace_rank_1",
        "rank_2.pkl",
        "rank_3.json",
    ]
    assert [Path(f).name for f in dumps.skipped] == ["rank_2.json"]
    assert set(
        dumps.table.filter(pa.compute.equal(dumps.table.column("rank"), 2))
        .column("dump_id")
        .to_pylist()
    ) == {f"{tmp_path.name}/rank_2.pkl"}


def test_top_level_rank_wins_over_the_file_name(tmp_path: Path) -> None:
    sets = _small_set()
    sets[0]["rank"] = 7
    fb.write_set(tmp_path, {0: sets[0]}, name="dump.pkl")
    assert read_dump_dir(tmp_path).ranks == (7,)


@pytest.mark.parametrize("fast_path", [True, False])
def test_truncated_corrupt_and_hostile_dumps_are_named_and_the_rest_still_read(
    tmp_path: Path, fast_path: bool
) -> None:
    sets = {
        rank: fb.dump([fb.entry(record_id=0, seq=1)], fb.pg_config({"0": ("default_pg", range(6))}))
        for rank in range(6)
    }
    fb.write_set(tmp_path, sets)
    full = (tmp_path / "_dump_1").read_bytes()
    (tmp_path / "_dump_1").write_bytes(full[: len(full) // 2])  # truncated
    # cut inside a string
    (tmp_path / "_dump_2").write_bytes(b"\x80\x02}q\x00(X\x07\x00\x00\x00entr")
    (tmp_path / "_dump_3").write_bytes(
        b"cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR."
    )
    # not a dump
    (tmp_path / "_dump_4").write_bytes(pickle.dumps({"something": "else"}, protocol=2))
    dumps = read_dump_dir(tmp_path, fast_path=fast_path)
    assert dumps.ranks == (0, 5)
    messages = {Path(e.path).name: e.problem for e in dumps.errors}
    assert set(messages) == {"_dump_1", "_dump_2", "_dump_3", "_dump_4"}
    assert "truncated" in messages["_dump_1"]
    assert "refused global os.system" in messages["_dump_3"]
    assert "not a flight-recorder dump" in messages["_dump_4"]
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(DumpFileError, match="_dump_1"):
        read_dump_file(tmp_path / "_dump_1")


def test_a_broken_pickle_falls_back_to_its_json_twin(tmp_path: Path) -> None:
    sets = _small_set()
    fb.write_set(tmp_path, sets, name="rank_{rank}.pkl")
    fb.write_set(tmp_path, {1: sets[1]}, fmt="json", name="rank_{rank}.json")
    (tmp_path / "rank_1.pkl").write_bytes(b"\x80\x02garbage")
    dumps = read_dump_dir(tmp_path)
    assert dumps.ranks == (0, 1, 2, 3) and dumps.errors == ()
    assert f"{tmp_path.name}/rank_1.json" in dumps.table.column("dump_id").to_pylist()


def test_empty_and_missing_directories(tmp_path: Path) -> None:
    with pytest.raises(DumpDirError, match="no such directory"):
        read_dump_dir(tmp_path / "nope")
    with pytest.raises(DumpDirError, match="no flight-recorder dumps"):
        read_dump_dir(tmp_path)


def test_a_dump_without_entries_is_still_present(tmp_path: Path) -> None:
    sets = _small_set()
    sets[3]["entries"] = []
    dumps = read_dump_dir(fb.write_set(tmp_path, sets))
    assert 3 in dumps.ranks
    rows = dumps.table.filter(pa.compute.equal(dumps.table.column("rank"), 3)).to_pylist()
    assert rows and all(r["record_id"] is None for r in rows)


def test_gloo_style_broken_pg_config_is_rebuilt_from_entries(tmp_path: Path) -> None:
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("undefined", (2, 3))}
    job = fb.Job(groups, [fb.Step("0"), fb.Step("1")], steps=2, comm="gloo")
    sets = job.run()
    for top in sets.values():
        top["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}  # as gloo writes it
        top.pop("rank")
    dumps = read_dump_dir(fb.write_set(tmp_path, sets, name="rank_{rank}"))
    carried = dumps.table.filter(dumps.table.column("pg_ranks").is_valid()).select(
        ["pg_name", "pg_ranks"]
    )
    assert sorted(map(tuple, (r.values() for r in carried.to_pylist()))) == [
        ("0", [0, 1, 2, 3]),
        ("1", [2, 3]),
    ]
    assert set(_entries(dumps.table).column("comm_lib").to_pylist()) == {"gloo"}


# -- real gloo dumps written by torchrun jobs


@pytest.mark.parametrize("scenario", GLOO_SCENARIOS)
def test_real_gloo_dumps_read_with_repaired_and_raw_pg_config(
    torch_artifacts: dict[str, Path], scenario: str, tmp_path: Path
) -> None:
    directory = torch_artifacts[scenario] / "dumps"
    meta = json.loads((torch_artifacts[scenario] / "meta.json").read_text())
    dumps = read_dump_dir(directory)
    written = sorted(rank_from_name(p) for p in directory.glob("rank_*.pkl"))
    assert dumps.errors == () and list(dumps.ranks) == written
    assert [Path(f).suffix for f in dumps.files] == [".pkl"] * len(written)
    entries = _entries(dumps.table)
    assert set(entries.column("comm_lib").to_pylist()) == {"gloo"}
    assert set(entries.column("fr_version").to_pylist()) == {"2.10"}
    members = {r["pg_name"]: r["pg_ranks"] for r in
               dumps.table.filter(dumps.table.column("pg_ranks").is_valid()).to_pylist()}
    assert members["0"] == list(range(meta["world_size"]))
    if "1" in members:
        assert members["1"] == [2, 3]
    # the same dumps as gloo writes them: pg_config keyed '' with ranks '[]'; membership comes from
    # the entries
    raw = tmp_path / "raw"
    raw.mkdir()
    for path in directory.glob("rank_*.pkl"):
        top = safe_load(path)
        top["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        for key in ("rank", "world_size", "node"):
            top.pop(key, None)
        (raw / path.stem).write_bytes(pickle.dumps(top, protocol=2))
    rebuilt = read_dump_dir(raw)
    assert rebuilt.ranks == dumps.ranks
    rebuilt_members = {
        r["pg_name"]: r["pg_ranks"]
        for r in rebuilt.table.filter(rebuilt.table.column("pg_ranks").is_valid()).to_pylist()
    }
    assert rebuilt_members.get("1", [2, 3]) == [2, 3]
    assert rebuilt_members["0"] == list(range(max(dumps.ranks) + 1))
    cols = ["rank", "record_id", "collective_seq_id", "op", "input_sizes", "pg_name"]
    assert _entries(rebuilt.table).select(cols).equals(entries.select(cols))


def test_real_gloo_pickle_and_json_dumps_agree(
    torch_artifacts: dict[str, Path], tmp_path: Path
) -> None:
    directory = torch_artifacts["hang"] / "dumps"
    only_json = tmp_path / "json"
    only_json.mkdir()
    for path in directory.glob("rank_*.json"):
        shutil.copy(path, only_json / path.name)
    cols = [
        "rank",
        "record_id",
        "pg_name",
        "pg_desc",
        "collective_seq_id",
        "op",
        "state",
        "retired",
        "time_created",
        "input_sizes",
        "input_dtypes",
        "pg_last_enqueued",
        "pg_last_completed",
    ]
    from_pickle = _entries(read_dump_dir(directory).table).select(cols)
    from_json = _entries(read_dump_dir(only_json).table).select(cols)
    assert from_pickle.equals(from_json)


# -- the scanner against the restricted unpickler on arbitrary plain data

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8)
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(extra=st.dictionaries(st.text(max_size=6), _scalars, max_size=4),
       seqs=st.lists(st.integers(0, 2**40), min_size=0, max_size=6),
       protocol=st.sampled_from([2, 4, 5]))
def test_scanner_matches_the_unpickler_on_generated_dumps(
    tmp_path: Path, extra: dict, seqs: list[int], protocol: int
) -> None:
    entries = [fb.entry(record_id=i, seq=s, state="completed" if i % 2 else "scheduled") | extra
               for i, s in enumerate(seqs)]
    top = fb.dump(entries, fb.pg_config({"0": ("default_pg", [0])}), rank=0) | {"note": extra}
    directory = tmp_path / f"d{protocol}-{len(seqs)}-{abs(hash(str(extra))) % 10**6}"
    fb.write_set(directory, {0: top}, protocol=protocol)
    fast = read_dump_dir(directory, workers=1, fast_path=True).table
    slow = read_dump_dir(directory, workers=1, fast_path=False).table
    assert fast.equals(slow)


# -- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_ingest_fr_writes_the_store_and_names_bad_files(
    tmp_path: Path, store_dir: Path
) -> None:
    directory = tmp_path / "dumps"
    shutil.copytree(NCCL_SET, directory)
    (directory / "_dump_16").write_bytes((directory / "_dump_3").read_bytes()[:500])
    result = _cli(
        "ingest",
        "fr",
        str(directory),
        "--store",
        str(store_dir),
        "--job",
        "job-7",
        "--node",
        "node-a",
    )
    assert result.returncode == 1, result.stderr
    assert "_dump_16" in result.stderr and "truncated" in result.stderr
    assert "ranks 0-15" in result.stdout
    table = Store(str(store_dir)).query("SELECT rank, job_id, node, collective_seq_id FROM "
                                        "collectives "
                                        "WHERE record_id IS NOT NULL")
    assert table.num_rows == 278
    assert set(table.column("job_id").to_pylist()) == {"job-7"} and set(
        table.column("node").to_pylist()
    ) == {"node-a"}


def test_cli_ingest_fr_bad_directory_is_one_line_and_non_zero(
    tmp_path: Path, store_dir: Path
) -> None:
    result = _cli("ingest", "fr", str(tmp_path / "missing"), "--store", str(store_dir))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such directory" in result.stderr


def test_reading_in_several_processes_gives_the_same_rows() -> None:
    one = read_dump_dir(NCCL_SET).table
    several = read_dump_dir(NCCL_SET, processes=3).table
    assert several.equals(one)
