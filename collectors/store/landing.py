"""The landing log: what a live follower lists on an object store instead of the partitions.

A store's partitions are `<table>/job=/date=/node=/`: a segment that just landed sorts among the
node's older ones, so no listing of a date finds the new segments without listing the old ones (at
2,048 nodes, thousands of keys per table and hour). After each flush a sink on an object store also
writes one empty object whose key names the flush's segments, under a prefix ordered by time:

    <root>/_landed/t=<bucket start, epoch s>/<landed, epoch ns>-<uuid>~<entry>;<entry>...
    entry = <table>,<job>,<date>,<node>,<segment name without .parquet>   (escaped values)

`landed` is the writer's wall clock after the segments' PUTs completed. A reader lists the buckets
from a moment on with StartAfter that moment: its requests follow the landings since then, not the
store's history. A key holds at most KEY_LIMIT characters (S3: 1,024); a flush of more partitions
writes several. Expire `_landed/` with a lifecycle rule (a day is plenty): nothing reads it later
than a follower's grace after the landing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from faultlens.collectors.store.layout import SEGMENT_SUFFIX, StoreLocation, is_segment_name

LANDED_DIR = "_landed"
BUCKET_S = 60
KEY_LIMIT = 900


@dataclass(frozen=True)
class Landed:
    """One segment named by the landing log."""

    table: str
    job: str  # escaped, as in the path
    date: str
    node: str
    path: str
    landed_at: float  # the writer's wall clock, seconds


def _entry(location: StoreLocation, path: str) -> str | None:
    parts = path[len(location.root.rstrip("/")) + 1:].split("/")
    if len(parts) != 5 or not is_segment_name(parts[4]):
        return None
    table, job, date, node, name = parts
    fields = [table, job.removeprefix("job="), date.removeprefix("date="),
              node.removeprefix("node="), name.removesuffix(SEGMENT_SUFFIX)]
    if any(not f or "," in f or ";" in f or "~" in f for f in fields):
        return None
    return ",".join(fields)


def landing_keys(location: StoreLocation, paths: Iterable[str], landed_ns: int) -> list[str]:
    """The landing-log keys naming `paths` (segments of this store), landed at `landed_ns`."""
    bucket = landed_ns // 1_000_000_000 // BUCKET_S * BUCKET_S
    entries = [e for e in (_entry(location, p) for p in paths) if e is not None]
    keys: list[str] = []
    while entries:
        head = location.join(LANDED_DIR, f"t={bucket}", f"{landed_ns:020d}-{uuid.uuid4().hex[:8]}~")
        chunk = [entries.pop(0)]
        while entries and len(head) + len(";".join(chunk)) + 1 + len(entries[0]) <= KEY_LIMIT:
            chunk.append(entries.pop(0))
        keys.append(head + ";".join(chunk))
    return keys


def write_landed(location: StoreLocation, paths: Iterable[str]) -> int:
    """Write the landing log of a flush's segments (after their PUTs); returns the keys written.
    Nothing on a local store (its follower lists the partitions)."""
    if location.is_local:
        return 0
    keys = landing_keys(location, paths, time.time_ns())
    for key in keys:
        location.fs.pipe_file(key, b"")
    return len(keys)


def parse_key(location: StoreLocation, key: str) -> list[Landed]:
    """The segments a landing-log key names (nothing for a key not of that form)."""
    name = key.rsplit("/", 1)[-1]
    stamp, _, body = name.partition("~")
    try:
        landed_at = int(stamp.split("-", 1)[0]) / 1e9
    except ValueError:
        return []
    found = []
    for entry in body.split(";") if body else ():
        fields = entry.split(",")
        if len(fields) != 5:
            continue
        table, job, date, node, segment = fields
        path = location.join(table, f"job={job}", f"date={date}", f"node={node}",
                             segment + SEGMENT_SUFFIX)
        found.append(Landed(table, job, date, node, path, landed_at))
    return found


def bucket_prefixes(location: StoreLocation, since_s: float, until_s: float) -> list[str]:
    """The bucket prefixes of the landing log that hold landings in [since_s, until_s]."""
    first = int(since_s) // BUCKET_S * BUCKET_S
    last = int(until_s) // BUCKET_S * BUCKET_S
    return [location.join(LANDED_DIR, f"t={b}") + "/" for b in range(first, last + 1, BUCKET_S)]
