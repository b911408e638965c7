"""Is a listed segment one the store reader can use? Its Parquet footer must read, and its columns
must be columns of its table with types the table's schema can take (union by name). A segment that
fails is skipped by readers (one warning naming it), counted in `faultlens tables`, listed and
quarantined by `faultlens doctor`.

Only the footer is read (a few KB per segment), once per segment and reader: segments are immutable
once visible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from faultlens.collectors.store.layout import StoreLocation
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.schema import (
    METADATA_TABLE_KEY,
    METADATA_VERSION_KEY,
    as_ns_type,
    schema_for,
)

if TYPE_CHECKING:
    import pyarrow.parquet as pq

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BadSegment:
    table: str
    path: str
    reason: str


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Types a union by name with the table's own schema reads without changing the column's type's
    kind.
    """
    if actual.equals(expected) or pa.types.is_null(actual):
        return True
    if pa.types.is_integer(actual) and (
        pa.types.is_integer(expected) or pa.types.is_floating(expected)
    ):
        return True
    if pa.types.is_floating(actual) and pa.types.is_floating(expected):
        return True
    if pa.types.is_timestamp(actual) and pa.types.is_timestamp(expected):
        return actual.tz is not None and expected.tz is not None
    # evidence: a version-1 segment's ns inside
    if pa.types.is_struct(actual) and pa.types.is_struct(expected):
        return as_ns_type(actual).equals(as_ns_type(expected))
    if pa.types.is_dictionary(actual):
        return _compatible(actual.value_type, expected)
    if (pa.types.is_large_string(actual) or pa.types.is_string_view(actual)) and pa.types.is_string(
        expected
    ):
        return True
    if pa.types.is_large_list(actual) and pa.types.is_list(expected):
        return _compatible(actual.value_type, expected.value_type)
    if pa.types.is_list(actual) and pa.types.is_list(expected):
        return _compatible(actual.value_type, expected.value_type)
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def check_segment(location: StoreLocation, table: str, path: str) -> str | None:
    """None when `path` is a usable segment of `table`, else why not (one line)."""
    return inspect_segment(location, table, path).reason


@dataclass(frozen=True)
class SegmentInfo:
    reason: str | None  # None: usable
    # a timestamp column of a unit other than the schema's (version 1: nanoseconds)
    legacy_units: bool = False
    # a usable segment's columns (its Arrow schema without metadata): segments of one table that
    # all have the same are read together without a union by name
    columns: pa.Schema | None = None


def _legacy_units(schema: pa.Schema, expected: pa.Schema) -> bool:
    for field in schema:
        index = expected.get_field_index(field.name)
        if index < 0:
            continue
        want = expected.field(index).type
        if not as_ns_type(want).equals(want) and not field.type.equals(want):
            return True
    return False


def inspect_segment(location: StoreLocation, table: str, path: str) -> SegmentInfo:
    """check_segment's answer, and whether the segment's timestamps need converting to the schema's
    unit.
    """
    reason = _check(location, table, path)
    if isinstance(reason, pa.Schema):
        columns = reason.remove_metadata()
        return SegmentInfo(None, _columns_verdict(table, columns)[2], columns)
    return SegmentInfo(reason)


# (table, a segment's columns) -> (why unusable, columns not in the table, legacy units): every
# segment a writer of one version writes has the same columns, so a listing of thousands checks
# their types once
_VERDICTS: dict[tuple[str, pa.Schema], tuple[str | None, tuple[str, ...], bool]] = {}


def _columns_verdict(table: str, columns: pa.Schema) -> tuple[str | None, tuple[str, ...], bool]:
    key = (table, columns)
    found = _VERDICTS.get(key)
    if found is not None:
        return found
    expected = schema_for(table)
    extra = []
    verdict: tuple[str | None, tuple[str, ...], bool] | None = None
    for field in columns:
        index = expected.get_field_index(field.name)
        if index < 0:
            extra.append(field.name)  # a newer writer's column: read by name, the rest unchanged
            continue
        want = expected.field(index).type
        if not _compatible(field.type, want):
            verdict = (f"column {field.name!r} is {field.type}, expected {want}", (), False)
            break
    if verdict is None:
        verdict = (None, tuple(extra), _legacy_units(columns, expected))
    if len(_VERDICTS) >= 1024:
        _VERDICTS.clear()
    _VERDICTS[key] = verdict
    return verdict


