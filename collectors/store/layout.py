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
import logging
import os
import re
import socket
import stat
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.store.atomic import atomic_write
from faultlens.collectors.store.localfs import LocalFS
from faultlens.collectors.store.native_read import open_segment
from faultlens.errors import FaultlensError

if TYPE_CHECKING:
    import fsspec

log = logging.getLogger(__name__)

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


def _local_root(url: str) -> str | None:
    """The root fsspec would give a plain local path or a file:// URL (its make_path_posix), else
    None (any other URL: fsspec resolves it)."""
    path = url
    for prefix in ("file://", "local://"):
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    if ":" in path or os.sep != "/":
        return None
    if path.startswith("~"):
        path = os.path.expanduser(path)
    elif not path.startswith("/"):
        path = f"{os.getcwd()}/{'' if path == '.' else path.removeprefix('./')}"
    return path.rstrip("/") or "/"


def resolve_store(
    url: str | StoreLocation, *, create: bool = False, **storage_options: object
) -> StoreLocation:
    """Turn a path or URL (`./store`, `file:///x`, `s3://bucket/prefix`, `memory://x`) into a
    StoreLocation. With create=False a local root that does not exist or is not a readable directory
    raises StoreError. A local path is resolved without importing fsspec (LocalFS)."""
    if isinstance(url, StoreLocation):
        return url
    local = None if storage_options else _local_root(str(url))
    fs: Any
    if local is not None:
        fs, root = LocalFS(), local
    else:
        import fsspec

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
        raise StoreError(
            f"store {location.url!r}: cannot reach: {text[0] if text else type(exc).__name__}"
        ) from None


#: the longest partition value, once escaped (a path component holds 255 bytes)
MAX_PARTITION_VALUE = 200


def safe_value(value: str) -> str:
    """A partition value made safe for a path component, reversibly: every character outside
    [A-Za-z0-9._:@+-] is written as %XX of its UTF-8 bytes (`a/b` -> `a%2Fb`, so `a/b` and `a_b`
    never share a partition); a value of those characters only is written as it is. The empty
    value is `_` (and the value `_` is `%5F`). StoreError when the escaped value is longer than
    MAX_PARTITION_VALUE."""
    if not value:
        return "_"
    if value == "_":
        return "%5F"
    if _SAFE_VALUE_RE.search(value) is None:
        escaped = value
    else:
        escaped = "".join(
            char
            if _SAFE_VALUE_RE.match(char) is None
            else "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
            for char in value
        )
    if len(escaped) > MAX_PARTITION_VALUE:
        raise StoreError(
            f"partition value {value[:40]!r}...: {len(value)} characters ({len(escaped)} escaped), "
            f"at most {MAX_PARTITION_VALUE}"
        )
    return escaped


def unescape_value(escaped: str) -> str:
    """safe_value's inverse (`_` -> the empty value)."""
    return "" if escaped == "_" else urllib.parse.unquote(escaped, errors="surrogatepass")


def partition_dir(location: StoreLocation, table: str, job: str, date: str, node: str) -> str:
    return location.join(
        table, f"job={safe_value(job)}", f"date={safe_value(date)}", f"node={safe_value(node)}"
    )


def new_segment_name(prefix: str = "") -> str:
    return f"{prefix}{time.time_ns():020d}-{uuid.uuid4().hex[:12]}{SEGMENT_SUFFIX}"


TEMP_SUFFIX = ".tmp"


def _host_tag() -> str:
    return _SAFE_VALUE_RE.sub("_", socket.gethostname())[:64].replace("@", "_") or "_"


def host_tag() -> str:
    """This host's name as temporary names and merge locks carry it."""
    return _host_tag()


def temp_name(name: str) -> str:
    """The hidden name a segment is written under: `.<name>.<pid>@<host>.tmp` (who wrote it, so that
    compaction can tell a dead writer's leftover from a segment being written now)."""
    return f".{name}.{os.getpid()}@{_host_tag()}{TEMP_SUFFIX}"


