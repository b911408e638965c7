"""Set-wide string dictionaries (SetStrings) and the Arrow building blocks of the assembly: list
arrays from per-row counts, dictionary columns rewrapped with a set's final dictionary, a repeated
string column."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.memory import mapped_empty

# per column: dumps of one job share a handful; a hostile set cannot grow it without bound
_MAX_VOCABULARIES = 4096
_MAX_CACHED_VOCABULARY = 256  # longer vocabularies (frames) are remapped each time, not kept


def _numpy_dtype(type_: pa.DataType) -> np.dtype:
    if pa.types.is_timestamp(type_):
        return np.dtype(np.int64)
    if pa.types.is_floating(type_):
        return np.dtype(f"float{type_.bit_width}")
    if pa.types.is_integer(type_):
        kind = "int" if pa.types.is_signed_integer(type_) else "uint"
        return np.dtype(f"{kind}{type_.bit_width}")
    raise TypeError(f"no NumPy form for {type_}")


def numeric_array(values: np.ndarray, type_: pa.DataType, null: np.ndarray | None = None
                  ) -> pa.Array:
    """A 1-D NumPy array as an Arrow array of `type_` (boolean, integer, floating or timestamp),
    null where `null` is True, built on its buffers: `pa.array` imports pandas (0.15-0.6 s) on its
    first NumPy or list input, `Array.from_buffers` does not. Integers that do not fit `type_` are
    an ArrowInvalid, as pa.array's safe cast gives."""
    values = np.asarray(values)
    n = values.shape[0]
    validity, nulls = None, 0
    if null is not None:
        nulls = int(np.count_nonzero(null))
        if nulls:
            validity = pa.py_buffer(np.packbits(~np.asarray(null, bool), bitorder="little"))
    if pa.types.is_boolean(type_):
        data = pa.py_buffer(np.packbits(values.astype(bool, copy=False), bitorder="little"))
        return pa.Array.from_buffers(type_, n, [validity, data], null_count=nulls)
    dtype = _numpy_dtype(type_)
    if values.dtype != dtype:
        if n and dtype.kind in "iu" and values.dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = int(values.min()), int(values.max())
            if low < info.min or high > info.max:
                raise pa.ArrowInvalid(f"integer value out of range for {type_}")
        values = values.astype(dtype)
    data = pa.py_buffer(np.ascontiguousarray(values))
    return pa.Array.from_buffers(type_, n, [validity, data], null_count=nulls)


def string_array(values: Sequence[str]) -> pa.Array:
    """Python strings as an Arrow string array, on its buffers (no pandas; see numeric_array)."""
    try:
        encoded = [value.encode("utf-8") for value in values]
    except (UnicodeEncodeError, AttributeError):  # what pa.array says of them
        return pa.array(values, type=pa.string())
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        return pa.array(values, type=pa.string())
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets.astype(np.int32)), data]
    )


def index_type(size: int) -> pa.DataType:
    """The narrowest signed index type for a dictionary of `size` values (a set's groups, ops and
    states fit 8 or 16 bits: 2-3 bytes a row less per column than int32)."""
    if size <= 127:
        return pa.int8()
    return pa.int16() if size <= 32767 else pa.int32()


def coded_array(codes: np.ndarray, dictionary: pa.Array) -> pa.DictionaryArray:
    """int32 codes (-1: null) over `dictionary`, the indices unchecked (no pandas; see
    numeric_array), as narrow as the dictionary's size allows (index_type)."""
    codes = np.ascontiguousarray(codes, np.int32)
    indices = numeric_array(codes, index_type(len(dictionary)), codes < 0)
    return pa.DictionaryArray.from_arrays(indices, dictionary, safe=False)


def _width(type_: pa.DataType) -> int:
    if pa.types.is_dictionary(type_):
        return type_.index_type.bit_width
    if pa.types.is_list(type_):
        return _width(type_.value_type)
    return type_.bit_width if pa.types.is_integer(type_) else 0


def same_type(pieces: list[pa.Array]) -> list[pa.Array]:
    """A column's chunks in one type: a chunk built while a dictionary was shorter may have
    narrower indices (index_type) than a later one, and a chunk's integers may have fit int32 where
    another's did not (chunks.NARROW_INTS); each is cast to the widest."""
    types = {p.type for p in pieces}
    if len(types) <= 1:
        return pieces
    widest = max(types, key=_width)
    return [p if p.type == widest else p.cast(widest) for p in pieces]


