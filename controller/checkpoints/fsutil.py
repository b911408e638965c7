"""Small fsspec helpers: atomic writes and protocol-qualified URIs."""

from __future__ import annotations

import fsspec

from faultlens.collectors.store.atomic import atomic_write as local_atomic_write


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))


def atomic_write(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Make `path` appear complete or not at all: a hidden temporary name renamed into place on a
    local filesystem (with fsync), one PUT on an object store."""
    if is_local(fs):
        local_atomic_write(path, data)
        return
    fs.pipe_file(path, data)


def uri_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A URL another process can open: plain path for local files, protocol://path otherwise."""
    if is_local(fs):
        return path
    return fs.unstrip_protocol(path)
