"""Hostile torch error files (issue 37): nested 100k deep, a timestamp no clock holds, a 20 MB
callstack, a FIFO named error.json: one ProcessEventsError naming the file each, never a traceback
or a blocked read; a real error file beside them still gives its row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from faultlens.collectors.sources.process_events.error_file import (
    MAX_ERROR_FILE_BYTES,
    rows_from_error_file,
)
from faultlens.collectors.sources.process_events.rows import ProcessEventsError

GOOD = {
    "message": {
        "message": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "extraInfo": {
            "py_callstack": 'Traceback (most recent call last):\n  File "train.py", line 9, in '
            "<module>\n    main()\nRuntimeError: CUDA error: an illegal memory access was "
            "encountered\n",
            "timestamp": "1764504000",
        },
        "errorCode": 1,
    }
}


def _hostile(kind: str, path: Path) -> None:
    if kind == "deep-list":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "deep-object":
        path.write_text('{"message": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001)
    elif kind.startswith("timestamp"):
        value = {"timestamp-neg": -1e18, "timestamp-big": 1e300, "timestamp-inf": "inf"}[kind]
        doc = json.loads(json.dumps(GOOD))
        doc["message"]["extraInfo"]["timestamp"] = value
        path.write_text(json.dumps(doc))
    elif kind == "huge-callstack":
        doc = json.loads(json.dumps(GOOD))
        doc["message"]["extraInfo"]["py_callstack"] = "x" * (MAX_ERROR_FILE_BYTES + 10)
        path.write_text(json.dumps(doc))
    elif kind == "fifo":
        os.mkfifo(path)
    else:  # pragma: no cover
        raise ValueError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "deep-list",
        "deep-object",
        "timestamp-neg",
        "timestamp-big",
        "timestamp-inf",
        "huge-callstack",
        "fifo",
    ],
)
def test_a_hostile_error_file_is_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    bad = tmp_path / f"{kind}-error.json"
    _hostile(kind, bad)
    with pytest.raises(ProcessEventsError) as info:
        rows_from_error_file(bad)
    message = str(info.value)
    assert message.startswith(str(bad)) and "\n" not in message
    good = tmp_path / "error.json"
    good.write_text(json.dumps(GOOD))
    (row,) = rows_from_error_file(good)
    assert row["exception_type"] == "RuntimeError"