def temp_writer(name: str) -> tuple[int | None, str | None]:
    """(pid, host) of a temporary file's writer; host None for the older `.<name>.<pid>.tmp`
    form."""
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return None, None
    body = name[1 : -len(TEMP_SUFFIX)]
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
            return leaves(pa.field("key", kind.key_type), f"{path}.key_value.") + leaves(
                pa.field("value", kind.item_type), f"{path}.key_value."
            )
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
    import pyarrow.parquet as pq  # (here: a reader of an empty store never needs it)

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
    try:
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
    except StoreError:
        raise
    except OSError as exc:  # ENOSPC, EDQUOT, EROFS, EACCES, a file-size limit: one line
        raise StoreError(
            f"store {location.url!r}: cannot write a segment in {directory}: {exc.strerror or exc}"
        ) from None
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


def list_segments(
    location: StoreLocation,
    table: str,
    *,
    jobs: Iterable[str] | None = None,
    date_from: str | None = None,
    date_to: str | None = None,
    nodes: Iterable[str] | None = None,
) -> list[str]:
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
    for path in checked_segments(location, [str(path) for path in found]):
        relative = path[len(base) :].strip("/").split("/")
        if not _partition_filter(relative[:-1], job_set, (date_from, date_to), node_set):
            continue
        segments.append(path)
    return drop_replaced(location, sorted(segments))


# listing entries already warned about (path -> reason), so a poll loop does not repeat itself
_WARNED: dict[str, str] = {}
_WARNED_MAX = 10_000


def _skip_entry(location: StoreLocation, path: str, reason: str) -> None:
    if _WARNED.get(path) != reason:
        if len(_WARNED) >= _WARNED_MAX:
            _WARNED.clear()
        _WARNED[path] = reason
        log.warning("store %s: skipping %s: %s", location.url, path, reason)


def _inside(root_real: str, real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip("/") + "/")


def _entry_problem(root_real: str, path: str, parents: dict[str, bool]) -> str | None:
    """Why a local listing entry is not a segment file of the store (None: it is one). `parents`:
    partition directory -> inside the store (resolved once per directory and listing)."""
    parent = path.rsplit("/", 1)[0]
    if parent not in parents:
        parents[parent] = _inside(root_real, os.path.realpath(parent))
    if not parents[parent]:
        return "outside the store (a symlinked directory)"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None  # gone since the listing: not a problem, simply not there
    except OSError as exc:
        return f"cannot stat: {exc.strerror or exc}"
    if stat.S_ISLNK(info.st_mode):
        real = os.path.realpath(path)
        if not os.path.lexists(real) or not os.path.exists(path):
            return "dangling symlink"
        if not _inside(root_real, real):
            return f"symlink to {real}, outside the store"
        info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        return "a directory named like a segment"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    return None


def checked_segments(location: StoreLocation, paths: Iterable[str]) -> list[str]:
    """The listing guard every listing path calls before any reader or engine sees an entry: keeps
    the entries that are segments, i.e. named like one (`is_segment_name`), directly in a
    `<table>/job=/date=/node=` partition of this store and, on a local filesystem, regular files
    inside the store (a symlink is followed only to a regular file inside the store root). Anything
    else named like a segment (a dangling symlink, a symlink out, a directory `X.parquet/` or a file
    inside one, a FIFO or device) is skipped with one warning naming it. Order is kept."""
    root = location.root.rstrip("/")
    root_real = os.path.realpath(root) if location.is_local else root
    kept = []
    parents: dict[str, bool] = {}
    for path in paths:
        path = str(path)
        if not path.startswith(root + "/"):
            continue
        parts = path[len(root) + 1 :].split("/")
        if not any(is_segment_name(part) for part in parts[1:]):
            continue  # not named like a segment anywhere: temporary files, other files
        if (
            len(parts) != 5
            or not parts[1].startswith("job=")
            or not parts[2].startswith("date=")
            or not parts[3].startswith("node=")
            or not is_segment_name(parts[4])
        ):
            _skip_entry(location, path, "not a segment of a job=/date=/node= partition")
            continue
        if location.is_local:
            reason = _entry_problem(root_real, path, parents)
            if reason is not None:
                _skip_entry(location, path, reason)
                continue
        kept.append(path)
    return kept


