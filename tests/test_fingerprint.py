"""Traceback fingerprints: the same bug gives the same fingerprint on other ranks, attempts, nodes
and sources; different bugs do not. Tracebacks come from real processes (the torchrun fixture, and
scripts run here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faultlens.collectors.artifacts.fingerprint import (
    fingerprint,
    normalise_message,
    normalise_path,
    parse_traceback,
)
from faultlens.collectors.artifacts.torchrun_report import parse_torchrun_output

BUGGY = '''
import os, sys

class Batch:
    pass

def forward(batch, rank):
    where = os.path.abspath(__file__)
    raise ValueError(f"bad batch {batch!r} on rank {rank} (pid {os.getpid()}) in {where}")

def train(rank):
    for step in range(3):
        if step == 2:
            forward(Batch(), rank)

train(int(sys.argv[1]))
'''


def _error_json_traceback(path: Path) -> str:
    return json.loads(path.read_text())["message"]["extraInfo"]["py_callstack"]


def test_same_exception_same_fingerprint_across_attempts_and_sources(
    torch_artifacts: dict[str, Path],
) -> None:
    art = torch_artifacts["crash_exception"]
    texts = {}
    for attempt in (0, 1):
        worker = next((art / "logdir").glob(f"*/attempt_{attempt}/2"))
        texts[f"error.json attempt {attempt}"] = _error_json_traceback(worker / "error.json")
        texts[f"stderr.log attempt {attempt}"] = (worker / "stderr.log").read_text()
    # rank 2's entry in torchrun's report: torchrun's "Root Cause" is the earliest error-file
    # second, and a survivor whose echo was stamped in the same second as the bug can be named
    # instead (seen under load)
    (bug,) = [
        f
        for f in parse_torchrun_output((art / "torchrun_stderr.txt").read_text())
        .reports[0]
        .failures
        if f.rank == 2
    ]
    texts["torchrun report"] = bug.traceback
    parsed = {name: parse_traceback(text) for name, text in texts.items()}
    assert all(p is not None and p.exception_type == "ValueError" for p in parsed.values())
    fingerprints = {name: p.fingerprint for name, p in parsed.items()}  # type: ignore[union-attr]
    assert len(set(fingerprints.values())) == 1, fingerprints
    # the sources really differ: stderr starts at <module>, error.json at torch's @record wrapper
    assert parsed["stderr.log attempt 0"].frames[0].function == "<module>"  # type: ignore[union-attr]
    assert parsed["error.json attempt 0"].frames[0].function == "wrapper"  # type: ignore[union-attr]


def test_survivors_echo_has_one_fingerprint_across_ranks_and_jobs(
    torch_artifacts: dict[str, Path],
) -> None:
    keys = ("Connection closed by peer", "for recv operation", "for send operation")
    fingerprints: dict[str, set[str]] = {key: set() for key in keys}
    messages: dict[str, set[str]] = {key: set() for key in keys}
    for scenario in ("hang", "subgroup_hang", "crash_exception"):
        for error_file in (torch_artifacts[scenario] / "logdir").glob("*/attempt_*/*/error.json"):
            parsed = parse_traceback(_error_json_traceback(error_file))
            assert parsed is not None
            for key in keys:
                if key in parsed.message:
                    fingerprints[key].add(parsed.fingerprint)
                    messages[key].add(parsed.message)
    assert sum(map(len, messages.values())) >= 3
    for key in keys:
        # one fingerprint per kind of echo
        assert len(fingerprints[key]) <= 1, (key, fingerprints[key])
    assert len(set().union(*fingerprints.values())) == len([k for k in keys if fingerprints[k]])
    # raw messages differ (peer ports; 5000 ms and 6000 ms timeouts) while each fingerprint is one
    assert any(len(found) > 1 for found in messages.values())


def _run_buggy(
    directory: Path, rank: int, prefix_lines: int = 0, message_change: str | None = None
) -> str:
    directory.mkdir(parents=True)
    source = "\n" * prefix_lines + BUGGY
    if message_change:
        source = source.replace("bad batch", message_change)
    script = directory / "train.py"
    script.write_text(source)
    result = subprocess.run(
        [sys.executable, str(script), str(rank)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    return result.stderr


def test_same_bug_on_two_nodes(tmp_path: Path) -> None:
    """Different checkout paths, pids, object addresses, ranks and line numbers: one fingerprint."""
    node_a = _run_buggy(tmp_path / "node-a" / "home" / "alice" / "job", rank=3)
    node_b = _run_buggy(tmp_path / "node-b" / "scratch" / "run-17", rank=12, prefix_lines=5)
    a, b = parse_traceback(node_a), parse_traceback(node_b)
    assert a is not None and b is not None
    assert a.message != b.message and a.frames[-1].line != b.frames[-1].line
    assert a.fingerprint == b.fingerprint
    other_bug = parse_traceback(
        _run_buggy(tmp_path / "node-c", rank=3, message_change="empty batch")
    )
    assert other_bug is not None and other_bug.fingerprint != a.fingerprint


def test_chained_exception_fingerprints_the_raised_one(tmp_path: Path) -> None:
    script = tmp_path / "chain.py"
    script.write_text(
        "def load():\n    raise KeyError('shard 7')\n\n"
        "def main():\n    try:\n        load()\n    except KeyError as exc:\n"
        "        raise RuntimeError('checkpoint incomplete') from exc\n\nmain()\n")
    stderr = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    ).stderr
    parsed = parse_traceback(stderr)
    assert parsed is not None
    assert (parsed.exception_type, parsed.message) == ("RuntimeError", "checkpoint incomplete")
    assert [f.function for f in parsed.frames][-1] == "main"


def test_frames_matter() -> None:
    parsed = parse_traceback('Traceback (most recent call last):\n  File "/a/train.py", line 3, in '
                             'step\n'
                             "    x()\nValueError: bad\n")
    assert parsed is not None
    elsewhere = parse_traceback('Traceback (most recent call last):\n  File "/a/train.py", line 3, '
                                'in other\n'
                                "    x()\nValueError: bad\n")
    assert elsewhere is not None and parsed.fingerprint != elsewhere.fingerprint
    assert fingerprint("ValueError", "bad", parsed.frames) != fingerprint(
        "TypeError", "bad", parsed.frames
    )


def test_normalisation() -> None:
    assert (
        normalise_path("/usr/lib/python3/dist-packages/torch/nn/module.py") == "torch/nn/module.py"
    )
    assert (
        normalise_path("/home/x/.venv/lib/python3.11/site-packages/torch/nn/module.py")
        == "torch/nn/module.py"
    )
    assert normalise_path("/tmp/pytest-12/train.py") == "train.py"
    assert normalise_path("<frozen runpy>") == "<frozen runpy>"
    text = ("[/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[10.1.2.3]:15242 at 0x7f3a2b1c pid 4242 id 3f2a9c1e4b5d6e7f8a9b")
    assert normalise_message(text) == ("[pair.cc:<n>] Connection closed by peer <host> at <addr> "
                                       "pid <n> "
                                       "id <hex>")


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=10**9))
def test_numbers_never_change_the_fingerprint(first: int, second: int) -> None:
    assert fingerprint("RuntimeError", f"step {first} rank {second}") == fingerprint(
        "RuntimeError", "step 0 rank 1"
    )


#: what a user's job writes to stderr right after an uncaught exception, with no blank line between:
#: an atexit handler's print, a logger's line, a warning, and (on Slurm, where srun merges every
#: task's stream) srun's and slurmstepd's own lines (their shapes as Slurm 22.05 prints them)
_AFTER_THE_EXCEPTION = {
    "atexit print": "import atexit, sys\natexit.register(lambda: print('saved emergency state to "
                    "/ckpt/rank3', file=sys.stderr))\n",
    "logging at exit": "import atexit, logging\nlogging.basicConfig(format='%(asctime)s "
                       "%(levelname)s %(message)s')\natexit.register(lambda: logging.error("
                       "'trainer exiting'))\n",
    "logging default format": "import atexit, logging\nlogging.basicConfig()\n"
                              "atexit.register(lambda: logging.getLogger('train').error("
                              "'trainer exiting'))\n",
    "warning at exit": "import atexit, warnings\natexit.register(lambda: warnings.warn("
                       "'checkpoint not flushed'))\n",
}
_SLURM_LINES = (
    "srun: error: node-1: task 3: Exited with exit code 1",
    "slurmstepd: error: *** STEP 41.0 ON node-1 CANCELLED AT 2026-12-07T21:40:03 ***",
    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
)


@pytest.mark.parametrize("writer", sorted(_AFTER_THE_EXCEPTION))
def test_a_line_written_after_the_exception_is_not_part_of_the_bug(
    tmp_path: Path, writer: str
) -> None:
    """The same bug with and without another writer's line right after it: one fingerprint, and the
    message is the exception's own."""
    plain = parse_traceback(_run_buggy(tmp_path / "plain", rank=3))
    script = tmp_path / "noisy" / "train.py"
    script.parent.mkdir()
    script.write_text(_AFTER_THE_EXCEPTION[writer] + BUGGY)
    stderr = subprocess.run([sys.executable, str(script), "3"], capture_output=True, text=True,
                            timeout=60).stderr
    exception_line = next(n for n, line in enumerate(stderr.splitlines())
                          if line.startswith("ValueError"))
    assert stderr.splitlines()[exception_line + 1].strip()  # really no blank line between
    noisy = parse_traceback(stderr)
    assert plain is not None and noisy is not None
    assert noisy.message.startswith("bad batch")
    assert noisy.fingerprint == plain.fingerprint
    if writer != "atexit print":
        # a known shape ends the message; a bare print could be the message's own next line and is
        # kept for the reader, but never enters the fingerprint
        assert "\n" not in noisy.message


