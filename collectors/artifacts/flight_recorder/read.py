"""The public read functions: a directory of dumps (read_dump_dir) or one file (read_dump_file) into
`collectives` rows."""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.assembly import Assembly
from faultlens.collectors.artifacts.flight_recorder.files import (
    file_size,
    find_dump_files,
    load_file,
)
from faultlens.collectors.artifacts.flight_recorder.model import (
    DEFAULT_MAX_FRAMES,
    JSON_SUFFIXES,
    PICKLE_SUFFIXES,
    SCHEMA,
    TABLE,
    DumpDirError,
    DumpFileError,
    DumpSet,
)
from faultlens.collectors.artifacts.flight_recorder.parts import (
    ChunkCallback,
    ReaderPart,
    merge_parts,
    read_part,
    read_part_in_process,
)
from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.schema import validate

log = logging.getLogger(__name__)

#: dump sets smaller than this are read through the restricted unpickler (no numba compile on a
#: first use); its opcode pre-passes (safe_pickle.check_opcodes: limits, tuple hashing) cost ~3x the
#: load, so above 16 MiB the compiled scanner (which checks the same limits in its one pass) is the
#: faster way
FAST_PATH_MIN_BYTES = 16 * 1024 * 1024


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic collector off while a set is read: the read allocates millions of small
    objects and keeps few of them, none in cycles, and the collections they trigger traverse
    everything the process holds (2-3% of a large read's CPU). Restored after, whatever happens; a
    caller that had it off keeps it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _wanted(columns: Iterable[str] | None) -> set[str]:
    wanted = set(SCHEMA.names if columns is None else columns)
    unknown = wanted - set(SCHEMA.names)
    if unknown:
        raise ValueError(f"unknown collectives column(s): {', '.join(sorted(unknown))}")
    return wanted


def _primary_and_twins(files: list[Path]) -> tuple[list[Path], dict[Path, Path]]:
    """The files to read, and each one's JSON twin (read only if the pickle fails)."""
    primary: list[Path] = []
    twins: dict[Path, Path] = {}
    stems: dict[str, Path] = {}
    for path in files:
        stem = (
            path.name[: -len(path.suffix)]
            if path.suffix.lower() in PICKLE_SUFFIXES + JSON_SUFFIXES
            else path.name
        )
        if path.suffix.lower() in JSON_SUFFIXES and stem in stems:
            twins[stems[stem]] = path
            continue
        stems.setdefault(stem, path)
        primary.append(path)
    return primary, twins


def _within_set_budget(primary: list[Path], files: int,
                       limits: DumpLimits) -> tuple[list[Path], list[DumpFileError]]:
    """The files the set's budget admits (limits.set_budget: smallest first, so that large files
    never crowd out the small ones real dumps are), in their order; and an error for each other."""
    sizes = {path: file_size(path) for path in primary}
    budget = limits.set_budget(files)
    if sum(sizes.values()) <= budget:
        return primary, []
    admitted: set[Path] = set()
    spent = 0
    for path in sorted(primary, key=lambda p: (sizes[p], str(p))):
        if spent + sizes[path] > budget:
            break
        spent += sizes[path]
        admitted.add(path)
    refused = [
        DumpFileError(path, f"{sizes[path]} bytes beyond the set's read budget ({budget} bytes for "
                            f"{files} files, the smaller ones read first; "
                            "FAULTLENS_FR_MAX_SET_BYTES): refused unread")
        for path in primary if path not in admitted]
    return [path for path in primary if path in admitted], refused


def _read_in_processes(
    primary: list[Path],
    twins: dict[Path, Path],
    wanted: set[str],
    max_frames: int,
    fast_path: bool,
    workers: int,
    processes: int,
    dir_name: str,
    identity: NodeIdentity | None,
    limits: DumpLimits,
) -> list[ReaderPart] | None:
    """The files split over `processes` spawned processes; None when one rank turned up in two
    ranges (two names for one rank), which only a single reader resolves (it keeps the first)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    size = -(-len(primary) // processes)
    ranges = [primary[i:i + size] for i in range(0, len(primary), size)]
    args = [(paths, {p: twins[p] for p in paths if p in twins}, wanted, True, max_frames, fast_path,
             max(1, workers // processes), dir_name, identity, limits) for paths in ranges]
    with ProcessPoolExecutor(
        max_workers=len(ranges), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        parts = list(pool.map(read_part_in_process, args))
    seen_all = [rank for part in parts for rank, _ in part.seen]
    return parts if len(seen_all) == len(set(seen_all)) else None


def _dump_set(parts: list[ReaderPart], assembly: Assembly, primary: list[Path],
              twins: dict[Path, Path], wanted: set[str], columns: Iterable[str] | None,
              dictionary: bool, identity: NodeIdentity | None, started: float,
              refused: list[DumpFileError]) -> DumpSet:
    errors = refused + [
        DumpFileError(path, problem) for part in parts for path, problem in part.errors
    ]
    skipped = [str(twins[p]) for p in primary if p in twins] + [
        s for part in parts for s in part.skipped
    ]
    seen = [(rank, path) for part in parts for rank, path in part.seen]
    if not seen:
        table = SCHEMA.empty_table().select([c for c in SCHEMA.names if c in wanted])
    else:
        table = assembly.table(identity)
    if columns is None and not dictionary:
        table = validate(TABLE, table)
    return DumpSet(
        table=table,
        ranks=tuple(sorted(rank for rank, _ in seen)),
        files=tuple(p for _, p in seen),
        errors=tuple(errors),
        world_size=assembly.world_size,
        skipped=tuple(skipped),
        seconds=time.perf_counter() - started,
    )


def read_dump_dir(
    directory: str | os.PathLike[str],
    *,
    identity: NodeIdentity | None = None,
    columns: Iterable[str] | None = None,
    max_frames: int = DEFAULT_MAX_FRAMES,
    dictionary: bool = False,
    fast_path: bool | None = None,
    workers: int | None = None,
    processes: int | None = None,
    limits: DumpLimits | None = None,
    on_chunk: ChunkCallback | None = None,
) -> DumpSet:
    """Read every dump in `directory` into `collectives` rows.

    columns: the subset of the table's columns to build (default all; analysis needs far fewer).
    dictionary: keep string columns dictionary-encoded (narrow indices), the sizes and dtypes
    lists as dictionary arrays over the distinct values (shapes.py) and the integer columns a few
    rows are read of as int32 where they fit (smaller and faster for analysis); the default gives
    the table exactly in the schema. fast_path=False loads pickles through the restricted unpickler
    only (the reference path the fast scanner is tested against); True uses the compiled scanner;
    None (default) uses it when the dump set holds at least FAST_PATH_MIN_BYTES, since its first use
    after install compiles the numba kernels (10-20 s), which a small set — a live hang of a small
    job — must not wait for. workers: threads per process (default: CPU count, at most 8).
    processes: split the files over this many processes (spawned: a calling script needs the usual
    `if __name__ == "__main__":` guard); default 1; auto_processes() suggests a count for a
    directory. limits: resource limits on each dump (faultlens.collectors.artifacts.fr_limits;
    default: its defaults with the FAULTLENS_FR_* environment overrides); a dump beyond one is a
    per-file error. on_chunk: called with (first row, chunk, share of the files read so far) for
    each chunk of rows as the read builds it (single process only), so a consumer can start on the
    rows while the rest are read (the hang analysis' first pass); the chunk's dictionary columns
    hold the dictionary as it was then (a prefix of the table's), and the set-wide columns
    (pg_ranks, the identity's) come only with the table. Per-file problems are in DumpSet.errors
    (whatever a file holds, it never ends the set); DumpDirError when the directory is missing or
    holds no dump.
    """
    limits = limits or default_limits()
    started = time.perf_counter()
    wanted = _wanted(columns)
    if "frames" not in wanted:
        max_frames = 0
    files = find_dump_files(directory)
    if not files:
        raise DumpDirError(f"{directory}: no flight-recorder dumps (expected files like "
                           "rank_0.pkl, _dump_0, "
                           "comm_lib_trace_rank_0, rank_0.json)")
    primary, twins = _primary_and_twins(files)
    primary, refused = _within_set_budget(primary, len(files), limits)
    for error in refused:
        log.warning("flight-recorder dump skipped: %s", error)
    if fast_path is None:
        fast_path = sum(file_size(p) for p in primary) >= FAST_PATH_MIN_BYTES
    workers = workers or min(8, os.cpu_count() or 1)
    dir_name = Path(directory).resolve().name
    with _cyclic_gc_paused():
        parts = None
        if (processes or 1) > 1:
            parts = _read_in_processes(
                primary,
                twins,
                wanted,
                max_frames,
                fast_path,
                workers,
                processes,
                dir_name,
                identity,
                limits,
            )
        if parts is not None:
            assembly = merge_parts(parts, wanted, dictionary)
        else:
            parts = [read_part(primary, twins, wanted, dictionary, max_frames, fast_path, workers,
                               dir_name, identity, limits, on_chunk)]
            assembly = parts[0].assembly
        return _dump_set(parts, assembly, primary, twins, wanted, columns, dictionary, identity,
                         started, refused)


def read_dump_file(
    path: str | os.PathLike[str],
    *,
    identity: NodeIdentity | None = None,
    max_frames: int = DEFAULT_MAX_FRAMES,
    limits: DumpLimits | None = None,
) -> pa.Table:
    """One dump file -> conforming `collectives` rows. Raises DumpFileError naming the file."""
    path = Path(path)
    dump = load_file(path, max_frames, True, limits)
    assembly = Assembly(columns=set(SCHEMA.names), dictionary=False)
    assembly.add(dump, f"{path.resolve().parent.name}/{path.name}")
    return validate(TABLE, assembly.table(identity))
