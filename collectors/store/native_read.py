"""A store segment opened for Arrow as a native file, never as a Python file object.

Arrow reading through a Python file object (what fsspec's `open()` returns) calls back into Python
from its own I/O and CPU threads, and one of them may drop the last reference to that object after
the read has returned. A thread that does so while the interpreter finalises cannot take the GIL:
CPython ends it with pthread_exit, whose unwinding through a noexcept C++ frame calls
std::terminate ("terminate called without an active exception", rc 134, after the command printed
its whole output). A local segment is opened as Arrow's own file; a remote one is read whole (in
the calling thread) into an Arrow-owned buffer. Segments are small (one flush each).
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa


class _Location(Protocol):  # layout.StoreLocation (not imported: layout imports this module)
    fs: Any

    @property
    def is_local(self) -> bool: ...


def open_segment(location: _Location, path: str) -> pa.NativeFile:
    """The segment at `path` as a native Arrow file (a context manager; FileNotFoundError when it
    is gone)."""
    if location.is_local:
        return pa.OSFile(path, "rb")
    # one GET: open() asks the object's size first (a HEAD, or a cached listing that may not hold
    # a new segment), and so does s3fs's cat_file without a range
    data = location.fs.cat_file(path, start=0)
    out = pa.BufferOutputStream()
    out.write(data)
    return pa.BufferReader(out.getvalue())
