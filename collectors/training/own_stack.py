"""A training process's own Python stacks, in py-spy's `dump --json` form, taken from inside the
process.

Why: the hang analysis names where a rank that never joined is ("rank 3 is in DataLoader.__next__")
from its Python stack. py-spy takes it from outside, but it is an optional dependency and needs
ptrace (denied in many containers). The flight-recorder trigger (fr_trigger.py) already runs a
thread of its own in every rank that answers a dump request while the training thread is blocked; it
takes the stacks of the other threads there (`sys._current_frames`), written beside the dump as
`<dump dir>/own-stacks/rank_<N>.json`, which faultlens.collectors.sources.pystack reads like
py-spy's.

Locals are kept only where the stack reader uses them: small values (int, bool, short str) of frames
inside torch.distributed (a send/recv's peer); nothing else of the program's state is written.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from types import FrameType
from typing import Any

OWN_STACKS_DIR = "own-stacks"  # under a dump directory
MAX_FRAMES = 256  # per thread, as the stack reader keeps
_TORCH_DISTRIBUTED = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\]")
_SMALL_STR = 64


def _short_filename(filename: str, roots: list[str]) -> str:
    """The path relative to the longest sys.path entry holding it (as py-spy shortens it), else as
    it is.
    """
    best = ""
    for root in roots:
        if root and filename.startswith(root + os.sep) and len(root) > len(best):
            best = root
    return filename[len(best) + 1:] if best else filename


def _small_locals(frame: FrameType) -> list[dict[str, str]]:
    out = []
    for name, value in list(frame.f_locals.items())[:64]:
        if (
            isinstance(value, bool | int)
            or value is None
            or (isinstance(value, str) and len(value) <= _SMALL_STR)
        ):
            out.append({"name": str(name), "repr": repr(value)})
    return out


def _frames(frame: FrameType | None, roots: list[str]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        filename = code.co_filename
        entry: dict[str, Any] = {
            "name": getattr(code, "co_qualname", code.co_name),
            "filename": filename,
            "short_filename": _short_filename(filename, roots),
            "line": frame.f_lineno,
        }
        if _TORCH_DISTRIBUTED.search(filename):
            entry["locals"] = _small_locals(frame)
        frames.append(entry)
        frame = frame.f_back
    return frames


def own_stacks(skip_thread_ids: set[int] | None = None) -> list[dict[str, Any]]:
    """Every thread of this process but the caller (and `skip_thread_ids`), innermost frame first,
    as py-spy's `dump --json` lists them (pid, thread_id, thread_name, frames of name, filename,
    short_filename, line)."""
    skip = set(skip_thread_ids or ()) | {threading.get_ident()}
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    roots = sorted({os.path.abspath(p) for p in sys.path if p}, key=len)
    pid = os.getpid()
    threads = []
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        threads.append({"pid": pid, "thread_id": ident, "thread_name": names.get(ident),
                        "frames": _frames(frame, roots)})
    return threads