class SetStrings:
    """One set-wide dictionary for a string column."""

    def __init__(self) -> None:
        self.lookup: dict[str, int] = {}
        self.values: list[str] = []
        # a dump's vocabulary -> its codes (remap)
        self.tables: dict[tuple[str, ...], np.ndarray] = {}
        self._dictionary: pa.Array | None = None  # the values as an Arrow array (dictionary())

    def code(self, value: str | None) -> int:
        """The set-wide code of one value (-1: none)."""
        if value is None:
            return -1
        code = self.lookup.get(value)
        if code is None:
            code = self.lookup[value] = len(self.values)
            self.values.append(value)
        return code

    def table(self, column_values: Sequence[str]) -> np.ndarray:
        """The set-wide code of each of a dump's local values, plus -1 last (where a null's code -1
        lands); a code, once given, never changes, so the table of one vocabulary is good for every
        later dump that has it."""
        key = tuple(column_values)
        table = self.tables.get(key)
        if table is None:
            table = np.empty(len(key) + 1, np.int32)
            for i, value in enumerate(key):
                code = self.lookup.get(value)
                if code is None:
                    code = self.lookup[value] = len(self.values)
                    self.values.append(value)
                table[i] = code
            table[-1] = -1
            if len(key) <= _MAX_CACHED_VOCABULARY and len(self.tables) < _MAX_VOCABULARIES:
                self.tables[key] = table
        return table

    def remap(self, column_values: Sequence[str], codes: np.ndarray) -> np.ndarray:
        """A dump's local codes (-1 = null) as codes of this set-wide dictionary."""
        if not column_values:
            return codes.astype(np.int32, copy=False)
        table = self.table(column_values)
        # never from the parsers; kept null rather than wrapped
        if codes.shape[0] and int(codes.min()) < -1:
            codes = np.where(codes < 0, -1, codes)
        return table[codes]

    def dictionary(self) -> pa.Array:
        """The values so far as an Arrow array (kept until a value is added: values only grow)."""
        if self._dictionary is None or len(self._dictionary) != len(self.values):
            self._dictionary = string_array(self.values)
        return self._dictionary

    def array(self, codes: np.ndarray, dictionary: bool) -> pa.Array:
        """int32 codes (-1: null; all below len(values), as remap gives them) as a dictionary array
        over the values so far (the indices unchecked and uncopied), or as plain strings."""
        arr = coded_array(codes, self.dictionary())
        return arr if dictionary else arr.cast(pa.string())


def with_dictionary(array: pa.Array, strings: SetStrings | None, dictionary: bool) -> pa.Array:
    """A chunk's dictionary column (or list of dictionary) with the set's final dictionary, or cast
    to plain strings. Dictionaries only grow by appending, so a chunk's indices are valid in the
    final one."""
    if strings is None:
        return array
    final = strings.dictionary()
    # (indices unchecked: they came from the same dictionary when it was shorter)
    if pa.types.is_dictionary(array.type):
        out = pa.DictionaryArray.from_arrays(array.indices, final, safe=False)
        return out if dictionary else out.cast(pa.string())
    if pa.types.is_list(array.type) and pa.types.is_dictionary(array.type.value_type):
        values = pa.DictionaryArray.from_arrays(array.values.indices, final, safe=False)
        if not dictionary:
            values = values.cast(pa.string())
        return pa.ListArray.from_arrays(array.offsets, values,
                                        mask=array.is_null() if array.null_count else None)
    return array


def remapped_to_set(array: pa.Array, strings: SetStrings | None) -> pa.Array:
    """A part's dictionary column (or list of dictionary) in codes of the merged, set-wide
    dictionary.
    """
    if strings is not None and pa.types.is_dictionary(array.type):
        codes = strings.remap(
            array.dictionary.to_pylist(), array.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        )
        return strings.array(codes, True)
    if (
        strings is not None
        and pa.types.is_list(array.type)
        and pa.types.is_dictionary(array.type.value_type)
    ):
        values = array.values
        codes = strings.remap(values.dictionary.to_pylist(),
                              values.indices.fill_null(-1).to_numpy(zero_copy_only=False))
        return pa.ListArray.from_arrays(array.offsets, strings.array(codes, True),
                                        mask=array.is_null() if array.null_count else None)
    return array


def list_from_counts(counts: np.ndarray, values: pa.Array) -> pa.Array:
    """A list column from each row's item count (-1: null) and all rows' items in order."""
    offsets = mapped_empty(counts.shape[0] + 1, np.int32)
    positive = mapped_empty(counts.shape[0], np.int32)
    np.maximum(counts, 0, out=positive)
    np.cumsum(positive, out=offsets[1:])
    null = np.less(counts, 0, out=mapped_empty(counts.shape[0], bool))
    return pa.ListArray.from_arrays(numeric_array(offsets, pa.int32()), values,
                                    mask=numeric_array(null, pa.bool_()) if null.any() else None)


def sparse_lists(total: int, rows: list[int], values: list[tuple[int, ...]]) -> pa.Array:
    """A list<int32> column of `total` rows, null but at `rows` (ascending, distinct), which hold
    `values`: what list_from_counts gives for counts of -1 but there, built in two passes over the
    column (its offsets) and none over a mask, as pg_ranks is set on a few thousand of millions of
    rows."""
    at = np.array(rows, np.int64)
    offsets = mapped_empty(total + 1, np.int32)
    offsets[at + 1] = [len(v) for v in values]
    np.cumsum(offsets, out=offsets)
    items = np.fromiter((r for v in values for r in v), np.int32, count=sum(len(v) for v in values))
    nulls = total - len(rows)
    validity = None
    if nulls:
        bits = mapped_empty((total + 7) // 8, np.uint8)
        np.bitwise_or.at(bits, at >> 3, np.left_shift(1, at & 7).astype(np.uint8))
        validity = pa.py_buffer(bits)
    return pa.Array.from_buffers(
        pa.list_(pa.int32()),
        total,
        [validity, pa.py_buffer(offsets)],
        null_count=nulls,
        children=[numeric_array(items, pa.int32())],
    )


def repeat_strings(runs: list[tuple[int, str | None]], total: int, dictionary: bool) -> pa.Array:
    """A string column of `total` rows given as runs of (count, value), dictionary-encoded or
    plain."""
    values: list[str] = []
    lookup: dict[str, int] = {}
    codes = mapped_empty(total, np.int32)
    pos = 0
    for count, value in runs:
        if value is None:
            code = -1
        else:
            code = lookup.setdefault(value, len(values))
            if code == len(values):
                values.append(value)
        codes[pos:pos + count] = code
        pos += count
    arr = coded_array(codes, string_array(values))
    return arr if dictionary else arr.cast(pa.string())
