"""Parts: what one reader (a process, or the caller) assembles from a contiguous range of files,
with threads parsing a window of files ahead of the assembly; and the merge of parts read by
separate processes."""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.assembly import Assembly
from faultlens.collectors.artifacts.flight_recorder.files import file_size, load_file
from faultlens.collectors.artifacts.flight_recorder.model import CHUNK_ROWS, Dump, DumpFileError
from faultlens.collectors.artifacts.fr_limits import DumpLimits, default_limits
from faultlens.collectors.sources.source import NodeIdentity

log = logging.getLogger(__name__)

# below this, threads in one process; above, the files are split over processes
PROCESS_MIN_FILES = 1024
# dump bytes parsed ahead of the assembly (their columns are about as large): ~35 real dumps, wide
# enough to cover a chunk's build (~60 ms for CHUNK_ROWS rows)
PARSE_AHEAD_BYTES = 16 << 20


@dataclass
class ReaderPart:
    """What one reader (a process, or the caller) assembled from a contiguous range of files."""

    assembly: Assembly
    errors: list[tuple[str, str]]
    seen: list[tuple[int, str]]
    skipped: list[str]


def _loader(twins: dict[Path, Path], max_frames: int, fast_path: bool,
            limits: DumpLimits) -> Callable[[Path], Dump | DumpFileError]:
    """One file -> its dump, else its JSON twin's, else the file's error."""

    def load(path: Path) -> Dump | DumpFileError:
        try:
            return load_file(path, max_frames, fast_path, limits)
        except DumpFileError as exc:
            twin = twins.get(path)
            if twin is not None:
                try:
                    return load_file(twin, max_frames, fast_path, limits)
                except DumpFileError:
                    pass
            return exc

    return load


def _loaded(primary: list[Path], load: Callable[[Path], Dump | DumpFileError],
            workers: int, max_ahead_bytes: int = 4 * PARSE_AHEAD_BYTES
            ) -> Iterator[Dump | DumpFileError]:
    """Dumps in file order, parsed ahead by `workers` threads (parsing releases the GIL). The window
    ahead is bounded by the files' bytes (PARSE_AHEAD_BYTES), not a count: wide enough that the
    threads go on parsing while the caller builds an Arrow chunk (a quarter of a second per million
    rows, during which a window of a few dumps would leave them idle), narrow enough that only that
    many parsed dumps wait for assembly. Whatever the count, the window never holds more than
    `max_ahead_bytes` of files beside the first one (big files are read one at a time: 14 files of
    255 MB took 4 GB read two workers wide)."""
    if workers <= 1 or len(primary) <= 1:
        yield from map(load, primary)
        return
    pending: deque[tuple[Future[Dump | DumpFileError], int]] = deque()
    held = 0
    next_index = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while pending or next_index < len(primary):
            while next_index < len(primary):
                path = primary[next_index]
                size = file_size(path)
                if pending and (
                    held + size > max_ahead_bytes
                    or (len(pending) >= 2 * workers and held >= PARSE_AHEAD_BYTES)
                ):
                    break
                pending.append((pool.submit(load, path), size))
                held += size
                next_index += 1
            future, size = pending.popleft()
            held -= size
            yield future.result()


def _take(part: ReaderPart, result: Dump | DumpFileError, seen_ranks: dict[int, str],
          dir_name: str) -> None:
    """One loaded dump (or error) into the part: a rank's first dump is assembled, a second one is
    an error.
    """
    if isinstance(result, DumpFileError):
        part.errors.append((result.path, result.problem))
        log.info("flight-recorder dump skipped: %s", result)
        return
    if result.rank in seen_ranks:
        part.skipped.append(str(result.path))
        part.errors.append((str(result.path), f"second dump for rank {result.rank} (first: "
                                              f"{seen_ranks[result.rank]}); ignored"))
        return
    try:
        part.assembly.add(result, f"{dir_name}/{result.path.name}")
    # a dump the readers accepted but the assembly cannot take: this file's problem
    except Exception as exc:
        log.debug("dump not assembled: %s", result.path, exc_info=True)
        part.errors.append((str(result.path), f"unusable ({type(exc).__name__}: {str(exc)[:200]})"))
        return
    seen_ranks[result.rank] = str(result.path)
    part.seen.append((result.rank, str(result.path)))


# (first row in the set, chunk, share of the files read)
ChunkCallback = Callable[[int, pa.Table, float], None]


