"""Pass 1 of the hang analysis run on the reader's chunks while they are read (stream.PassOneStream,
what `faultlens analyze-hang` does) gives the very report the analysis gives on the finished table:
on every real dump set of the hang corpus and the held-out sets, on the real NCCL set, with chunks
of many sizes (many slices, a slice per dump, one slice); and where the stream cannot be used
(chunks that are not the table's slices, a consumer that fails) the analysis runs pass 1 itself,
with the same report."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import faultlens.collectors.artifacts.flight_recorder.parts as reader_parts
from faultlens.attribution.detectors.hang import COLUMNS, analyze_collectives
from faultlens.attribution.detectors.hang.stream import PassOneStream
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.controller.hang_dump_dir import analyze_dump_dir
from tests.conftest import REPO_ROOT

pytest.importorskip("torch")

NCCL_SET = REPO_ROOT / "tests" / "data" / "nccl-fr-gpu_error_2nd"


@pytest.fixture(scope="module")
def dump_dirs() -> list[Path]:
    from tests.torch_jobs.hang_corpus.generate import corpus
    from tests.torch_jobs.hang_heldout.generate import heldout

    dirs = [path / "dumps" for path in corpus().values()] + [
        path / "dumps" for path in heldout().values()
    ]
    return [*dirs, NCCL_SET]


def _both(directory: Path) -> tuple[dict, dict, PassOneStream]:
    stream = PassOneStream()
    try:
        dumps = read_dump_dir(
            directory, columns=COLUMNS, dictionary=True, max_frames=0, on_chunk=stream
        )
        expected = range(dumps.world_size) if dumps.world_size else None
        streamed = analyze_collectives(
            dumps.table, expected_ranks=expected, first_pass=stream
        ).to_dict()
    finally:
        stream.close()
    plain = analyze_collectives(dumps.table, expected_ranks=expected).to_dict()
    return streamed, plain, stream


@pytest.mark.parametrize("chunk_rows", [1 << 20, 700, 97])
def test_streamed_pass_one_gives_the_same_report(dump_dirs: list[Path], chunk_rows: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_parts, "CHUNK_ROWS", chunk_rows)  # 97 rows: a chunk per dump
    used = 0
    for directory in dump_dirs:
        streamed, plain, stream = _both(directory)
        assert streamed == plain, directory
        used += stream.used
    assert used == len(dump_dirs)


def test_a_stream_whose_chunks_are_not_the_slices_is_not_used() -> None:
    stream = PassOneStream()
    dumps = read_dump_dir(NCCL_SET, columns=COLUMNS, dictionary=True, max_frames=0, on_chunk=stream)
    rows = dumps.table.num_rows
    # other slice bounds
    rechunked = pa.Table.from_batches(dumps.table.to_batches(max_chunksize=rows // 3 + 1))
    assert rechunked.column("rank").num_chunks == 3
    assert stream.take(rechunked) is None
    assert not stream.used
    assert analyze_collectives(rechunked, first_pass=PassOneStream()).to_dict() == \
        analyze_collectives(dumps.table).to_dict()


def test_a_failing_stream_costs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = PassOneStream()

    def broken(*_args: object) -> None:
        raise RuntimeError("decode failed")

    monkeypatch.setattr(stream._decoder, "decode_part", broken)
    dumps = read_dump_dir(NCCL_SET, columns=COLUMNS, dictionary=True, max_frames=0, on_chunk=stream)
    assert stream.take(dumps.table) is None
    assert (
        analyze_collectives(dumps.table, first_pass=stream).to_dict()
        == analyze_collectives(dumps.table).to_dict()
    )


def test_a_failing_consumer_never_stops_the_read() -> None:
    calls = []

    def consumer(start: int, chunk: pa.Table, share: float) -> None:
        calls.append((start, share))
        raise RuntimeError("consumer failed")

    dumps = read_dump_dir(
        NCCL_SET, columns=COLUMNS, dictionary=True, max_frames=0, on_chunk=consumer
    )
    assert calls == [(0, 1.0)]
    assert (
        dumps.table.num_rows
        == read_dump_dir(NCCL_SET, columns=COLUMNS, dictionary=True).table.num_rows
    )


def test_analyze_dump_dir_is_the_read_then_the_analysis(dump_dirs: list[Path]) -> None:
    for directory in (NCCL_SET, dump_dirs[0]):
        dumps, report = analyze_dump_dir(directory)
        plain = read_dump_dir(directory, columns=COLUMNS, dictionary=True, max_frames=0)
        assert dumps.ranks == plain.ranks
        expected = range(plain.world_size) if plain.world_size else None
        assert (
            report.to_dict() == analyze_collectives(plain.table, expected_ranks=expected).to_dict()
        )
    # one rank more than dumped: a missing dump
    _, wider = analyze_dump_dir(NCCL_SET, expected_ranks=range(17))
    assert wider.to_dict()["missing_dumps"] == [16]
    assert wider.culprit_ranks == (9, 14)
