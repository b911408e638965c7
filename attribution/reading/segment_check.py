"""Is a listed segment one the store reader can use? Its Parquet footer must read, and its columns
must be columns of its table with types the table's schema can take (union by name). A segment that
fails is skipped by readers (one warning naming it), counted in `faultlens tables`, listed and
quarantined by `faultlens doctor`.

Only the footer is read (a few KB per segment), once per segment and reader: segments are immutable
once visible.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from faultlens.collectors.store.layout import StoreLocation
from faultlens.collectors.store.native_read import open_segment
from faultlens.collectors.store.schema import METADATA_TABLE_KEY, as_ns_type, schema_for


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
        return SegmentInfo(None, _legacy_units(reason, schema_for(table)))
    return SegmentInfo(reason)


def _check(location: StoreLocation, table: str, path: str) -> str | pa.Schema | None:
    """Why `path` is not a usable segment of `table`, or its Arrow schema (None: gone since the
    listing).
    """
    expected = schema_for(table)
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
            schema = pq.ParquetFile(handle).schema_arrow
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
    for field in schema:
        index = expected.get_field_index(field.name)
        if index < 0:
            return f"column {field.name!r} is not in the {table} schema"
        want = expected.field(index).type
        if not _compatible(field.type, want):
            return f"column {field.name!r} is {field.type}, expected {want}"
    return schema


def deep_check(location: StoreLocation, table: str, path: str) -> str | None:
    """check_segment, then read every row (finds corrupt data pages behind an intact footer)."""
    reason = check_segment(location, table, path)
    if reason is not None:
        return reason
    try:
        with open_segment(location, path) as handle:
            pq.read_table(handle)
    except FileNotFoundError:
        return None
    except Exception as exc:
        return f"unreadable data: {_first_line(exc)}"
    return None
