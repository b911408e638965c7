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
    )
