"""A directory of flight-recorder dumps read and analysed for a hang, the analysis' first pass
running on the rows as they are read (attribution/detectors/hang/stream.py): what `faultlens
analyze-hang` does, one call."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from faultlens.attribution.detectors.hang import (
    COLUMNS,
    HangReport,
    PassOneStream,
    analyze_collectives,
)
from faultlens.collectors.artifacts.flight_recorder import DumpSet, read_dump_dir
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
    does; per-file problems are in the DumpSet's errors."""
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
        report = analyze_collectives(
            dumps.table, expected_ranks=expected_ranks, stacks=stacks, first_pass=stream
        )
    finally:
        stream.close()
    return dumps, report
