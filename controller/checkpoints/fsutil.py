"""Small fsspec helpers: atomic writes and protocol-qualified URIs."""

from __future__ import annotations

import os
import uuid

import fsspec


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))


def atomic_write(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Make `path` appear complete or not at all: a hidden temporary name renamed into place on a local
    filesystem (with fsync), one PUT on an object store."""
    if is_local(fs):
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
        try:
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        return
    fs.pipe_file(path, data)


def uri_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A URL another process can open: plain path for local files, protocol://path otherwise."""
    if is_local(fs):
        return path
    return fs.unstrip_protocol(path)
