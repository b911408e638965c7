"""The compiled scanner's tape is 32-bit (fr_fastpickle.MAX_BUFFER_BYTES): a buffer it cannot index
is declined, and the restricted unpickler reads it to the same rows. Shown on the real NCCL dump set
with the limit lowered below its files' sizes (a 2 GiB dump is not made here), against the set read
with the limit as shipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from faultlens.collectors.artifacts import fr_fastpickle
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.artifacts.flight_recorder.fastpath import dump_fast
from faultlens.collectors.artifacts.flight_recorder.files import find_dump_files

NCCL_SET = Path(__file__).parent / "data" / "nccl-fr-gpu_error_2nd"


def test_the_tape_is_32_bit_and_the_limit_is_below_its_range() -> None:
    workspace = fr_fastpickle.Workspace(1024)
    assert workspace.echild.dtype == np.int32 and workspace.head.dtype == np.int32
    # every opcode adds at most one node, edge or run: a buffer under the limit cannot overflow an
    # int32 id
    assert np.iinfo(np.int32).max > fr_fastpickle.MAX_BUFFER_BYTES + 16


def test_a_buffer_beyond_the_scanner_goes_to_the_reference_with_the_same_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = find_dump_files(NCCL_SET)[0]
    buf = np.fromfile(path, np.uint8)
    assert dump_fast(buf, path, 0) is not None  # the scanner reads it as shipped
    expected = read_dump_dir(NCCL_SET, fast_path=True)

    monkeypatch.setattr(fr_fastpickle, "MAX_BUFFER_BYTES", 1)  # every file of the set declined
    with pytest.raises(ValueError, match="32-bit"):
        fr_fastpickle.Workspace().parse(buf, 0)
    assert dump_fast(buf, path, 0) is None  # declined: the reference decides
    declined = read_dump_dir(NCCL_SET, fast_path=True)
    assert declined.errors == expected.errors == ()
    assert declined.ranks == expected.ranks
    assert declined.table.equals(expected.table)
