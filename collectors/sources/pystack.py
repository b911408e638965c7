"""Python stacks of rank processes (py-spy, an optional dependency: `pip install
faultlens[stacks]`), and where each rank is: inside a collective, inside a point-to-point send/recv
(and with which peer), or outside any collective (and in which frame: "rank 3 is in
DataLoader.__next__").

Why: a rank that never joined the collective its peers wait in is either stuck in user code (the
culprit: its frame is the evidence), or blocked in a send/recv that gloo does not record in the
flight recorder (then it waits on its pipeline peer, and is a follow-on). py-spy reads another
process' interpreter from outside (ptrace); it needs no cooperation from the process, which is
blocked anyway.

    stack = capture(pid)          # never raises: ProcessStack.error says why there is none
    place = where(stack)          # Whereabouts(kind, frame, op, peer, thread)
    # rank_<N>.json files of py-spy's JSON, as written by write_stack()
    stacks = load_stack_dir(DIR)

Bad input: a stack file that is not py-spy JSON gives a ProcessStack with `error` naming the file;
nothing raises.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from faultlens.collectors.store.atomic import atomic_write
from faultlens.collectors.training.own_stack import OWN_STACKS_DIR

# a stack file larger than this is refused (py-spy JSON of a process is ~100 KB)
MAX_STACK_BYTES = 32 << 20
_P2P = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
_COLLECTIVE_FILE = re.compile(r"torch/distributed/distributed_c10d\.py$")
# autograd's engine: DDP's reducer launches and waits on its gradient all_reduce from C++ inside
# it, so a thread stopped there may be computing or blocked in a collective; Python cannot tell
_AUTOGRAD_ENGINE = re.compile(r"(^|/)torch/autograd/(graph|__init__)\.py$")
_LIBRARY = re.compile(
    r"(^|/)(threading|selectors|socket|queue|subprocess|contextlib|functools)\.py$|"
    r"(^|/)torch/distributed/|(^|/)multiprocessing/|^<frozen "
)


class StackPlace(StrEnum):
    IN_COLLECTIVE = "in_collective"
    IN_P2P = "in_p2p"
    OUTSIDE = "outside_collectives"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int | None
    locals: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        return f"{self.name} ({self.filename}:{self.line})" if self.line is not None else self.name


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int | None
    name: str | None
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them


@dataclass(frozen=True)
class ProcessStack:
    pid: int | None
    threads: tuple[ThreadStack, ...]
    error: str | None = None


@dataclass(frozen=True)
class Whereabouts:
    kind: StackPlace
    # the frame that says where it is (user code outside collectives, or the torch call)
    frame: str | None
    op: str | None  # the torch.distributed function it is blocked in
    peer: int | None  # for send/recv: the global peer rank, where the call names it
    thread: str | None

    def text(self, rank: int) -> str:
        if self.kind == StackPlace.OUTSIDE:
            return (f"rank {rank} is in {self.frame}, outside any collective (Python stack, thread "
                    f"{self.thread!r})")
        if self.kind == StackPlace.IN_P2P:
            peer = f" with rank {self.peer}" if self.peer is not None else ""
            return f"rank {rank} is blocked in {self.op}{peer} (Python stack: {self.frame})"
        if self.kind == StackPlace.IN_COLLECTIVE:
            return (f"rank {rank} is blocked in torch.distributed.{self.op} (Python stack: "
                    f"{self.frame})")
        if self.frame and self.thread is not None:
            return f"rank {rank} is {self.frame} (Python stack, thread {self.thread!r})"
        return (f"rank {rank}: no Python stack of it ({self.frame})" if self.frame
                else f"rank {rank}: its stack shows no training thread (the process or thread is "
                     "gone: crashed?)")


def py_spy_path() -> str | None:
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def capture(
    pid: int, *, with_locals: bool = True, timeout_s: float = 20.0, tool: str | None = None
) -> ProcessStack:
    """py-spy's stack of every thread of `pid`; never raises (error says why there is none)."""
    tool = tool or py_spy_path()
    if tool is None:
        return ProcessStack(pid, (), "py-spy is not installed (pip install faultlens[stacks])")
    command = [tool, "dump", "--json", "--pid", str(int(pid))] + (
        ["--locals"] if with_locals else []
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return ProcessStack(pid, (), f"py-spy dump of pid {pid} timed out after {timeout_s:g}s")
    except OSError as exc:
        return ProcessStack(pid, (), f"py-spy could not run: {exc}")
    if result.returncode != 0:
        line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return ProcessStack(pid, (), f"py-spy dump of pid {pid} failed: {line[:200]}")
    return parse_py_spy(result.stdout, pid=pid)


def _locals(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw[:64]:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            out.append((item["name"], str(item.get("repr"))[:200]))
    return tuple(out)


def parse_py_spy(
    document: str | list, *, pid: int | None = None, source: str = "py-spy output"
) -> ProcessStack:
    """py-spy's `dump --json` output (a list of threads) -> ProcessStack; a malformed one gives
    error.
    """
    try:
        threads_raw = json.loads(document) if isinstance(document, str) else document
    except ValueError as exc:
        return ProcessStack(pid, (), f"{source}: not py-spy JSON ({exc})")
    except RecursionError:  # nesting deeper than the decoder's stack: a hostile file, never a stack
        return ProcessStack(pid, (), f"{source}: not py-spy JSON (nested too deeply)")
    if not isinstance(threads_raw, list):
        return ProcessStack(pid, (), f"{source}: not py-spy JSON (expected a list of threads)")
    threads = []
    for raw in threads_raw:
        if not isinstance(raw, dict) or not isinstance(raw.get("frames", []), list):
            return ProcessStack(pid, (), f"{source}: not py-spy JSON (a thread is not an object "
                                         "with frames)")
        frames = []
        for f in raw.get("frames", [])[:256]:
            if not isinstance(f, dict):
                continue
            line = f.get("line")
            frames.append(
                Frame(
                    str(f.get("name")),
                    str(f.get("short_filename") or f.get("filename")),
                    line if isinstance(line, int) else None,
                    _locals(f.get("locals")),
                )
            )
        tid = raw.get("thread_id")
        threads.append(
            ThreadStack(
                tid if isinstance(tid, int) else None,
                raw.get("thread_name") if isinstance(raw.get("thread_name"), str) else None,
                tuple(frames),
            )
        )
        if pid is None and isinstance(raw.get("pid"), int):
            pid = raw["pid"]
    return ProcessStack(pid, tuple(threads))


def _thread(stack: ProcessStack, thread_ids: Iterable[int] | None) -> ThreadStack | None:
    threads = [t for t in stack.threads if t.frames]
    if not threads:
        return None
    wanted = set(thread_ids or ())
    for t in threads:
        if t.thread_id in wanted:
            return t
    for t in threads:  # a thread inside torch.distributed is the training thread
        if any(_COLLECTIVE_FILE.search(f.filename) for f in t.frames):
            return t
    for t in threads:
        if t.name == "MainThread":
            return t
    return threads[0]


def _peer(frame: Frame, key: str) -> int | None:
    for name, value in frame.locals:
        if name == key and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def where(stack: ProcessStack | None, thread_ids: Iterable[int] | None = None) -> Whereabouts:
    """Where the training thread of a process is (the thread that recorded the rank's collectives
    where its id is known, else one inside torch.distributed, else MainThread)."""
    if stack is None:
        return Whereabouts(StackPlace.UNKNOWN, None, None, None, None)
    if stack.error:
        return Whereabouts(StackPlace.UNKNOWN, stack.error, None, None, None)
    thread = _thread(stack, thread_ids)
    if thread is None:
        return Whereabouts(StackPlace.UNKNOWN, None, None, None, None)
    for frame in thread.frames:
        if _COLLECTIVE_FILE.search(frame.filename) and not frame.name.startswith("_"):
            if frame.name in _P2P:
                return Whereabouts(
                    StackPlace.IN_P2P,
                    frame.text(),
                    frame.name,
                    _peer(frame, _P2P[frame.name]),
                    thread.name,
                )
            return Whereabouts(
                StackPlace.IN_COLLECTIVE, frame.text(), frame.name, None, thread.name
            )
    if _AUTOGRAD_ENGINE.search(thread.frames[0].filename):
        # the flight recorder says whether a collective is in flight, not the stack
        inside = (f"inside autograd's backward ({thread.frames[0].text()}; a DDP gradient "
                  "all_reduce runs there unseen by Python)")
        return Whereabouts(StackPlace.UNKNOWN, inside, None, None, thread.name)
    for frame in thread.frames:
        if not _LIBRARY.search(frame.filename):
            return Whereabouts(StackPlace.OUTSIDE, frame.text(), None, None, thread.name)
    return Whereabouts(StackPlace.OUTSIDE, thread.frames[0].text(), None, None, thread.name)


_RANK_FILE = re.compile(r"^rank_(\d+)\.json$")


def load_stack_dir(directory: str | os.PathLike[str]) -> dict[int, ProcessStack]:
    """rank -> its stack, from rank_<N>.json files (py-spy JSON); a bad file gives a stack whose
    error names it.
    """
    out: dict[int, ProcessStack] = {}
    root = Path(directory)
    if not root.is_dir():
        return out
    for path in sorted(root.iterdir()):
        match = _RANK_FILE.match(path.name)
        if not match:
            continue
        rank = int(match.group(1))
        try:
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):  # a link, a FIFO, a device (/dev/zero): never read
                out[rank] = ProcessStack(None, (), f"{path}: not a regular file, refused")
                continue
            with open(path, "rb") as handle:  # at most the limit, whatever the file holds
                data = handle.read(MAX_STACK_BYTES + 1)
            if len(data) > MAX_STACK_BYTES:
                out[rank] = ProcessStack(None, (), f"{path}: larger than {MAX_STACK_BYTES} bytes, "
                                                   "refused")
                continue
            out[rank] = parse_py_spy(data.decode(errors="replace"), source=str(path))
        except OSError as exc:
            out[rank] = ProcessStack(None, (), f"{path}: cannot read ({exc.strerror or exc})")
    return out


def capture_ranks(pids: Mapping[int, int], directory: str | os.PathLike[str] | None = None,
                  **kwargs: Any) -> dict[int, ProcessStack]:
    """rank -> stack for every rank's pid; with `directory`, each also written as rank_<N>.json
    (py-spy JSON).
    """
    out = {}
    for rank, pid in pids.items():
        stack = capture(pid, **kwargs)
        out[int(rank)] = stack
        if directory is not None and stack.error is None:
            write_stack(Path(directory) / f"rank_{int(rank)}.json", stack)
    return out


def stack_to_json(stack: ProcessStack) -> list[dict]:
    """The stack in py-spy's JSON shape (what parse_py_spy reads back)."""
    return [
        {
            "pid": stack.pid,
            "thread_id": t.thread_id,
            "thread_name": t.name,
            "frames": [
                {
                    "name": f.name,
                    "short_filename": f.filename,
                    "line": f.line,
                    "locals": [{"name": n, "repr": v} for n, v in f.locals] or None,
                }
                for f in t.frames
            ],
        }
        for t in stack.threads
    ]


def write_stack(path: Path, stack: ProcessStack) -> None:
    atomic_write(path, json.dumps(stack_to_json(stack)), fsync=False)


def dump_pids(directory: str | os.PathLike[str]) -> dict[int, int]:
    """rank -> pid, from the top-level `pid` of the dumps in a dump directory (the trigger writes
    it), read with the restricted unpickler; dumps without one are left out."""
    from faultlens.collectors.artifacts.safe_pickle import safe_load

    out: dict[int, int] = {}
    for path in sorted(Path(directory).glob("rank_*.pkl")):
        try:
            if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the read
                continue
            data = safe_load(path)
        except Exception:
            continue
        if (
            isinstance(data, dict)
            and isinstance(data.get("pid"), int)
            and isinstance(data.get("rank"), int)
        ):
            out[data["rank"]] = data["pid"]
    return out


def capture_dump_dir_stacks(
    dump_dir: str | os.PathLike[str], **kwargs: Any
) -> dict[int, ProcessStack]:
    """The stacks of the ranks whose dumps are in `dump_dir`: py-spy's (pids from the dumps, written
    to dump_dir/stacks/) where it is installed and could read the process, else the rank's own,
    which the flight-recorder trigger wrote beside its dump (dump_dir/own-stacks/,
    collectors/training/own_stack.py). Never raises."""
    own = load_stack_dir(Path(dump_dir) / OWN_STACKS_DIR)
    if py_spy_path() is None and "tool" not in kwargs:
        return own
    try:
        taken = capture_ranks(dump_pids(dump_dir), Path(dump_dir) / "stacks", **kwargs)
    except OSError:
        return own
    return with_fallback(taken, own)


def with_fallback(
    stacks: Mapping[int, ProcessStack], fallback: Mapping[int, ProcessStack]
) -> dict[int, ProcessStack]:
    """`stacks` (py-spy's), each rank that has none or only an error taking its stack from
    `fallback` (the rank's own) where that one is sound."""
    out = dict(stacks)
    for rank, stack in fallback.items():
        if stack.error is None and (rank not in out or out[rank].error is not None):
            out[rank] = stack
    return out


def load_dump_dir_stacks(dump_dir: str | os.PathLike[str]) -> dict[int, ProcessStack]:
    """The stacks stored with a dump directory: py-spy's (dump_dir/stacks/), else the ranks' own
    (dump_dir/own-stacks/)."""
    return with_fallback(
        load_stack_dir(Path(dump_dir) / "stacks"), load_stack_dir(Path(dump_dir) / OWN_STACKS_DIR)
    )
