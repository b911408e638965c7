"""Store health check: the segments readers skip (unreadable, wrong schema) and the temporary files
no writer will finish; with `quarantine=True` bad segments are moved under `<root>/_quarantine/`
(same relative path, so they can be put back) and stale temporary files removed. Backs `faultlens
doctor`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from faultlens.attribution.reading.maintenance import stale_temps
from faultlens.attribution.reading.segment_check import check_segment, deep_check
from faultlens.collectors.store.layout import (
    StoreLocation,
    list_partitions,
    list_segments,
    probe_store,
    resolve_store,
)
from faultlens.collectors.store.schema import TABLE_NAMES

QUARANTINE_DIR = "_quarantine"


class Problem(StrEnum):
    BAD_SEGMENT = "bad_segment"
    STALE_TEMP = "stale_temp"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Finding:
    table: str
    problem: Problem
    path: str
    reason: str
    action: str = ""  # quarantined -> <path>, removed, or "" (nothing done)


def quarantine_path(location: StoreLocation, path: str) -> str:
    relative = path[len(location.root.rstrip("/")):].lstrip("/")
    return location.join(QUARANTINE_DIR, relative)


def _move(location: StoreLocation, source: str, target: str) -> None:
    if location.is_local:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(source, target)
    else:
        location.fs.mv(source, target)


def check_store(
    store: str | StoreLocation,
    tables: Sequence[str] = TABLE_NAMES,
    *,
    deep: bool = False,
    quarantine: bool = False,
    clock: float | None = None,
) -> list[Finding]:
    """Every problem found (and, with quarantine, what was done about it)."""
    location = resolve_store(store)
    probe_store(location)
    now = time.time() if clock is None else clock
    findings: list[Finding] = []
    for table in tables:
        for path in list_segments(location, table):
            reason = (
                deep_check(location, table, path) if deep else check_segment(location, table, path)
            )
            if reason is None:
                continue
            action = ""
            if quarantine:
                target = quarantine_path(location, path)
                try:
                    _move(location, path, target)
                    action = f"quarantined -> {target}"
                except OSError as exc:
                    action = f"cannot quarantine: {exc.strerror or exc}"
            findings.append(Finding(table, Problem.BAD_SEGMENT, path, reason, action))
        for partition in list_partitions(location, table):
            try:
                names = [str(p).rsplit("/", 1)[-1] for p in location.fs.ls(partition, detail=False)]
            except FileNotFoundError:
                continue
            temps = [f"{partition}/{n}" for n in names if n.startswith(".") and n.endswith(".tmp")]
            for path in stale_temps(location, temps, now):
                action = ""
                if quarantine:
                    with contextlib.suppress(FileNotFoundError):
                        location.fs.rm_file(path)
                    action = "removed"
                findings.append(Finding(table, Problem.STALE_TEMP, path,
                                        "temporary file of a writer that is gone (or older than an "
                                        "hour)", action))
    return findings
