"""The follower's listing on an object store: the landing log (collectors/store/landing.py) instead
of the partitions, so that a poll costs what landed since the last one, not the store's history.

The first refresh lists the partitions once (`catch_up`: what the window already holds). Every
later one lists the landing log's time buckets from `cursor` on, with StartAfter `cursor`:
`cursor` is the previous refresh's start less `grace_s`, so a key stamped up to `grace_s` before
it became visible (a slow PUT, a writer's clock behind the follower's) is still listed. A key is
listed by every refresh within `grace_s` of its stamp; the tail reads a segment once (it keeps
what it has read of the segments listed). On S3 a bucket costs one ListObjectsV2 per 1,000 keys
after StartAfter.

A job's follower keeps the segments of its job and the node-level (`job=_node`) ones of its nodes
(those of the job's partitions, the catch-up's and every landing since); a whole-store follower
keeps every table it tails. A date older than the table's window start is dropped, as the partition
listing drops it. Segments written without a landing log (a writer of an older faultlens, a
compaction) are not seen after the catch-up; compaction only merges segments already read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from faultlens.attribution.reading.tail import NODE_JOB, s3_listing
from faultlens.collectors.store.landing import bucket_prefixes, parse_key
from faultlens.collectors.store.layout import StoreError, StoreLocation, safe_value

GRACE_S = 10.0


class LandingListing:
    """A tail's listing (SegmentTail's `listing`) from the landing log of an object store."""

    def __init__(
        self,
        location: StoreLocation,
        job: str | None,
        catch_up: Callable[[Mapping[str, str | None]], Mapping[str, list[str]]],
        *,
        nodes: Callable[[], set[str]] = set,
        grace_s: float = GRACE_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.location = location
        self.job = safe_value(job) if job is not None else None
        self.catch_up = catch_up
        self.catch_up_nodes = nodes
        self.grace_s = grace_s
        self.wall = wall
        self.cursor: float | None = None  # None until the catch-up
        self.nodes: set[str] = set()
        self._segments: dict[str, list[str]] = {}
        self._landed: dict[str, float] = {}
        self.keys_listed = 0  # landing-log keys listed by the last refresh

    def segments(self, table: str) -> list[str]:
        return list(self._segments.get(table, []))

    def landed_at(self, path: str) -> float | None:
        """When the segment became visible, by its writer's clock (None: not from the log)."""
        return self._landed.get(path)

    def refresh(self, since: Mapping[str, str | None]) -> None:
        started = self.wall()
        if self.cursor is None:
            self._segments = {table: list(paths) for table, paths in self.catch_up(since).items()}
            self.nodes |= self.catch_up_nodes()
            self._landed = {}
            self.cursor = started - self.grace_s
            return
        try:
            keys = self._keys(self.cursor, started)
        except OSError as exc:
            raise StoreError(f"store {self.location.url!r}: cannot list: {exc}") from None
        self.keys_listed = len(keys)
        found: dict[str, list[str]] = {table: [] for table in since}
        landed: dict[str, float] = {}
        entries = [entry for key in keys for entry in parse_key(self.location, key)]
        if self.job is not None:  # the job's nodes first: a node-level segment of the same flush
            self.nodes.update(e.node for e in entries if e.job == self.job)
        for entry in entries:
            if entry.table not in found:
                continue
            if self.job is not None and entry.job != self.job and not (
                entry.job == NODE_JOB and entry.node in self.nodes
            ):
                continue
            low = since.get(entry.table)
            if low is not None and entry.date < low:
                continue
            found[entry.table].append(entry.path)
            landed[entry.path] = entry.landed_at
        self._segments = {table: sorted(paths) for table, paths in found.items()}
        self._landed = landed
        self.cursor = started - self.grace_s

    def _keys(self, since_s: float, until_s: float) -> list[str]:
        fs = self.location.fs
        after = f"{int(since_s * 1e9):020d}"
        keys: list[str] = []
        for prefix in bucket_prefixes(self.location, since_s, until_s):
            directory = prefix.rstrip("/")
            entries = s3_listing(fs, directory, after)
            if entries is None:  # not plain S3: the fsspec way, filtered here
                fs.invalidate_cache(directory)
                try:
                    names = [str(p) for p in fs.find(directory)]
                except FileNotFoundError:
                    names = []
                keys.extend(n for n in names if n.rsplit("/", 1)[-1] > after)
            else:
                keys.extend(entry["name"] for entry in entries)
        return keys
