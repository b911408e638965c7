"""Flight-recorder dump files the reader must refuse unread or read right (issue 37), beside the
real NCCL set (16 ranks): a symlink to /proc/kmsg (procfs says a regular file of size 0, a read
blocks forever) and to other procfs files, a directory named like a dump (noted), a FIFO; a JSON
dump with a UTF-8 byte order mark (read), with a duplicate key (refused: which one is meant is not
known). The good ranks are always read; run in a subprocess with a timeout (a blocking read must
fail the test, not hang it)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from tests.test_fr_hostile import NCCL, _nccl_set, _read_in_subprocess

GOOD = 16


@pytest.mark.parametrize(
    "target",
    [
        "/proc/kmsg",
        "/proc/self/status",
        "/proc/self/environ",
        "/sys/kernel/mm/transparent_hugepage/enabled",
    ],
)
def test_a_symlink_to_a_procfs_file_is_refused_unread(tmp_path: Path, target: str) -> None:
    if not os.path.exists(target):
        pytest.skip(f"{target} not here")
    directory = _nccl_set(tmp_path / "set")
    (directory / "_dump_99").symlink_to(target)
    result = _read_in_subprocess(directory, fast=False, timeout=240)
    assert len(result["ranks"]) == GOOD
    error = result["errors"]["_dump_99"]  # one line naming the file, whatever it held
    if target.startswith("/proc/"):  # procfs: size 0, never read (a kmsg read blocks forever)
        assert "refused unread" in error


def test_a_fifo_and_a_directory_named_like_dumps(tmp_path: Path, caplog) -> None:
    directory = _nccl_set(tmp_path / "set")
    os.mkfifo(directory / "_dump_98")
    (directory / "_dump_97").mkdir()
    (directory / "_dump_97" / "x").write_bytes(b"x")
    with caplog.at_level("WARNING"):
        dumps = read_dump_dir(directory)
    assert len(dumps.ranks) == GOOD
    assert any("_dump_98" in str(e) and "not a regular file" in str(e) for e in dumps.errors)
    assert any(
        "_dump_97" in r.getMessage() and "directory" in r.getMessage() for r in caplog.records
    )


def _json_of(rank: int) -> str:
    """A real dump of the set as the JSON form torch writes (text keys, lists)."""
    obj = pickle.loads((NCCL / f"_dump_{rank}").read_bytes())
    return json.dumps(obj, default=str)


def test_a_json_dump_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir()
    marked.mkdir()
    text = _json_of(3)
    (plain / "rank_3.json").write_text(text)
    (marked / "rank_3.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
    a, b = read_dump_dir(plain), read_dump_dir(marked)
    assert not b.errors, b.errors
    assert a.table.num_rows == b.table.num_rows > 0 and list(a.ranks) == list(b.ranks)


@pytest.mark.parametrize("key", ["entries", "rank", "version", "pg_status"])
def test_a_json_dump_with_a_duplicate_key_is_refused_and_the_rest_read(
    tmp_path: Path, key: str
) -> None:
    directory = _nccl_set(tmp_path / "set")
    text = _json_of(5)
    obj = json.loads(text)
    if key not in obj:
        pytest.skip(f"no {key} in this dump")
    duplicate = text[:-1] + f', "{key}": {json.dumps(obj[key])}' + "}"
    (directory / "rank_99.json").write_text(duplicate)
    dumps = read_dump_dir(directory)
    assert len(dumps.ranks) == GOOD
    assert any("rank_99.json" in str(e) and "duplicate key" in str(e) for e in dumps.errors)
