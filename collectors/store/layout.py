"""The store layout contract (docs/design.md): where segments live, how they become visible, how
readers list them.

    <root>/<table>/job=<job_id or _node>/date=<YYYY-MM-DD>/node=<node>/<ts>-<uuid>.parquet

A segment is written under a hidden temporary name and renamed into place when complete (local
filesystems), or uploaded with one PUT (object stores), so a reader never sees a partial file.
Compaction writes a merged segment named `c-<ts>-<uuid>.parquet` whose metadata lists the segments
it replaces; readers drop replaced segments that are still listed, so a concurrent reader never
counts a row twice.
"""

from __future__ import annotations

import io
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from faultlens.collectors.store.atomic import atomic_write
from faultlens.collectors.store.native_read import open_segment
from faultlens.errors import FaultlensError

REPLACES_KEY = b"faultlens.replaces"
SEGMENT_SUFFIX = ".parquet"
COMPACTED_PREFIX = "c-"
_PART_RE = re.compile(r"^(job|date|node)=(.+)$")
_SAFE_VALUE_RE = re.compile(r"[^A-Za-z0-9._:@+-]")


class StoreError(OSError, FaultlensError):
    """The store cannot be opened, listed or written: the message names the location and the
    problem.
    """


@dataclass(frozen=True)
class StoreLocation:
    """A store root on some filesystem: `fs` is an fsspec filesystem, `root` a path inside it."""

    url: str
    fs: fsspec.AbstractFileSystem
    root: str

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def resolve_store(
    url: str | StoreLocation, *, create: bool = False, **storage_options: object
) -> StoreLocation:
    """Turn a path or URL (`./store`, `file:///x`, `s3://bucket/prefix`, `memory://x`) into a
    StoreLocation. With create=False a local root that does not exist or is not a readable directory
    raises StoreError."""
    if isinstance(url, StoreLocation):
        return url
    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except (ImportError, ValueError) as exc:
        raise StoreError(f"store {url!r}: cannot open: {exc}") from None
    location = StoreLocation(url=url, fs=fs, root=root.rstrip("/") or "/")
    if location.is_local:
        if create:
            try:
                os.makedirs(location.root, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"store {url!r}: cannot create directory: {exc.strerror or exc}"
                ) from None
        if not os.path.exists(location.root):
            raise StoreError(f"store {url!r}: no such directory")
        if not os.path.isdir(location.root):
            raise StoreError(f"store {url!r}: not a directory")
        if not os.access(location.root, os.R_OK | os.X_OK):
            raise StoreError(f"store {url!r}: directory is not readable")
    return location


def probe_store(location: StoreLocation) -> None:
    """Raise StoreError when an object store cannot be reached (connection refused, DNS,
    credentials): a reader must not take an unreachable store for an empty one. A root that does not
    exist yet is fine (empty store)."""
    if location.is_local:
        return
    try:
        location.fs.invalidate_cache()
        location.fs.ls(location.root, detail=False)
    except FileNotFoundError:
        return
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise StoreError(f"store {location.url!r}: cannot reach: "
                         f"{text[0] if text else type(exc).__name__}") \
            from None


def safe_value(value: str) -> str:
    """A partition value made safe for a path component."""
    cleaned = _SAFE_VALUE_RE.sub("_", value)
    return cleaned or "_"


def partition_dir(location: StoreLocation, table: str, job: str, date: str, node: str) -> str:
    return location.join(
        table, f"job={safe_value(job)}", f"date={safe_value(date)}", f"node={safe_value(node)}"
    )


def new_segment_name(prefix: str = "") -> str:
    return f"{prefix}{time.time_ns():020d}-{uuid.uuid4().hex[:12]}{SEGMENT_SUFFIX}"


TEMP_SUFFIX = ".tmp"


def _host_tag() -> str:
    return safe_value(socket.gethostname()).replace("@", "_")


def temp_name(name: str) -> str:
    """The hidden name a segment is written under: `.<name>.<pid>@<host>.tmp` (who wrote it, so that
    compaction can tell a dead writer's leftover from a segment being written now)."""
    return f".{name}.{os.getpid()}@{_host_tag()}{TEMP_SUFFIX}"


def temp_writer(name: str) -> tuple[int | None, str | None]:
    """(pid, host) of a temporary file's writer; host None for the older `.<name>.<pid>.tmp` form.
    """
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return None, None
    body = name[1:-len(TEMP_SUFFIX)]
    host = None
    if "@" in body:
        body, host = body.rsplit("@", 1)
    pid_text = body.rsplit(".", 1)[-1]
    return (int(pid_text) if pid_text.isdigit() and len(pid_text) <= 10 else None), host


def writer_is_gone(name: str, *, local: bool) -> bool:
    """True when the temporary file's writer ran on this host and is no longer running."""
    pid, host = temp_writer(name)
    if pid is None or pid <= 0:
        return False
    if host is None and not local:
        return False  # older form on a shared object store: the writer may be on another host
    if host is not None and host != _host_tag():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False
    return False


