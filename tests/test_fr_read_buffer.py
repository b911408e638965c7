"""The reader's per-thread read buffer (flight_recorder/files.py _read_bytes): each file is read
into a buffer the thread keeps, so nothing a dump keeps may point into it. Two different files read
one after the other in one thread (both orders, a larger one then a smaller one) give the same rows
as each read alone in a thread of its own, and no array of a dump shares memory with the buffer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from faultlens.collectors.artifacts.flight_recorder import files as fr_files
from faultlens.collectors.artifacts.flight_recorder.assembly import Assembly
from faultlens.collectors.artifacts.flight_recorder.model import SCHEMA, Dump, DumpFileError
from faultlens.collectors.artifacts.fr_limits import default_limits
from tests import fr_builders as fb


def _dumps(directory: Path) -> dict[str, Path]:
    """Three pickles of different sizes and contents (big > mid > small) and the JSON form of the
    big one.
    """
    groups = {"0": ("default_pg", tuple(range(8))), "3": ("TENSOR_MODEL_PARALLEL_GROUP", (0, 1))}
    big = fb.dump(
        [
            fb.entry(
                record_id=i,
                seq=i,
                op="nccl:all_gather",
                state="scheduled" if i == 59 else "completed",
            )
            for i in range(60)
        ],
        fb.pg_config(groups),
        rank=2,
    )
    mid = fb.dump(
        [
            fb.entry(
                record_id=i,
                seq=i,
                group=("3", "TENSOR_MODEL_PARALLEL_GROUP"),
                pg_id=3,
                dtype="Half",
            )
            for i in range(25)
        ],
        fb.pg_config({"3": groups["3"]}),
        rank=1,
    )
    small = fb.dump(
        [fb.entry(record_id=7, seq=7, op="nccl:broadcast", state="started")],
        fb.pg_config(groups),
        rank=0,
    )
    fb.write_set(directory, {2: big, 1: mid, 0: small})
    fb.write_set(directory, {2: big}, fmt="json", name="rank_{rank}.json")
    paths = {
        "big": directory / "_dump_2",
        "mid": directory / "_dump_1",
        "small": directory / "_dump_0",
        "json": directory / "rank_2.json",
    }
    sizes = [paths[k].stat().st_size for k in ("big", "mid", "small")]
    assert sizes == sorted(sizes, reverse=True), sizes
    return paths


def _table(dump: Dump) -> pa.Table:
    assembly = Assembly(columns=set(SCHEMA.names), dictionary=False, compiled=dump.fmt == "pickle")
    assembly.add(dump, f"set/{dump.path.name}")
    return assembly.table(None)


def _in_new_thread(fn: Any) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def _arrays(value: Any) -> list[np.ndarray]:
    """Every numpy array a dump holds (its fields, columns and their nested tuples, lists and
    dicts).
    """
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _arrays(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [a for name in value.__dataclass_fields__ for a in _arrays(getattr(value, name))]
    return []


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize(
    "order",
    [
        ("big", "small"),
        ("small", "big"),
        ("big", "mid", "small"),
        ("small", "mid", "big"),
        ("json", "small"),
        ("small", "json", "mid"),
    ],
)
def test_a_reused_buffer_never_leaks_into_another_dump(
    tmp_path: Path, order: tuple[str, ...], fast_path: bool
) -> None:
    paths = _dumps(tmp_path)
    limits = default_limits()
    alone = {name: _in_new_thread(
        lambda name=name: _table(fr_files.load_file(paths[name], 8, fast_path, limits)))
        for name in order}

    def in_turn() -> tuple[list[Dump], np.ndarray]:
        dumps = [fr_files.load_file(paths[name], 8, fast_path, limits) for name in order]
        return dumps, fr_files._local.read_buffer

    dumps, buffer = _in_new_thread(in_turn)
    # assembled after every read: the buffer holds the last file
    for name, dump in zip(order, dumps, strict=True):
        assert not any(np.shares_memory(array, buffer) for array in _arrays(dump)), name
        table = _table(dump)
        assert table.equals(alone[name]), name
        assert table.num_rows > 0


def test_files_beyond_the_reused_size_and_a_growing_buffer(tmp_path: Path, monkeypatch) -> None:
    paths = _dumps(tmp_path)
    limits = default_limits()
    alone = {name: _table(fr_files.load_file(paths[name], 8, True, limits))
             for name in ("big", "small")}
    monkeypatch.setattr(fr_files, "_REUSED_MAX_BYTES", paths["small"].stat().st_size + 1)

    def in_turn() -> list[tuple[pa.Table, bool]]:
        out = []
        for name in ("small", "big", "small"):  # the big file gets an array of its own
            dump = fr_files.load_file(paths[name], 8, True, limits)
            out.append((_table(dump), fr_files._local.read_buffer is not None))
        return out

    tables = _in_new_thread(in_turn)
    assert [
        t.equals(alone[n]) for (t, _), n in zip(tables, ("small", "big", "small"), strict=True)
    ] == [True] * 3
    # a buffer too small is replaced by a larger one
    monkeypatch.setattr(fr_files, "_REUSED_MAX_BYTES", 16 << 20)
    fr_files._local.read_buffer = np.empty(16, np.uint8)
    try:
        assert _table(fr_files.load_file(paths["big"], 8, True, limits)).equals(alone["big"])
        assert fr_files._local.read_buffer.shape[0] >= paths["big"].stat().st_size + 1
    finally:
        fr_files._local.read_buffer = None


def test_empty_unreadable_and_non_regular_files_keep_their_errors(tmp_path: Path) -> None:
    limits = default_limits()
    empty = tmp_path / "_dump_0"
    empty.write_bytes(b"")
    with pytest.raises(DumpFileError, match="empty file"):
        fr_files.load_file(empty, 8, True, limits)
    missing = tmp_path / "_dump_1"
    with pytest.raises(DumpFileError, match="cannot read"):
        fr_files.load_file(missing, 8, True, limits)
    fifo = tmp_path / "_dump_2"
    import os

    os.mkfifo(fifo)
    with pytest.raises(DumpFileError, match="not a regular file"):
        fr_files.load_file(fifo, 8, True, limits)
