"""The dictionary read's narrow layout (what `faultlens analyze-hang` reads): dictionary indices as
narrow as each dictionary's size allows, the sizes and dtypes lists of inputs and outputs as codes
of shared set-wide dictionaries, and record_id, collective_seq_id, p2p_seq_id, op_id, timeout_ms
as int32 in a chunk whose values fit. The values are the plain read's, chunk widths that differ are
made one, and the analysis answers as on the plain table."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import faultlens.collectors.artifacts.flight_recorder.parts as reader_parts
from faultlens.attribution.detectors.hang import COLUMNS, analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.controller.hang_dump_dir import analyze_dump_dir
from tests.conftest import REPO_ROOT
from tests.fr_builders import dump, entry, pg_config, write_set

NCCL_SET = REPO_ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"


def _same_values(coded: pa.Table, plain: pa.Table) -> None:
    assert coded.column_names == plain.column_names
    for name in coded.column_names:
        assert coded.column(name).to_pylist() == plain.column(name).to_pylist(), name


@pytest.mark.parametrize("processes", [1, 2])
def test_the_narrow_read_holds_the_plain_reads_values(processes: int) -> None:
    plain = read_dump_dir(NCCL_SET, columns=COLUMNS).table
    coded = read_dump_dir(NCCL_SET, columns=COLUMNS, dictionary=True, processes=processes).table
    _same_values(coded, plain)
    for name in ("pg_name", "op", "state", "input_sizes", "output_sizes", "output_dtypes"):
        assert coded.schema.field(name).type.index_type == pa.int8(), name  # a few values each
    for name in ("record_id", "collective_seq_id", "p2p_seq_id"):
        assert coded.schema.field(name).type == pa.int32(), name
        assert plain.schema.field(name).type == pa.int64(), name


def _wide_set(directory: Path, ranks: int = 4, groups_per_rank: int = 50) -> Path:
    """Each rank in groups of its own (ranks x groups_per_rank names: over 127, so a later chunk's
    pg_name indices are wider than the first's) and the default group; the last rank's record ids
    and every seq id of the default group beyond int32's room (its chunk stays int64)."""
    big = 1 << 33
    dumps = {}
    for rank in range(ranks):
        own = {
            f"g{rank}_{k}": ("TENSOR_MODEL_PARALLEL_GROUP", [rank]) for k in range(groups_per_rank)
        }
        config = pg_config({"0": ("default_pg", list(range(ranks))), **own})
        base = big if rank == ranks - 1 else 0
        entries = [
            entry(
                record_id=base + k,
                seq=1,
                group=(name, "TENSOR_MODEL_PARALLEL_GROUP"),
                pg_id=1 + k,
                p2p_seq=k,
            )
            for k, name in enumerate(own)
        ]
        entries += [
            entry(record_id=base + len(own) + s, seq=big + s, state="scheduled", retired=False)
            for s in range(3 if rank else 2)
        ]
        dumps[rank] = dump(entries, config, rank=rank)
    return write_set(directory, dumps)


def test_chunks_of_other_widths_are_made_one_and_keep_their_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = _wide_set(tmp_path / "set")
    monkeypatch.setattr(reader_parts, "CHUNK_ROWS", 1)  # a chunk per dump
    plain = read_dump_dir(directory, columns=COLUMNS).table
    coded = read_dump_dir(directory, columns=COLUMNS, dictionary=True)
    assert coded.table.column("pg_name").num_chunks == 4
    _same_values(coded.table, plain)
    assert coded.table.schema.field("pg_name").type.index_type == pa.int16()
    assert coded.table.schema.field("record_id").type == pa.int64()  # the last dump's need it
    assert coded.table.schema.field("collective_seq_id").type == pa.int64()


def test_the_analysis_answers_on_the_narrow_read_as_on_the_plain_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for directory in (NCCL_SET, _wide_set(tmp_path / "set")):
        want = analyze_collectives(read_dump_dir(directory).table).to_dict()
        monkeypatch.setattr(reader_parts, "CHUNK_ROWS", 1)
        _, got = analyze_dump_dir(directory)
        monkeypatch.undo()
        assert got.to_dict() == want
    # the real set's culprits (ranks 9 and 14 had GPU errors)
    _, report = analyze_dump_dir(NCCL_SET)
    assert list(report.culprit_ranks) == [9, 14]
