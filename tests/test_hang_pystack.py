"""Python stacks of rank processes (collectors/sources/pystack.py): a real process' py-spy stack
says where it is, bad stack files are named and never raise, the supervisor's helper takes the
stacks of the pids in a dump directory, and the analysis takes stacks from the table's metadata."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlens.attribution.detectors.hang import (
    HangVerdict,
    analyze_collectives,
    attach_stacks,
    stacks_from_metadata,
)
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import (
    MAX_STACK_BYTES,
    ProcessStack,
    StackPlace,
    capture,
    capture_dump_dir_stacks,
    load_stack_dir,
    parse_py_spy,
    py_spy_path,
    where,
)
from tests import fr_builders as fb

STUCK = """
import sys, threading, time
class DataLoader:
    def __next__(self):
        while True:
            time.sleep(0.05)
def train():
    next(DataLoader())
threading.Thread(target=lambda: time.sleep(600), name="side", daemon=True).start()
print("ready", flush=True)
train()
"""
needs_py_spy = pytest.mark.skipif(py_spy_path() is None, reason="py-spy not installed (extra: "
                                                                "stacks)")


@pytest.fixture
def stuck_process() -> Iterator[subprocess.Popen]:
    process = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    yield process
    process.kill()
    process.wait()


@needs_py_spy
def test_a_real_stuck_process_is_outside_collectives_in_its_frame(
    stuck_process: subprocess.Popen,
) -> None:
    stack = capture(stuck_process.pid)
    assert stack.error is None and stack.pid == stuck_process.pid
    assert {t.name for t in stack.threads} >= {"MainThread", "side"}
    place = where(stack)
    assert place.kind == StackPlace.OUTSIDE and place.thread == "MainThread"
    assert place.frame.startswith("DataLoader.__next__ (")
    assert place.text(3).startswith("rank 3 is in DataLoader.__next__")


@needs_py_spy
def test_dump_dir_stacks_for_the_pids_the_dumps_name(
    stuck_process: subprocess.Popen, tmp_path: Path
) -> None:
    top = fb.dump(
        [fb.entry(record_id=0, seq=1)], fb.pg_config({"0": ("default_pg", (0, 1))}), rank=1
    )
    top["pid"] = stuck_process.pid
    (tmp_path / "rank_1.pkl").write_bytes(pickle.dumps(top, protocol=2))
    # a bad dump gives no pid, nothing raises
    (tmp_path / "rank_0.pkl").write_bytes(b"\x80\x02garbage")
    stacks = capture_dump_dir_stacks(tmp_path)
    assert list(stacks) == [1] and where(stacks[1]).kind == StackPlace.OUTSIDE
    assert where(load_stack_dir(tmp_path / "stacks")[1]).frame == where(stacks[1]).frame


def test_capture_never_raises(tmp_path: Path) -> None:
    missing_tool = capture(1, tool=str(tmp_path / "no-py-spy"))
    assert missing_tool.error and "could not run" in missing_tool.error
    if py_spy_path() is not None:
        gone = capture(2**22 + 12345)
        assert gone.error and "failed" in gone.error
    assert where(missing_tool).kind == StackPlace.UNKNOWN


@pytest.mark.parametrize(("content", "problem"), [
    (b"[{\"thread_name\": \"MainThread\", \"frames\": [", "not py-spy JSON"),  # truncated
    (b"{\"a\": 1}", "expected a list"),
    (b"[1, 2]", "a thread is not an object"),
    (b"\xff\xfe garbage", "not py-spy JSON"),
    # deeper than the JSON decoder's recursion: a hostile file
    (b"[" * 200_000, "nested too deeply"),
])
def test_bad_stack_files_are_named(tmp_path: Path, content: bytes, problem: str) -> None:
    (tmp_path / "rank_4.json").write_bytes(content)
    (tmp_path / "rank_5.json").write_text(json.dumps([{"thread_name": "MainThread", "frames": [
        {"name": "DataLoader.__next__", "short_filename": "train.py", "line": 7}]}]))
    stacks = load_stack_dir(tmp_path)
    assert (
        stacks[4].error
        and str(tmp_path / "rank_4.json") in stacks[4].error
        and problem in stacks[4].error
    )
    # one bad file hides nothing else
    assert where(stacks[5]).frame == "DataLoader.__next__ (train.py:7)"


def test_a_stack_path_that_is_no_regular_file_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "rank_0.json").symlink_to("/dev/zero")  # read whole, it would never end
    os.mkfifo(tmp_path / "rank_1.json")  # opened, it would block until a writer came
    (tmp_path / "rank_2.json").write_text(json.dumps([{"thread_name": "MainThread", "frames": [
        {"name": "DataLoader.__next__", "short_filename": "train.py", "line": 7}]}]))
    stacks = load_stack_dir(tmp_path)
    assert "not a regular file" in (stacks[0].error or "") and "not a regular file" in (
        stacks[1].error or ""
    )
    assert where(stacks[2]).frame == "DataLoader.__next__ (train.py:7)"


def test_an_oversized_stack_file_is_refused(tmp_path: Path) -> None:
    with open(tmp_path / "rank_0.json", "wb") as handle:
        handle.truncate(MAX_STACK_BYTES + 1)
    assert "refused" in (load_stack_dir(tmp_path)[0].error or "")


def test_p2p_peer_and_collective_from_the_frames() -> None:
    recv = parse_py_spy([{"thread_name": "MainThread", "frames": [
        {"name": "recv", "short_filename": "torch/distributed/distributed_c10d.py", "line": 2799,
         "locals": [{"name": "src", "repr": "5"}, {"name": "group_src", "repr": "None"}]},
        {"name": "Stage.forward", "short_filename": "model.py", "line": 10}]}])
    place = where(recv)
    assert (place.kind, place.op, place.peer) == (StackPlace.IN_P2P, "recv", 5)
    reduce = parse_py_spy(
        [
            {
                "thread_name": "MainThread",
                "frames": [
                    {
                        "name": "all_reduce",
                        "short_filename": "torch/distributed/distributed_c10d.py",
                        "line": 3252,
                    }
                ],
            }
        ]
    )
    assert where(reduce).kind == StackPlace.IN_COLLECTIVE and where(reduce).op == "all_reduce"
    assert where(ProcessStack(1, ())).kind == StackPlace.UNKNOWN


def test_stacks_travel_in_the_table_metadata(tmp_path: Path) -> None:
    groups = {"0": ("default_pg", (0, 1, 2, 3))}
    config = fb.pg_config(groups)
    dumps = {
        r: fb.dump(
            [
                fb.entry(record_id=0, seq=1),
                fb.entry(record_id=1, seq=2, state="scheduled", retired=False),
            ]
            if r != 2
            else [fb.entry(record_id=0, seq=1)],
            config,
            rank=r,
        )
        for r in range(4)
    }
    table = read_dump_dir(fb.write_set(tmp_path, dumps)).table
    stack = parse_py_spy([{"thread_name": "MainThread", "frames": [
        {"name": "save_checkpoint", "short_filename": "train.py", "line": 99}]}])
    with_stacks = attach_stacks(table, {2: stack})
    assert where(stacks_from_metadata(with_stacks)[2]).frame == "save_checkpoint (train.py:99)"
    report = analyze_collectives(with_stacks)
    assert report.culprit_ranks == (2,) and report.roots[0].kind == HangVerdict.STUCK_OUTSIDE
    assert report.roots[0].where == ("rank 2 is in save_checkpoint (train.py:99), outside any "
                                     "collective (Python "
                                     "stack, thread 'MainThread')",)
    assert any(e.startswith("rank 2 is in save_checkpoint") for e in report.evidence[:5])
