"""A local store's filesystem without importing fsspec at start.

fsspec (with asyncio, ssl and its caching layers) costs a CLI command about as much as importing
DuckDB: a local store needs none of it to be listed and read. `LocalFS` answers what the readers ask
of a local store on their hot paths (`protocol`, `find`, `size`, `invalidate_cache`) with `os`
calls, and hands every other fsspec method (`open`, `ls`, `mv`, `rm`, `info`, ...) to fsspec's own
LocalFileSystem, imported on first use.
"""

from __future__ import annotations

import os
from typing import Any


class LocalFS:
    """fsspec's LocalFileSystem interface; the listing and stat calls answered with `os`."""

    protocol = ("file", "local")

    def __init__(self) -> None:
        self._real: Any = None

    def _fsspec(self) -> Any:
        if self._real is None:
            from fsspec.implementations.local import LocalFileSystem

            self._real = LocalFileSystem()
        return self._real

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._fsspec(), name)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing to invalidate: a local listing is never cached."""

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def find(self, path: str) -> list[str]:
        """Every entry under `path` that is not a directory, sorted, as fsspec's find: a symlink
        (to a directory, a file or nowhere) is an entry, never descended. Nothing when `path` does
        not exist."""
        path = path.rstrip("/") or "/"
        if not os.path.isdir(path):
            return [path] if os.path.lexists(path) else []
        found: list[str] = []
        stack = [path]
        while stack:
            directory = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            for entry in entries:
                full = f"{directory.rstrip('/')}/{entry.name}"
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    stack.append(full)
                else:
                    found.append(full)
        found.sort()
        return found
