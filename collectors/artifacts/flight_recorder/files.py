"""Dump files: which files of a directory are dumps, the rank a file name gives, and one file (or
bytes) loaded into a Dump through the right parser, or a DumpFileError naming it (whatever it
holds)."""

from __future__ import annotations

import json
import logging
import os
import pickletools
import re
import stat
import threading
from pathlib import Path

import numpy as np

from faultlens.collectors.artifacts.flight_recorder.model import (
    DEFAULT_MAX_FRAMES,
    JSON_SUFFIXES,
    PICKLE_SUFFIXES,
    Dump,
    DumpDirError,
    DumpFileError,
    DumpFormatError,
)
from faultlens.collectors.artifacts.flight_recorder.objects import dump_from_object
from faultlens.collectors.artifacts.flight_recorder.values import check_fields, check_sequences
from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits
from faultlens.collectors.artifacts.safe_pickle import PickleLoadError, has_surrogate, safe_loads

log = logging.getLogger(__name__)

_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$", re.IGNORECASE)
# a \uD800-\uDFFF escape (an unpaired one is refused)
_JSON_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def rank_from_name(path: str | os.PathLike[str]) -> int | None:
    """The last integer of a dump file name: `_dump_9`, `comm_lib_trace_rank_9`, `rank_9.pkl` -> 9
    (a number of more than 18 digits is no rank: None)."""
    match = _RANK_IN_NAME.search(Path(path).name)
    if not match or len(match.group(1)) > 18:
        return None
    return int(match.group(1))


def file_size(path: Path) -> int:
    """A file's size, 0 where it cannot be read (its reader reports why)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _named_like_dump(name: str) -> bool:
    suffix = Path(name).suffix.lower()
    if suffix in PICKLE_SUFFIXES or suffix in JSON_SUFFIXES:
        return True
    return name[-1:].isdigit() and rank_from_name(name) is not None


def _is_candidate(path: Path) -> bool:
    """A file named as a dump. Not a folder; anything else so named (a FIFO, a device, a dangling
    link) is a candidate too, which its reader refuses unread with a line naming it."""
    name = path.name
    if name.startswith(".") or name.endswith((".tmp", ".partial")) or path.is_dir():
        return False
    return _named_like_dump(name)


def find_dump_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Dump files in `directory` (not recursive), pickles before their JSON twins; temp names are
    ignored.
    """
    root = Path(directory)
    if not root.exists():
        raise DumpDirError(f"{root}: no such directory")
    if not root.is_dir():
        raise DumpDirError(f"{root}: not a directory")
    try:
        entries = list(root.iterdir())
        files = [p for p in entries if _is_candidate(p)]
    except OSError as exc:
        raise DumpDirError(f"{root}: cannot list: {exc.strerror or exc}") from None

    chosen = set(files)  # (a list's `in` was quadratic: 134 M path compares at 16,384 ranks)
    for path in entries:  # a directory named like a dump is noted, never read
        if path not in chosen and not path.name.startswith(".") and _named_like_dump(path.name) \
                and path.is_dir():
            log.warning("%s: a directory named like a dump: skipped", path)

    def order(path: Path) -> tuple[int, int, str]:
        rank = rank_from_name(path)
        is_json = path.suffix.lower() in JSON_SUFFIXES
        return (rank if rank is not None else 1 << 62, int(is_json), path.name)

    return sorted(files, key=order)


def _looks_like_json(head: bytes) -> bool:
    stripped = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return stripped[:1] in (b"{", b"[")


#: first bytes a pickle can start with: any opcode (what a pickle that is no dump, or a hostile
#: one, does with it is the unpicklers' to say, with a better message); a file that starts with
#: anything else (NUL bytes, most binary data) is no dump
_PICKLE_STARTS = frozenset(op.code.encode("latin-1")[0] for op in pickletools.opcodes)
#: files from this size on are judged by their first bytes before they are read whole
_HEAD_BYTES = 64