def is_segment_name(name: str) -> bool:
    """Visible segments only: temporary files start with '.' and never end in .parquet."""
    return name.endswith(SEGMENT_SUFFIX) and not name.startswith((".", "_"))


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet leaf columns worth dictionary encoding: strings (node, job, phase, section names,
    the keys of a map). Numbers (times, durations, samples) are written plain: a dictionary of
    mostly distinct floats costs twice the encoding time and ends larger once zstd has run over it.
    """

    def leaves(field: pa.Field, prefix: str) -> list[str]:
        kind, path = field.type, f"{prefix}{field.name}"
        if pa.types.is_map(kind):
            return (leaves(pa.field("key", kind.key_type), f"{path}.key_value.")
                    + leaves(pa.field("value", kind.item_type), f"{path}.key_value."))
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return leaves(pa.field("element", kind.value_type), f"{path}.list.")
        if pa.types.is_struct(kind):
            return [leaf for child in kind for leaf in leaves(child, f"{path}.")]
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return [path] if pa.types.is_string(kind) or pa.types.is_large_string(kind) else []

    return [leaf for field in schema for leaf in leaves(field, "")]


def write_parquet(table: pa.Table, where: object, compression: str = "zstd") -> None:
    """Every segment is written here: zstd, dictionaries for string columns only."""
    pq.write_table(
        table, where, compression=compression, use_dictionary=dictionary_columns(table.schema)
    )


def parquet_bytes(
    table: pa.Table, metadata: dict[bytes, bytes] | None = None, compression: str = "zstd"
) -> bytes:
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    buffer = io.BytesIO()
    write_parquet(table, buffer, compression=compression)
    return buffer.getvalue()


def write_segment(
    location: StoreLocation,
    directory: str,
    table: pa.Table,
    *,
    name: str | None = None,
    metadata: dict[bytes, bytes] | None = None,
    compression: str = "zstd",
) -> str:
    """Write `table` as one segment in `directory`; it becomes visible only when complete. Returns
    its path.
    """
    name = name or new_segment_name()
    final = f"{directory}/{name}"
    if location.is_local:
        os.makedirs(directory, exist_ok=True)
        temp = f"{directory}/{temp_name(name)}"
        if metadata:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
        atomic_write(
            final,
            lambda handle: write_parquet(table, handle, compression=compression),
            make_dirs=False,
            temporary=temp,
        )
        _fsync_dir(directory)
    else:
        location.fs.pipe_file(final, parquet_bytes(table, metadata, compression))
    return final


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _partition_filter(
    path_parts: list[str],
    jobs: set[str] | None,
    dates: tuple[str | None, str | None],
    nodes: set[str] | None,
) -> bool:
    values: dict[str, str] = {}
    for part in path_parts:
        match = _PART_RE.match(part)
        if match:
            values[match.group(1)] = match.group(2)
    if jobs is not None and values.get("job") not in jobs:
        return False
    if nodes is not None and values.get("node") not in nodes:
        return False
    date = values.get("date", "")
    low, high = dates
    if low is not None and date < low:
        return False
    return not (high is not None and date > high)


def list_partitions(location: StoreLocation, table: str) -> list[str]:
    """Every leaf partition directory of `table` (job=/date=/node=)."""
    base = location.join(table)
    location.fs.invalidate_cache()
    try:
        found = location.fs.glob(f"{base}/job=*/date=*/node=*")
    except FileNotFoundError:
        return []
    return sorted(str(path) for path in found)


def list_segments(location: StoreLocation, table: str, *, jobs: Iterable[str] | None = None,
                  date_from: str | None = None, date_to: str | None = None,
                  nodes: Iterable[str] | None = None) -> list[str]:
    """The visible segments of `table`, pruned by partition, with segments that a compacted segment
    replaces left out. Paths are sorted (by partition, then by time of writing)."""
    job_set = {safe_value(j) for j in jobs} if jobs is not None else None
    node_set = {safe_value(n) for n in nodes} if nodes is not None else None
    base = location.join(table)
    # object-store listings are cached; a reader must see new segments
    location.fs.invalidate_cache()
    try:
        found = location.fs.find(base)
    except FileNotFoundError:
        found = []
    segments = []
    for path in found:
        path = str(path)
        relative = path[len(base):].strip("/").split("/")
        if not is_segment_name(relative[-1]):
            continue
        if not _partition_filter(relative[:-1], job_set, (date_from, date_to), node_set):
            continue
        segments.append(path)
    return drop_replaced(location, sorted(segments))


def replaced_by(location: StoreLocation, compacted_path: str) -> list[str]:
    """The segment names a compacted segment replaces (from its Parquet metadata)."""
    try:
        with open_segment(location, compacted_path) as handle:
            metadata = pq.read_schema(handle).metadata or {}
    except FileNotFoundError:
        return []
    except (OSError, pa.ArrowException, ValueError):
        # a broken compacted segment replaces nothing: the reader skips it, doctor names it
        return []
    raw = metadata.get(REPLACES_KEY, b"")
    return [name for name in raw.decode().split(",") if name]


def drop_replaced(location: StoreLocation, segments: list[str]) -> list[str]:
    replaced: set[str] = set()
    for path in segments:
        directory, name = path.rsplit("/", 1)
        if name.startswith(COMPACTED_PREFIX):
            replaced.update(f"{directory}/{old}" for old in replaced_by(location, path))
    return [path for path in segments if path not in replaced]
