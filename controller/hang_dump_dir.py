"""A directory of flight-recorder dumps read and analysed for a hang, the analysis' first pass
running on the rows as they are read (attribution/detectors/hang/stream.py): what `faultlens
analyze-hang` does, one call."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from faultlens.attribution.detectors.hang import (
    COLUMNS,
    HangReport,
    PassOneStream,
    analyze_collectives,
)
from faultlens.attribution.detectors.hang.seq_consistency import (
    find_contradictions,
    without_ranks,
)
from faultlens.collectors.artifacts.flight_recorder import (
    DumpFileError,
    DumpSet,
    rank_from_name,
    read_dump_dir,
)
from faultlens.collectors.artifacts.fr_limits import DumpLimits


def analyze_dump_dir(
    directory: str | os.PathLike[str],
    *,
    expected_ranks: Sequence[int] | None = None,
    stacks: Mapping[int, Any] | None = None,
    processes: int | None = None,
    limits: DumpLimits | None = None,
) -> tuple[DumpSet, HangReport]:
    """The dumps of `directory` read (the columns the analysis reads) and analysed. expected_ranks:
    default 0..world_size-1 where the dumps say the world size. Raises DumpDirError as read_dump_dir
    does; per-file problems are in the DumpSet's errors. A dump whose seq ids contradict its group's
    (seq_consistency.py) gets one error line too, and its rank, like a refused dump's, is analysed
    as unknown (`unreadable`), never as evidence."""
    stream = PassOneStream()
    try:
        dumps = read_dump_dir(
            directory,
            columns=COLUMNS,
            dictionary=True,
            max_frames=0,
            processes=processes,
            limits=limits,
            on_chunk=stream,
        )
        if expected_ranks is None and dumps.world_size:
            expected_ranks = range(dumps.world_size)
        dumps, table, unreadable = _contradictions_out(dumps)
        report = analyze_collectives(
            table, expected_ranks=expected_ranks, stacks=stacks,
            first_pass=stream if table is dumps.table else None, unreadable=unreadable,
        )
    finally:
        stream.close()
    return dumps, report


def _contradictions_out(dumps: DumpSet) -> tuple[DumpSet, pa.Table, set[int]]:
    """The set with one error line per dump whose seq ids contradict its group's, the table without
    those ranks' rows, and the ranks the analysis reads as unknown: those and the refused dumps'."""
    unreadable = {r for r in (rank_from_name(e.path) for e in dumps.errors) if r is not None}
    found = find_contradictions(dumps.table)
    if not found:
        return dumps, dumps.table, unreadable - set(dumps.ranks)
    files = {rank_from_name(f): f for f in dumps.files}
    errors = tuple(DumpFileError(files.get(c.rank, f"rank {c.rank}"), c.problem())
                   for c in found)
    bad = {c.rank for c in found}
    table = without_ranks(dumps.table, bad)
    unreadable = (unreadable - set(dumps.ranks)) | bad
    return dataclasses.replace(dumps, errors=dumps.errors + errors), table, unreadable