@pytest.mark.parametrize("slurm_line", _SLURM_LINES)
def test_slurms_own_line_after_a_task_traceback_is_not_part_of_the_bug(
    tmp_path: Path, slurm_line: str
) -> None:
    stderr = _run_buggy(tmp_path / "job", rank=3)
    plain = parse_traceback(stderr)
    merged = parse_traceback(stderr.rstrip("\n") + "\n" + slurm_line + "\n")
    assert plain is not None and merged is not None
    assert merged.message == plain.message and merged.fingerprint == plain.fingerprint


def test_a_message_continued_over_lines_keeps_them_but_hashes_its_first(tmp_path: Path) -> None:
    """A real multi-line message (torch's state-dict and CUDA errors are written this way) is kept
    whole for the reader; the fingerprint is its first line's, so what follows cannot split it."""
    script = tmp_path / "load.py"
    script.write_text(
        "def load(keys):\n    raise RuntimeError('Error(s) in loading state_dict for Net:\\n'\n"
        "                       f'\\tMissing key(s) in state_dict: {keys}.')\n\nload('\"fc.w\"')\n")
    stderr = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=60).stderr
    parsed = parse_traceback(stderr)
    assert parsed is not None
    assert parsed.message.splitlines() == [
        "Error(s) in loading state_dict for Net:", 'Missing key(s) in state_dict: "fc.w".']
    assert parsed.fingerprint == fingerprint(
        "RuntimeError", "Error(s) in loading state_dict for Net:", parsed.frames)
    other_bug = fingerprint("RuntimeError", "Error(s) in saving state_dict for Net:",
                            parsed.frames)
    assert other_bug != parsed.fingerprint
