"""The writer's rollup: a sink keeps each partition it writes to a few segments, any history.

A node agent's sink writes one segment per partition and flush (every 5 s: 17,280 a day); a query
engine pays per file opened (DuckDB: ~0.25 ms of CPU for a segment of a few rows), so a store of
small segments costs what its file count costs, not what its data costs. The sink therefore merges
its own segments as it goes, size-tiered: once `fan_in` of its segments of one level (level 0: a
flush; level l + 1: a merge of `fan_in` of level l) sit in one partition, they become one compacted
`c-` segment of the next level, written the way `faultlens compact` writes one (its metadata names
the segments it replaces, then those are deleted). A partition written by n flushes holds at most
(fan_in - 1) segments per level, log_fan_in(n) levels, so a day at 5 s is under 30 segments at
fan_in 4, and each row is rewritten once per level.

Rules:
- Only segments this sink wrote, never another writer's (another sink's, an old process's).
- A segment (a flush's, or a merge's) is merged only once it is `min_age_s` old: a live follower
  lists it first (its tail skips a compacted segment whose replaced segments it has all listed).
- Merges of a partition and `faultlens compact` exclude each other by the partition's merge lock
  (`.merge.lock`, created exclusively); a busy lock skips this merge (the next flush tries again).
  Object stores have no exclusive create: the sink rolls up there only when asked (`Rollup` passed
  in), and `faultlens compact` must then not run on the partitions of live writers.
- A merge that fails (a source gone or unreadable, the store full) leaves the sources as they are,
  with one warning; the sink's flush never fails because of a merge.
- kill -9 at any point: before the compacted segment is visible nothing changed; after, readers drop
  the replaced sources still listed (they check the compacted segment holds their rows), and the
  next `faultlens compact` deletes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from faultlens.collectors.store.layout import (
    COMPACTED_PREFIX,
    REPLACES_KEY,
    StoreLocation,
    host_tag,
    new_segment_name,
    write_segment,
    writer_is_gone,
)
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.schema import validate

log = logging.getLogger(__name__)

#: the hidden file that excludes merges of one partition (never named like a segment)
MERGE_LOCK = ".merge.lock"
# a lock older than this is a crashed merger's, whoever took it (a merge takes seconds)
LOCK_MAX_AGE_S = 600.0


@dataclass(frozen=True)
class Rollup:
    """How a sink merges its own segments: `fan_in` segments of one level become one of the next;
    a segment waits `min_age_s` (sink clock) first; a merge never writes more than
    `max_rows` rows (bigger levels stay as they are, for `faultlens compact`); one flush makes at
    most `merges_per_roll` merges."""

    fan_in: int = 4
    min_age_s: float = 30.0
    max_rows: int = 2_000_000
    # merges one flush waits for at most (or as many as the segments it wrote, if more)
    merges_per_roll: int = 16

    def __post_init__(self) -> None:
        if self.fan_in < 2:
            raise ValueError(f"rollup fan_in must be >= 2, got {self.fan_in}")
        if self.merges_per_roll < 1:
            raise ValueError(f"rollup merges_per_roll must be >= 1, got {self.merges_per_roll}")
        if self.min_age_s < 0:
            raise ValueError(f"rollup min_age_s must be >= 0, got {self.min_age_s}")


@dataclass
class _Written:
    path: str
    rows: int
    at: float  # sink clock when it became visible


@dataclass
class _Partition:
    # level -> this sink's segments of that level still in the partition, oldest first
    levels: dict[int, list[_Written]] = field(default_factory=dict)


@contextlib.contextmanager
def merge_lock(location: StoreLocation, partition: str) -> Iterator[bool]:
    """Hold the partition's merge lock while the body runs: yields True when held (or when the store
    has no exclusive create: an object store), False when another merger holds it. A lock whose
    holder ran on this host and is gone, or that is older than LOCK_MAX_AGE_S, is taken over."""
    if not location.is_local:
        yield True
        return
    path = f"{partition}/{MERGE_LOCK}"
    owner = f"{os.getpid()}@{host_tag()}"
    fd = None
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if not _stale(path):
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        except OSError as exc:
            log.warning(
                "store %s: cannot lock %s for a merge: %s",
                location.url,
                partition,
                exc.strerror or exc,
            )
            break
    if fd is None:
        yield False
        return
    try:
        os.write(fd, owner.encode())
        os.close(fd)
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _stale(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            owner = handle.read(200).decode("utf-8", "replace")
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if age > LOCK_MAX_AGE_S:
        return True
    pid, _, host = owner.partition("@")
    # writer_is_gone reads the pid and host of a temporary name: ask it in that form
    return bool(pid.isdigit() and host) and writer_is_gone(f".x.{pid}@{host}.tmp", local=True)


class Roller:
    """A sink's record of its own segments per partition, and the merges it owes them."""

    def __init__(self, location: StoreLocation, policy: Rollup, clock: Callable[[], float]) -> None:
        self.location = location
        self.policy = policy
        self._clock = clock
        self._partitions: dict[tuple[str, str], _Partition] = {}
        self._book = threading.Lock()  # the record of segments
        self._rolling = threading.Lock()  # one roll at a time
        self._turn = 0
        self.merges = 0

    def wrote(self, table: str, path: str, rows: int) -> None:
        directory = path.rsplit("/", 1)[0]
        with self._book:  # (held for a moment only: never across a merge)
            part = self._partitions.setdefault((table, directory), _Partition())
            part.levels.setdefault(0, []).append(_Written(path, rows, self._clock()))

    def roll(self, written: int = 0) -> int:
        """Merge what is due, at most max(`merges_per_roll`, `written`: the segments of the flush
        that calls it) merges: a flush waits for merges in proportion to its own writes, and a sink
        of many partitions (which owes about a third of a merge per segment at fan_in 4) keeps up;
        the rest wait for the next flush. Partitions are taken in turn; a roll already running in
        another thread makes this one return at once. Returns how many merges were made."""
        if not self._rolling.acquire(blocking=False):
            return 0
        try:
            with self._book:
                keys = list(self._partitions)
            start = self._turn % len(keys) if keys else 0
            limit = max(self.policy.merges_per_roll, written)
            made = 0
            for index, key in enumerate(keys[start:] + keys[:start]):
                if made >= limit:
                    self._turn = start + index
                    break
                made += self._roll_partition(key, limit - made)
            self.merges += made
            return made
        finally:
            self._rolling.release()

    def _due(self, part: _Partition) -> tuple[int, list[_Written]] | None:
        now = self._clock()
        with self._book:
            levels = {level: list(segments) for level, segments in part.levels.items()}
        for level in sorted(levels):
            # every level waits: a merged segment merged again at once would replace one no tail
            # has listed (the tail skips a compacted segment only when it has read all it replaces)
            segments = [s for s in levels[level] if now - s.at >= self.policy.min_age_s]
            if len(segments) >= self.policy.fan_in:
                group = segments[: self.policy.fan_in]
                if sum(s.rows for s in group) <= self.policy.max_rows:
                    return level, group
        return None

    def _roll_partition(self, key: tuple[str, str], limit: int) -> int:
        part = self._partitions[key]
        made = 0
        while made < limit and (due := self._due(part)) is not None:
            level, group = due
            merged = self._merge(key[0], key[1], group)
            names = {s.path for s in group}
            with self._book:
                part.levels[level] = [s for s in part.levels[level] if s.path not in names]
                if merged is not None:
                    part.levels.setdefault(level + 1, []).append(merged)
            if merged is None:
                break  # sources left as they are; they are no longer this sink's to merge
            made += 1
        with self._book:
            if not any(part.levels.values()):
                del self._partitions[key]
        return made

    def _merge(self, table: str, directory: str, group: list[_Written]) -> _Written | None:
        with merge_lock(self.location, directory) as held:
            if not held:
                return None
            try:
                parts = []
                for segment in group:
                    with open_segment(self.location, segment.path) as handle:
                        import pyarrow.parquet as pq

                        parts.append(validate(table, pq.read_table(handle)))
                merged = pa.concat_tables(parts).sort_by("ts")
                names = ",".join(s.path.rsplit("/", 1)[-1] for s in group)
                path = write_segment(
                    self.location,
                    directory,
                    merged,
                    name=new_segment_name(COMPACTED_PREFIX),
                    metadata={REPLACES_KEY: names.encode()},
                )
            except FileNotFoundError:  # merged by `faultlens compact` meanwhile: nothing owed
                return None
            except Exception as exc:  # a source unreadable, the store full
                text = str(exc).strip().splitlines()
                log.warning(
                    "store %s: rollup of %d %s segments in %s left as they are: %s",
                    self.location.url,
                    len(group),
                    table,
                    directory,
                    text[0][:200] if text else type(exc).__name__,
                )
                return None
            for segment in group:
                try:
                    self.location.fs.rm_file(segment.path)
                except FileNotFoundError:
                    pass
                except OSError as exc:  # readers drop it (replaced); `faultlens compact` retries
                    log.warning(
                        "store %s: rollup cannot delete %s: %s",
                        self.location.url,
                        segment.path,
                        exc.strerror or exc,
                    )
        return _Written(path, merged.num_rows, self._clock())
