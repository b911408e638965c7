"""How the flight-recorder reader reads files: a dump is read by its stat size (a file that grew
since the stat is read again, whole), and the threads parse ahead of the assembly by a byte budget,
in file order. On the real NCCL dumps in tests/data."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from faultlens.collectors.artifacts.flight_recorder import files as fr_files
from faultlens.collectors.artifacts.flight_recorder import find_dump_files, read_dump_dir
from faultlens.collectors.artifacts.flight_recorder import parts as fr_parts
from tests.conftest import DATA_DIR

NCCL_SET = DATA_DIR / "nccl-fr-gpu_error_2nd"


def test_a_dump_that_grows_between_stat_and_read_is_read_whole(tmp_path: Path, monkeypatch) -> None:
    whole = read_dump_dir(NCCL_SET).table
    copy = tmp_path / "dumps"
    shutil.copytree(NCCL_SET, copy)
    target = copy / "_dump_3"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])  # the stat sees half of it
    real_read = fr_files._read_bytes
    grown: list[str] = []

    def read_after_growth(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path) == target and not grown:
            target.write_bytes(data)  # the writer finishes between the reader's stat and its read
            grown.append(str(path))
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(fr_files, "_read_bytes", read_after_growth)
    dumps = read_dump_dir(copy, workers=1)
    assert grown and not dumps.errors, dumps.errors
    assert dumps.table.num_rows == whole.num_rows


def test_parse_ahead_is_bounded_by_bytes_and_keeps_file_order(monkeypatch) -> None:
    files = find_dump_files(NCCL_SET)
    started: list[Path] = []
    lock = threading.Lock()

    def load(path: Path) -> Path:
        with lock:
            started.append(path)
        return path

    workers = 2
    # a budget below one file: the window is its floor, two files per thread
    monkeypatch.setattr(fr_parts, "PARSE_AHEAD_BYTES", 1)
    seen = []
    for taken, result in enumerate(fr_parts._loaded(files, load, workers), start=1):
        seen.append(result)
        with lock:
            assert len(started) <= taken - 1 + 2 * workers
    assert seen == files
    # a budget above the whole set: every file is handed to the threads before the first result is
    # taken
    monkeypatch.setattr(fr_parts, "PARSE_AHEAD_BYTES", 1 << 40)
    started.clear()
    iterator = fr_parts._loaded(files, load, workers)
    first = next(iterator)
    # submitted before the first result; the threads start them as they can
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(started) < len(files):
        time.sleep(0.01)
    assert len(started) == len(files)
    assert [first, *iterator] == files
