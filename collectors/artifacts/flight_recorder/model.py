"""The reader's model: the table it fills, its errors, what a set gives back (DumpSet) and one dump
as columns (Dump), which both parsers (objects.py, fastpath.py) produce and the assembly
(assembly.py) consumes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.store.schema import TABLES
from faultlens.errors import FaultlensError

TABLE = "collectives"
SCHEMA = TABLES[TABLE]
DEFAULT_MAX_FRAMES = 16
# rows per Arrow chunk while reading: bounds the chunk buffers being filled (~80 bytes a row, their
# int32 codes narrowed when built) and what pass 1 decodes at once (1 << 20 held ~120 MB more at
# the peak of a 1,024-rank read, for no CPU saved)
CHUNK_ROWS = 1 << 18
PICKLE_SUFFIXES = (".pkl", ".pickle")
JSON_SUFFIXES = (".json",)
INT_COLUMNS = {
    "record_id": "record_id",
    "collective_seq_id": "collective_seq_id",
    "p2p_seq_id": "p2p_seq_id",
    "op_id": "op_id",
    "timeout_ms": "timeout_ms",
}
TIME_COLUMNS = {
    "time_created": "time_created_ns",
    "time_started": "time_discovered_started_ns",
    "time_completed": "time_discovered_completed_ns",
}
STRING_FIELDS = ("op", "state", "pg_name", "pg_desc")


class DumpFileError(ValueError, FaultlensError):
    """One dump file cannot be read: the message names the file and the problem."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class DumpDirError(ValueError, FaultlensError):
    """A dump directory as a whole cannot be read (missing, not a directory, no dumps in it)."""


class DumpFormatError(ValueError, FaultlensError):
    """What is wrong with a dump's content, raised by the parsers and the checks (values.py); the
    file loader (files.py) turns it into a DumpFileError naming the file."""


class FastPathDeclined(FaultlensError):
    """The fast path leaves this dump to the reference path (which loads it or says why not)."""


@dataclass(frozen=True)
class DumpSet:
    """What read_dump_dir found: the rows, the ranks read, the files used and the per-file errors.
    """

    table: pa.Table
    ranks: tuple[int, ...]
    files: tuple[str, ...]
    errors: tuple[DumpFileError, ...]
    world_size: int | None = None
    skipped: tuple[str, ...] = ()  # files not used (a JSON twin of a pickle, a duplicate rank)
    seconds: float = 0.0


# --------------------------------------------------------------------------------------------------
# per-dump columns, from either parser


@dataclass
class StrColumn:
    """A string field of every entry of one dump: codes into the dump's own values."""

    codes: np.ndarray  # int32, -1 = null
    values: list[str]


@dataclass
class ListColumn:
    """A list field of every entry of one dump (dtypes, frames): a count per entry and the items."""

    counts: np.ndarray  # int64 per entry, -1 = null
    items: np.ndarray  # int64 per item (ints) or int32 codes into `values` (strings)
    values: list[str] | None = None


@dataclass
class SizesColumn:
    """A list-of-shapes field of every entry of one dump (input_sizes, output_sizes)."""

    counts: np.ndarray  # tensors per entry, -1 = null
    ndims: np.ndarray  # dims per tensor
    dims: np.ndarray  # all dims


@dataclass
class Dump:
    """One dump file as columns: what either parser gives and the assembly writes into a chunk."""

    path: Path
    fmt: str
    rank: int
    n: int
    version: str | None
    world_size: int | None
    node: str | None
    comm_lib_version: str | None
    pg_config: Mapping[str, Any]
    pg_status: Mapping[str, Any]
    ints: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (values int64, valid bool)
    pg_id: tuple[np.ndarray, np.ndarray]
    is_p2p: np.ndarray  # int8, -1 null
    retired: np.ndarray
    strings: dict[str, StrColumn]
    sizes: dict[str, SizesColumn]
    dtypes: dict[str, ListColumn]
    frames: ListColumn | None
    mtime_ns: int = 0
    # pg_id's distinct values, the first entry of each and each entry's index into them, when the
    # parser has them
    pg_groups: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
