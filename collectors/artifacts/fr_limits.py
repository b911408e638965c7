"""Resource limits on one flight-recorder dump: what a real dump can hold, and no more.

A dump is read from a directory anybody on the node can write to, so every reader bounds what a file
can make it allocate or compute. A dump beyond any limit is refused with a one-line error naming the
file and the limit (it is then a missing dump in the set, which is itself evidence); every other
dump of the set is still read. The defaults are far above what torch writes (a 2,000-entry NCCL dump
with stack frames is ~0.5 MB; the largest training jobs have ~10^5 ranks) and far below what hurts
the reader. Override them per call (``read_dump_dir(limits=...)``) or per process with the
environment variables named below (``FAULTLENS_FR_MAX_WORLD_SIZE=2000000``).

- ``max_file_bytes`` (FAULTLENS_FR_MAX_FILE_BYTES, 256 MiB): a bigger file is not read at all.
- ``max_world_size`` (FAULTLENS_FR_MAX_WORLD_SIZE, 2^18 = 262,144): a dump's ``world_size`` and
  ``rank``, the rank in its file name and every rank in ``pg_config`` must be below it (analysis
  allocates per rank of the world).
- ``max_string_bytes`` (FAULTLENS_FR_MAX_STRING_BYTES, 4 MiB): one string or bytes value.
- ``max_int_bytes`` (16): one pickled integer (LONG1/LONG4: 128 bits; text INT/LONG: 40 digits);
  integer fields that are read (ids, sizes, times, ranks) must fit 64 bits, and an integer written
  as a string at most 20 digits.
- memo: a memo index must be below the file's size (a real pickler numbers its memo 0, 1, 2, ... and
  each entry costs at least two bytes), so the memo never outgrows the file.
- ``elements_per_byte`` / ``min_elements`` / ``max_elements`` (1.0 / 4,096 / 2^26): what one dump
  expands to (entries + tensor shapes + dims + dtypes + stack frames kept). Plain data costs at
  least a byte per element, so only shared references ("billion laughs": one memoized list
  referenced by every entry) can go beyond.
- ``bytes_per_entry`` / ``min_entries`` (16 / 256): entries may not be cheaper than this (a real
  entry is ~100-2,000 bytes; a shared entry repeated by DUP costs one).
- ``alloc_per_byte`` / ``min_alloc_bytes`` / ``max_alloc_bytes`` (64 / 64 MiB / 384 MiB,
  FAULTLENS_FR_MAX_ALLOC_BYTES): what loading one dump as Python objects may build, estimated
  before the load (every container, string and bytes object at its size; a real dump builds 5-10
  bytes a byte, a file of one-byte EMPTY_SET opcodes 216). Applies to the restricted unpickler's
  pickles and to JSON dumps.
- ``max_set_bytes`` / ``set_bytes_per_dump`` (1 GiB / 8 MiB, FAULTLENS_FR_MAX_SET_BYTES): the
  dump bytes one set reads, at least ``max_set_bytes`` and ``set_bytes_per_dump`` per file named
  as a dump (a real dump is ~0.5 MB; 16,384 of them are 8.4 GB). Files are admitted smallest first
  (good dumps are small), read in their order; the ones beyond the budget are refused unread. The
  parse-ahead window holds at most ``max_ahead_bytes`` (256 MiB) of files beyond the one parsed.
- ``max_scan_bytes`` (8 MiB): the largest file the compiled scanner parses (its scratch arrays
  take ~150 bytes of address space a byte of file, 16 of them written at once, and a thread keeps
  them for its next file); a larger one goes to the restricted unpickler under the allocation
  budget.
- ``max_id`` (2^53 - 1): record_id, pg_id, collective_seq_id, p2p_seq_id and op_id must be
  non-negative integers up to this (not a bool, a string or a float: a seq id the analysis
  compares must be what torch writes); record_id and collective_seq_id present on every entry.
- ``max_dim`` (2^48): a tensor dimension in input_sizes / output_sizes (0..2^48).
- ``max_depth`` (64): nesting of the values that are decoded (top-level fields; FR dumps nest ~5
  deep). JSON dumps nested deeper than the interpreter can parse are refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from faultlens import environment
from faultlens.errors import FaultlensError


def _env_int(variable: environment.EnvVar, default: int) -> int:
    parsed = variable.get_int(default=default)
    return parsed if parsed is not None and parsed > 0 else default


class DumpLimitError(ValueError, FaultlensError):
    """A dump breaks one of the limits: the message says which (the reader adds the file name)."""


@dataclass(frozen=True)
class DumpLimits:
    max_file_bytes: int = 256 * 1024 * 1024
    max_world_size: int = 1 << 18
    max_string_bytes: int = 4 * 1024 * 1024
    max_int_bytes: int = 16
    max_int_digits: int = 40
    max_field_digits: int = 20
    elements_per_byte: float = 1.0
    min_elements: int = 4096
    max_elements: int = 1 << 26
    bytes_per_entry: int = 16
    min_entries: int = 256
    max_depth: int = 64
    alloc_per_byte: float = 64.0
    min_alloc_bytes: int = 64 * 1024 * 1024
    max_alloc_bytes: int = 384 * 1024 * 1024
    max_set_bytes: int = 1 << 30
    set_bytes_per_dump: int = 8 * 1024 * 1024
    max_ahead_bytes: int = 256 * 1024 * 1024
    max_scan_bytes: int = 8 * 1024 * 1024
    max_id: int = 2**53 - 1
    max_dim: int = 1 << 48

    def alloc_budget(self, file_bytes: int) -> int:
        """Bytes of Python objects loading a dump of `file_bytes` may build."""
        return int(min(self.max_alloc_bytes,
                       max(self.min_alloc_bytes, self.alloc_per_byte * file_bytes)))

    def set_budget(self, files: int) -> int:
        """Dump bytes a set of `files` dump files may read."""
        return max(self.max_set_bytes, self.set_bytes_per_dump * files)

    def element_budget(self, file_bytes: int) -> int:
        """Elements (entries + shapes + dims + dtypes + frames) a dump of `file_bytes` may expand
        to.
        """
        return int(
            min(self.max_elements, max(self.min_elements, self.elements_per_byte * file_bytes))
        )

    def entry_budget(self, file_bytes: int) -> int:
        """Entries a dump of `file_bytes` may hold."""
        return int(max(self.min_entries, file_bytes // self.bytes_per_entry))

    def with_(self, **changes: int | float) -> DumpLimits:
        return replace(self, **changes)


def default_limits() -> DumpLimits:
    """The defaults, with the FAULTLENS_FR_* environment overrides applied (read at each call)."""
    base = DumpLimits()
    return replace(
        base,
        max_file_bytes=_env_int(environment.FR_MAX_FILE_BYTES, base.max_file_bytes),
        max_world_size=_env_int(environment.FR_MAX_WORLD_SIZE, base.max_world_size),
        max_string_bytes=_env_int(environment.FR_MAX_STRING_BYTES, base.max_string_bytes),
        max_elements=_env_int(environment.FR_MAX_ELEMENTS, base.max_elements),
        max_alloc_bytes=_env_int(environment.FR_MAX_ALLOC_BYTES, base.max_alloc_bytes),
        max_set_bytes=_env_int(environment.FR_MAX_SET_BYTES, base.max_set_bytes),
    )
