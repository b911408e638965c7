"""Store segments reach Arrow as native files (collectors/store/native_read.py): Arrow reading a
Python file object calls back into Python from its own threads, and one still holding that object
as the interpreter finalises aborts the process (rc 134, "terminate called without an active
exception") after the command's output was complete. bench/cli_exit_loop.py counts the exits."""

from __future__ import annotations

import datetime as dt
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultlens.collectors.store.layout import list_segments, resolve_store
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.sink import SegmentSink
from tests.conftest import REPO_ROOT

ROOMS = ("attribution", "collectors", "controller")


@pytest.mark.parametrize("url", ["local", "memory://native-read-test"])
def test_open_segment_gives_arrow_a_native_file(store_dir, url):
    location = resolve_store(str(store_dir) if url == "local" else url, create=True)
    now = dt.datetime(2026, 11, 30, 9, tzinfo=dt.UTC)
    with SegmentSink(location) as sink:
        sink.write("gpu_events", [{"ts": now, "node": "node-1", "kind": "xid", "code": 79}])
    [path] = list_segments(location, "gpu_events")
    with open_segment(location, path) as handle:
        assert isinstance(handle, pa.NativeFile)
        assert not isinstance(handle, pa.PythonFile)
        assert pq.ParquetFile(handle).read().column("code").to_pylist() == [79]
    with open_segment(location, path) as handle:
        assert pq.read_table(handle).num_rows == 1
    with pytest.raises(FileNotFoundError):
        open_segment(location, path + ".gone")


def test_no_reader_hands_arrow_an_fsspec_file():
    """The family, by source: an fsspec `open()` whose handle goes to a pyarrow reader."""
    pattern = re.compile(
        r"with [\w.]*fs\.open\([^)]*\) as (\w+):[^\n]*\n(?:.*\n){0,3}?.*pq\.\w+\(\1"
    )
    found = []
    for room in ROOMS:
        for path in sorted((REPO_ROOT / room).rglob("*.py")):
            if pattern.search(path.read_text()):
                found.append(str(path.relative_to(REPO_ROOT)))
    assert found == []