def head_problem(head: bytes) -> str | None:
    """Why a file that starts with `head` cannot be a dump (neither JSON nor a pickle), else None:
    a file of zeros or text is refused after its first bytes, not read whole."""
    if not head or _looks_like_json(head) or head[0] in _PICKLE_STARTS:
        return None
    what = "NUL bytes" if head[0] == 0 else f"byte 0x{head[0]:02x}"
    return f"not a dump: starts with {what} (neither a pickle nor JSON): refused unread"


def load_file(path: Path, max_frames: int, fast_path: bool,
              limits: DumpLimits | None = None) -> Dump:
    """One dump, or DumpFileError naming the file: whatever the file holds, no other exception
    leaves here.
    """
    limits = limits or default_limits()
    try:
        return _load_file_checked(path, max_frames, fast_path, limits)
    except DumpFileError:
        raise
    except RecursionError:
        raise DumpFileError(path, "nested too deep") from None
    except MemoryError:
        raise DumpFileError(path, "out of memory while reading it") from None
    # a bad file is this file's problem, never the set's (the message says what it was)
    except Exception as exc:
        log.debug("unexpected error reading %s", path, exc_info=True)
        raise DumpFileError(path, f"unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


_local = threading.local()
#: files up to this size are read into a buffer each thread keeps (a fresh 0.5 MB array a dump cost
#: its allocation and page faults); larger ones get an array of their own, so a thread never holds
#: more than this
_REUSED_MAX_BYTES = 16 << 20


def _read_bytes(path: Path, count: int) -> np.ndarray:
    """Up to `count` bytes of the file (fewer where it holds fewer), as np.fromfile(path, uint8,
    count) reads them. Up to _REUSED_MAX_BYTES they are a view of this thread's read buffer, valid
    until the thread's next read: what a dump keeps is copied out of it (the parsers' columns,
    strings and decoded values are their own objects)."""
    if count > _REUSED_MAX_BYTES:
        return np.fromfile(path, dtype=np.uint8, count=count)
    buf = getattr(_local, "read_buffer", None)
    if buf is None or buf.shape[0] < count:
        size = max(count, 1 << 20, 0 if buf is None else min(2 * buf.shape[0], _REUSED_MAX_BYTES))
        _local.read_buffer = None  # the old one freed before the new one is allocated
        buf = _local.read_buffer = np.empty(size, np.uint8)
    view = memoryview(buf)[:count]
    got = 0
    # O_NONBLOCK: a file swapped for a FIFO or a blocking special file since the stat never blocks
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with open(fd, "rb", buffering=0) as file:
        while got < count:
            read = file.readinto(view[got:])
            if not read:
                break
            got += read
    return buf[:got]


def _read_head(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        return os.pread(fd, _HEAD_BYTES, 0)
    finally:
        os.close(fd)


def _load_file_checked(path: Path, max_frames: int, fast_path: bool, limits: DumpLimits) -> Dump:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # opening a FIFO blocks, reading a device never ends
            raise DumpFileError(path, "not a regular file (a FIFO, device or socket): refused "
                                      "unread")
        size = info.st_size
        if size == 0:  # empty; or procfs/sysfs (size 0: /proc/kmsg blocks a reader forever)
            raise DumpFileError(path, "empty file (a dump cut short, or a procfs/sysfs file): "
                                      "refused unread")
        if size > limits.max_file_bytes:
            raise DumpFileError(path, f"{size} bytes: larger than any real dump (limit "
                                      f"{limits.max_file_bytes}, "
                                      "FAULTLENS_FR_MAX_FILE_BYTES)")
        if size > _HEAD_BYTES:
            problem = head_problem(_read_head(path))
            if problem is not None:
                raise DumpFileError(path, problem)
        # the size read (plus one byte, to see a file that grew since the stat): numpy allocates
        # `count` bytes before it reads, and a count of the limit (256 MiB) cost 0.4 ms a 0.5 MB
        # dump, 7x the read itself
        buf = _read_bytes(path, size + 1)
        # written to since the stat: read what it holds now, up to the limit
        if buf.shape[0] > size:
            buf = np.fromfile(path, dtype=np.uint8, count=limits.max_file_bytes + 1)
        mtime_ns = path.stat().st_mtime_ns
    except OSError as exc:
        raise DumpFileError(path, f"cannot read: {exc.strerror or exc}") from None
    if buf.shape[0] == 0:
        raise DumpFileError(path, "empty file (a dump cut short?)")
    if buf.shape[0] > limits.max_file_bytes:
        raise DumpFileError(
            path, f"larger than any real dump (limit {limits.max_file_bytes} bytes)"
        )
    dump = _load_buffer(buf, path, max_frames, fast_path, limits)
    dump.mtime_ns = mtime_ns
    return dump


def load_dump_bytes(data: bytes, name: str = "rank_0.pkl", *, fast_path: bool = False,
                    max_frames: int = DEFAULT_MAX_FRAMES, limits: DumpLimits | None = None) -> Dump:
    """One dump from bytes, as the reader would read a file called `name` (tests and the fuzz bench
    compare the two pickle paths with it). Raises DumpFileError naming `name`, and nothing else."""
    limits = limits or default_limits()
    path = Path(name)
    buf = np.frombuffer(data, dtype=np.uint8)
    try:
        if buf.shape[0] == 0:
            raise DumpFileError(path, "empty file (a dump cut short?)")
        if buf.shape[0] > limits.max_file_bytes:
            raise DumpFileError(path, f"larger than any real dump (limit {limits.max_file_bytes} "
                                      "bytes)")
        return _load_buffer(buf, path, max_frames, fast_path, limits)
    except DumpFileError:
        raise
    except RecursionError:
        raise DumpFileError(path, "nested too deep") from None
    except MemoryError:
        raise DumpFileError(path, "out of memory while reading it") from None
    except Exception as exc:
        raise DumpFileError(path, f"unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"duplicate key {duplicate[:60]!r}: which one is meant is not known")
    return obj


#: what json.loads builds, at most: a list or dict per bracket, a string object per two quotes, a
#: key-value pair (tuple, list slot and dict item: object_pairs_hook) per colon, and for every byte
#: a share of an int or a slot
_JSON_BYTE_COST, _JSON_CONTAINER_COST, _JSON_QUOTE_COST, _JSON_PAIR_COST = 8, 64, 25, 112


def json_alloc_estimate(data: bytes) -> int:
    """An upper estimate of the bytes json.loads builds from `data` (counted at C speed: brackets
    and quotes inside strings count too, which only overestimates)."""
    return (
        _JSON_BYTE_COST * len(data)
        + _JSON_CONTAINER_COST * (data.count(b"[") + data.count(b"{"))
        + _JSON_QUOTE_COST * data.count(b'"')
        + _JSON_PAIR_COST * data.count(b":")
    )


def _long_string(value: object, limit: int) -> int:
    """The length of the first string (key or value) in `value` longer than `limit`, else 0."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) > limit:
                return len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return 0


def _json_long_string(obj: object, limit: int) -> str | None:
    """Where a JSON dump holds a string longer than `limit` (the pickle readers' max_string_bytes:
    JSON dumps meet the same field limits), as 'entry 3 profiling_name' or a top-level key."""
    if not isinstance(obj, dict):
        return "the top level" if _long_string(obj, limit) else None
    for key, value in obj.items():
        if len(key) > limit:
            return "a top-level key"
        if key == "entries" and isinstance(value, list):
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    for field, item in entry.items():
                        if _long_string(field, limit) or _long_string(item, limit):
                            return f"entry {i} {field[:60]}"
                elif _long_string(entry, limit):
                    return f"entry {i}"
        elif _long_string(value, limit):
            return f"'{key[:60]}'"
    return None


def _json_dump(buf: np.ndarray, path: Path, limits: DumpLimits) -> Dump:
    data = buf.tobytes()
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark, as some editors write
        data = data[3:]
    estimate, budget = json_alloc_estimate(data), limits.alloc_budget(len(data))
    if estimate > budget:
        raise DumpFileError(path, f"not a usable JSON dump: would build ~{estimate >> 20} MiB of "
                                  f"objects from {len(data)} bytes, more than a dump may "
                                  f"({budget >> 20} MiB: limit fr_limits alloc_per_byte / "
                                  "max_alloc_bytes)")
    try:
        obj = json.loads(data, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise DumpFileError(
            path, "not a usable JSON dump: nested deeper than the parser's limit"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DumpFileError(
            path, f"not valid JSON (truncated or corrupt?): {str(exc)[:200]}"
        ) from None
    if _JSON_SURROGATE.search(data) and has_surrogate(obj):
        raise DumpFileError(path, "not a usable JSON dump: a string holds a lone surrogate "
                                  "(\\ud800-\\udfff)")
    where = _json_long_string(obj, limits.max_string_bytes)
    if where is not None:
        raise DumpFileError(path, f"not a usable JSON dump: {where}: a string longer than "
                                  f"{limits.max_string_bytes} characters (limit fr_limits "
                                  "max_string_bytes)")
    return dump_from_object(obj, path, "json", 0, limits, int(buf.shape[0]))


def _pickle_dump(buf: np.ndarray, path: Path, max_frames: int, fast_path: bool,
                 limits: DumpLimits) -> Dump:
    dump = None
    # the compiled scanner (numba) loaded for the sets it reads only
    if fast_path and buf.shape[0] <= limits.max_scan_bytes:
        from faultlens.collectors.artifacts.flight_recorder.fastpath import dump_fast

        dump = dump_fast(buf, path, max_frames, limits)
    if dump is None:
        try:
            obj = safe_loads(buf.tobytes(), source=str(path), limits=limits)
        except PickleLoadError as exc:
            raise DumpFileError(path, str(exc).removeprefix(f"{path}: ")) from None
        dump = dump_from_object(obj, path, "pickle", max_frames, limits, int(buf.shape[0]))
    return dump


def _settle_rank(dump: Dump, path: Path, limits: DumpLimits) -> None:
    """World size and rank within a real job's; a dump without a rank takes the file name's."""
    world = limits.max_world_size
    if dump.world_size is not None and not 0 <= dump.world_size <= world:
        raise DumpFileError(path, f"world_size {dump.world_size} is not a job's (limit {world}, "
                                  "FAULTLENS_FR_MAX_WORLD_SIZE)")
    if dump.rank >= world:
        raise DumpFileError(path, f"rank {dump.rank} is not a job's (limit {world}, "
                                  "FAULTLENS_FR_MAX_WORLD_SIZE)")
    if dump.rank < 0:
        from_name = rank_from_name(path)
        if from_name is None:
            raise DumpFileError(path, "cannot tell the rank: no top-level 'rank' and no number in "
                                      "the file name")
        if from_name >= world:
            raise DumpFileError(path, f"rank {from_name} (from the file name) is not a job's "
                                      f"(limit {world}, "
                                      "FAULTLENS_FR_MAX_WORLD_SIZE)")
        dump.rank = from_name


def _load_buffer(buf: np.ndarray, path: Path, max_frames: int, fast_path: bool,
                 limits: DumpLimits) -> Dump:
    problem = head_problem(buf[:_HEAD_BYTES].tobytes())
    if problem is not None:
        raise DumpFileError(path, problem.replace(": refused unread", ""))
    try:
        if _looks_like_json(buf[:64].tobytes()):
            dump = _json_dump(buf, path, limits)
        else:
            dump = _pickle_dump(buf, path, max_frames, fast_path, limits)
        check_fields(dump, limits)
        check_sequences(dump)
    except DumpFormatError as exc:
        raise DumpFileError(path, str(exc)) from None
    _settle_rank(dump, path, limits)
    return dump