def _check(location: StoreLocation, table: str, path: str) -> str | pa.Schema | None:
    """Why `path` is not a usable segment of `table`, or its Arrow schema (None: gone since the
    listing).
    """
    import pyarrow.parquet as pq  # (here: a reader of an empty store never needs it)

    try:
        size = location.fs.size(path)
    except FileNotFoundError:
        # gone since the listing (compaction, retention): not bad, the reader lists again
        return None
    except Exception as exc:
        return f"cannot stat: {_first_line(exc)}"
    if not size:
        return "empty file (0 bytes)"
    try:
        with open_segment(location, path) as handle:
            parquet = pq.ParquetFile(handle)
            schema, footer = parquet.schema_arrow, parquet.metadata
    except FileNotFoundError:
        return None
    # ArrowInvalid (truncated, not Parquet), OSError, anything a broken footer raises
    except Exception as exc:
        return f"not a readable Parquet file ({size} bytes): {_first_line(exc)}"
    owner = (schema.metadata or {}).get(METADATA_TABLE_KEY)
    if owner is not None and owner.decode("utf-8", "replace") != table:
        return f"a segment of table {owner.decode('utf-8', 'replace')!r}, not {table!r}"
    names = schema.names
    if "ts" not in names:
        return f"no ts column (columns: {', '.join(names[:6])}{', ...' if len(names) > 6 else ''})"
    bad, extra, _ = _columns_verdict(table, schema.remove_metadata())
    if bad is not None:
        return bad
    reason = _ts_out_of_range(schema, footer)
    if reason is not None:
        return reason
    version = (schema.metadata or {}).get(METADATA_VERSION_KEY)
    if version is not None and version not in KNOWN_VERSIONS:
        _note(
            path,
            f"schema_version {version.decode('utf-8', 'replace')[:20]!r} is not one this "
            f"reader knows ({', '.join(v.decode() for v in KNOWN_VERSIONS)}): read by column "
            "name",
        )
    if extra:
        _note(path, f"column(s) {', '.join(extra[:6])} not in the {table} schema: ignored")
    return schema


#: what schema_version values this reader knows (1: nanoseconds, 2: microseconds)
KNOWN_VERSIONS = (b"1", b"2")
# a datetime holds years 1..9999: in microseconds since the epoch
_TS_MIN_US, _TS_MAX_US = -62135596800_000_000, 253402300799_999_999
_UNIT_PER_US = {"s": 1e-6, "ms": 1e-3, "us": 1, "ns": 1000}
_NOTED: set[tuple[str, str]] = set()


def _note(path: str, text: str) -> None:
    """One warning per segment and text (per process): the segment is read."""
    if (path, text) not in _NOTED:
        if len(_NOTED) > 10_000:
            _NOTED.clear()
        _NOTED.add((path, text))
        log.warning("segment %s: %s", path, text)


def _ts_out_of_range(schema: pa.Schema, footer: pq.FileMetaData) -> str | None:
    """From the footer's statistics (no data read): a ts no datetime can hold (after year 9999)."""
    kind = schema.field("ts").type
    if not pa.types.is_timestamp(kind):
        return None
    per_us = _UNIT_PER_US.get(kind.unit, 1)
    column = schema.get_field_index("ts")
    for group in range(footer.num_row_groups):
        try:
            stats = footer.row_group(group).column(column).statistics
        except (IndexError, ValueError):
            return None
        if stats is None or not stats.has_min_max:
            continue
        low, high = stats.min_raw, stats.max_raw
        if not isinstance(low, int) or not isinstance(high, int):
            continue
        if low < _TS_MIN_US * per_us or high > _TS_MAX_US * per_us:
            return f"ts out of range (raw {low}..{high} {kind.unit}; a datetime ends at year 9999)"
    return None


def deep_check(location: StoreLocation, table: str, path: str) -> str | None:
    """check_segment, then read every row (finds corrupt data pages behind an intact footer)."""
    reason = check_segment(location, table, path)
    if reason is not None:
        return reason
    import pyarrow.parquet as pq

    try:
        with open_segment(location, path) as handle:
            pq.read_table(handle)
    except FileNotFoundError:
        return None
    except Exception as exc:
        return f"unreadable data: {_first_line(exc)}"
    return None