def read_part(primary: list[Path], twins: dict[Path, Path], wanted: set[str], dictionary: bool,
              max_frames: int, fast_path: bool, workers: int, dir_name: str,
              identity: NodeIdentity | None, limits: DumpLimits | None = None,
              on_chunk: ChunkCallback | None = None) -> ReaderPart:
    """The files `primary` (their JSON twins the fallback) loaded by `workers` threads and assembled
    into one part, its chunks handed to `on_chunk` as they are built."""
    limits = limits or default_limits()
    assembly = Assembly(columns=wanted, dictionary=dictionary, max_world_size=limits.max_world_size,
                        compiled=fast_path)
    part = ReaderPart(assembly, [], [], [])
    seen_ranks: dict[int, str] = {}
    for done, result in enumerate(
        _loaded(primary, _loader(twins, max_frames, fast_path, limits), workers,
                limits.max_ahead_bytes), 1
    ):
        _take(part, result, seen_ranks, dir_name)
        if assembly.chunk_rows >= CHUNK_ROWS:
            on_chunk = _flush(assembly, identity, on_chunk, done / len(primary))
    _flush(assembly, identity, on_chunk, 1.0)
    return part


def _flush(assembly: Assembly, identity: NodeIdentity | None, on_chunk: ChunkCallback | None,
           share: float) -> ChunkCallback | None:
    """The rows so far built into a chunk, handed to on_chunk (its first row in the set, the chunk,
    the share of the files read) as it is made; a callback that fails is logged and not called again
    (the read goes on)."""
    built = len(assembly.chunks)
    assembly.flush_chunk(identity)
    if on_chunk is None or len(assembly.chunks) == built:
        return on_chunk
    chunk = assembly.chunks[-1]
    try:
        on_chunk(assembly.rows - chunk.num_rows, chunk, share)
    except Exception:  # the consumer's problem, never the read's
        log.warning("flight-recorder read: chunk consumer failed; not called again", exc_info=True)
        return None
    return on_chunk


def read_part_in_process(args: tuple) -> ReaderPart:
    """Process-pool entry: the part, with its chunks' dictionaries made final so the caller can read
    them.
    """
    part = read_part(*args)
    assembly = part.assembly
    assembly.chunks = [
        pa.table({name: assembly.final_dictionary(name, chunk.column(name).chunk(0), keep=True)
                  for name in chunk.column_names})
        for chunk in assembly.chunks]
    return part


def _merge_membership(merged: Assembly, other: Assembly, offset: int) -> None:
    """A part's membership evidence into the merged assembly, its row numbers offset."""
    for name, members in other.group_members.items():
        merged.group_members.setdefault(name, set()).update(members)
    for name, configs in other.group_configs.items():
        merged.group_configs.setdefault(name, set()).update(configs)
    for name, row in other.group_first_row.items():
        merged.group_first_row.setdefault(name, offset + row)
    for name, desc in other.group_desc.items():
        merged.group_desc.setdefault(name, desc)
    carried = {(merged_name(merged, row), ranks) for row, ranks in merged.ranks_rows}
    for row, ranks in other.ranks_rows:
        key = (merged_name(other, row), ranks)
        if key not in carried:
            carried.add(key)
            merged.ranks_rows.append((offset + row, ranks))
            merged.row_group[offset + row] = key[0]


def merge_parts(parts: list[ReaderPart], wanted: set[str], dictionary: bool) -> Assembly:
    """One assembly from parts read by separate processes: dictionary indices remapped to set-wide
    codes, row numbers offset, membership evidence merged."""
    merged = Assembly(columns=wanted, dictionary=dictionary)
    for part in parts:
        other = part.assembly
        offset = merged.rows
        for chunk in other.chunks:
            merged.chunks.append(pa.table({name: merged.remapped(name, chunk.column(name).chunk(0))
                                           for name in chunk.column_names}))
        _merge_membership(merged, other, offset)
        if other.world_size:
            merged.world_size = max(merged.world_size or 0, other.world_size)
        merged.all_ranks.update(other.all_ranks)
        merged.rows += other.rows
    return merged


def merged_name(assembly: Assembly, row: int) -> str:
    return assembly.row_group.get(row, "")


def auto_processes(directory: str | os.PathLike[str]) -> int:
    """Processes worth starting for a directory: the CPU count (at most 8) from PROCESS_MIN_FILES
    files on, else 1 (a process costs ~1 s of start-up: imports and the compiled scanner)."""
    try:
        count = sum(1 for _ in os.scandir(directory))
    except OSError:
        return 1
    cpus = os.cpu_count() or 1
    # with few cores the reader's threads already keep them busy (the scanner releases the GIL);
    # measured on 2 cores, 2 processes were slower than 1 process with 2 threads
    return min(8, cpus // 2) if count >= PROCESS_MIN_FILES and cpus >= 4 else 1