def replaced_by(location: StoreLocation, compacted_path: str) -> list[str]:
    """The segment names a compacted segment replaces (from its Parquet metadata). Metadata that is
    not UTF-8, or names that are not segment names, replace nothing (with a warning)."""
    import pyarrow.parquet as pq

    try:
        with open_segment(location, compacted_path) as handle:
            metadata = pq.read_schema(handle).metadata or {}
    except FileNotFoundError:
        return []
    except (OSError, pa.ArrowException, ValueError):
        # a broken compacted segment replaces nothing: the reader skips it, doctor names it
        return []
    raw = metadata.get(REPLACES_KEY, b"")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        _skip_entry(
            location,
            compacted_path,
            "its faultlens.replaces metadata is not UTF-8: it replaces nothing",
        )
        return []
    names = [name for name in text.split(",") if name]
    good = [name for name in names if is_segment_name(name) and "/" not in name]
    if len(good) != len(names):
        _skip_entry(
            location,
            compacted_path,
            "faultlens.replaces names something that is not a segment: those names ignored",
        )
    return good


# (compacted segment, the replaced segments still listed beside it) -> it holds all their rows
_HOLDS: dict[tuple[str, tuple[str, ...]], bool] = {}


def _ts_values(location: StoreLocation, path: str, *, whole: bool) -> np.ndarray:
    """The segment's ts values as int64; `whole` reads every column (every data page checked)."""
    import pyarrow.parquet as pq

    with open_segment(location, path) as handle:
        parquet = pq.ParquetFile(handle)
        parts = []
        for batch in parquet.iter_batches(columns=None if whole else ["ts"]):
            column = batch.column(batch.schema.get_field_index("ts"))
            parts.append(column.cast(pa.int64()).to_numpy(zero_copy_only=False))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def holds_rows_of(location: StoreLocation, compacted: str, originals: Sequence[str]) -> bool:
    """Does `compacted` read whole (every page) and hold at least the rows of `originals` (checked
    by their `ts` values, with multiplicity)? Asked only while originals still sit beside it (a
    compaction between its write and its deletes, or a forged file); the answer is cached."""
    key = (compacted, tuple(sorted(originals)))
    if key in _HOLDS:
        return _HOLDS[key]
    try:
        mine = _ts_values(location, compacted, whole=True)
        theirs = np.concatenate([_ts_values(location, path, whole=False) for path in originals])
    except FileNotFoundError:
        return True  # gone since the listing: compaction finished, the next listing is plain
    except Exception:  # an unreadable file holds nothing
        holds = False
    else:
        have, have_counts = np.unique(mine, return_counts=True)
        need, need_counts = np.unique(theirs, return_counts=True)
        index = np.clip(np.searchsorted(have, need), 0, max(len(have) - 1, 0))
        holds = bool(
            len(need) == 0
            or (
                len(have) > 0
                and np.all(have[index] == need)
                and np.all(have_counts[index] >= need_counts)
            )
        )
    if len(_HOLDS) >= _WARNED_MAX:
        _HOLDS.clear()
    _HOLDS[key] = holds
    return holds


def replaced_segments(
    location: StoreLocation,
    segments: Sequence[str],
    names_of: Callable[[str], list[str]] | None = None,
) -> set[str]:
    """The listed segments that a listed compacted segment really replaces: those its metadata
    names, unless one of them is still listed and the compacted segment does not hold its rows (then
    none of them is replaced, with a warning). `names_of`: the names a compacted segment lists
    (default replaced_by; a poller passes its cache)."""
    names_of = names_of or (lambda path: replaced_by(location, path))
    listed = set(segments)
    replaced: set[str] = set()
    for path in segments:
        directory, name = path.rsplit("/", 1)
        if not name.startswith(COMPACTED_PREFIX):
            continue
        olds = [f"{directory}/{old}" for old in names_of(path)]
        present = [old for old in olds if old in listed]
        if present and not holds_rows_of(location, path, present):
            _skip_entry(
                location,
                path,
                f"it does not hold the rows of the {len(present)} "
                "segment(s) it lists as replaced: they are kept",
            )
            continue
        replaced.update(olds)
    return replaced


def drop_replaced(location: StoreLocation, segments: list[str]) -> list[str]:
    replaced = replaced_segments(location, segments)
    return [path for path in segments if path not in replaced]
