"""The one atomic file write: a hidden temporary name in the target's directory, written, flushed
(and fsynced), then renamed over the target with os.replace, so a reader sees the old file or the
whole new one, never a part. The temporary is removed when anything fails. Imports only the standard
library: the code in the training process (the dump trigger, the heartbeat) uses it too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

_SERIAL = itertools.count()


def temp_path(path: str | os.PathLike[str]) -> Path:
    """`.<name>.<pid>-<n>.tmp` beside `path`: hidden, and distinct per writing process and call."""
    target = Path(path)
    return target.with_name(f".{target.name}.{os.getpid()}-{next(_SERIAL)}.tmp")


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Callable[[BinaryIO], object], *,
                 fsync: bool = True, make_dirs: bool = True, encoding: str = "utf-8",
                 temporary: str | os.PathLike[str] | None = None) -> Path:
    """Make `path` appear complete or not at all. `data`: bytes, text (encoded with `encoding`), or
    a function that writes into the open binary handle (pyarrow's writer, say); `temporary`: the
    name to write first (default temp_path). Raises OSError (the temporary is gone)."""
    target = Path(path)
    if make_dirs:
        target.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(temporary) if temporary is not None else temp_path(target)
    try:
        with open(temporary, "wb") as handle:
            if callable(data):
                data(handle)
            else:
                handle.write(data.encode(encoding) if isinstance(data, str) else data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return target
