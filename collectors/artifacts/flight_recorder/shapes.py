"""Set-wide dictionaries of input_sizes and input_dtypes values, for reads that keep columns
dictionary-encoded.

An entry's input_sizes is a list of tensor shapes ([[2048, 1, 5120]]); a job has a few hundred
distinct ones at most, repeated on millions of entries. As list<list<int64>> a row costs ~23 bytes
(its offsets, its shapes' offsets, its dims) and its signature in the hang analysis is hashed row by
row; as a dictionary code it costs 4 bytes, and the analysis hashes each distinct value once. The
values are stored once, as the rows of a list<list<int64>> array (dictionary()); codes are given in
the order values are first seen and never change, so a chunk built while the dictionary was shorter
stays valid under the final one (as for SetStrings).

Entries' values come as the scanner and the unpickler give them (SizesColumn: tensors per entry, -1
null; dims per tensor; all dims). The compiled form (numba, no GIL) serves the sets the fast path
reads; the Python form (no compile) the small sets the restricted unpickler reads. Both give the
same codes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.arrow import (
    SetStrings,
    coded_array,
    numeric_array,
    string_array,
)
from faultlens.compiled import kernel, use_compiled

_EMPTY = -1


@kernel(cache=True, nogil=True)
def _mix(h: np.uint64, v: int) -> np.uint64:
    h ^= np.uint64(v) + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(31)
    return h


@kernel(cache=True, nogil=True)
def _codes(counts, ndims, dims, out, slots, code_hash, code_tensor, tensor_dim, stored_dims, state):
    """out[i] = the code of entry i's value (-1 where null: a negative count), new values added. An
    entry's value is its shapes: ndims[t:t + count] dims each, from dims[d:] end to end (indices,
    never array views: a view per entry costs its reference counting). state: (codes, tensors, dims)
    stored so far; the caller made room for every entry's value being new. Returns False, having
    read nothing, where the dims do not add up."""
    tensors_in = 0
    for i in range(counts.shape[0]):
        if counts[i] > 0:
            tensors_in += counts[i]
    if tensors_in != ndims.shape[0]:
        return False
    dims_in = 0
    for k in range(ndims.shape[0]):
        if ndims[k] < 0:
            return False
        dims_in += ndims[k]
    if dims_in != dims.shape[0]:
        return False
    mask = slots.shape[0] - 1
    t = 0
    d = 0
    for i in range(counts.shape[0]):
        count = counts[i]
        if count < 0:
            out[i] = -1
            continue
        h = _mix(np.uint64(0x243F6A8885A308D3), count)
        n_dims = 0
        for k in range(t, t + count):
            h = _mix(h, ndims[k] + 1000003)
            n_dims += ndims[k]
        for j in range(d, d + n_dims):
            h = _mix(h, dims[j])
        slot = np.int64(h & np.uint64(mask))
        found = -1
        while True:
            code = slots[slot]
            if code == _EMPTY:
                break
            if code_hash[code] == h and code_tensor[code + 1] - code_tensor[code] == count:
                same = True
                t0 = code_tensor[code]
                base = tensor_dim[t0]
                if tensor_dim[t0 + count] - base != n_dims:
                    same = False
                else:
                    for k in range(count):
                        if tensor_dim[t0 + k + 1] - tensor_dim[t0 + k] != ndims[t + k]:
                            same = False
                            break
                    if same:
                        for j in range(n_dims):
                            if stored_dims[base + j] != dims[d + j]:
                                same = False
                                break
                if same:
                    found = code
                    break
            slot = (slot + 1) & mask
        if found < 0:
            found = state[0]
            tensors = state[1]
            stored = state[2]
            slots[slot] = found
            code_hash[found] = h
            for k in range(count):
                tensor_dim[tensors + k + 1] = tensor_dim[tensors + k] + ndims[t + k]
            for j in range(n_dims):
                stored_dims[stored + j] = dims[d + j]
            code_tensor[found + 1] = tensors + count
            state[0] = found + 1
            state[1] = tensors + count
            state[2] = stored + n_dims
        out[i] = found
        t += count
        d += n_dims
    return True


@kernel(cache=True, nogil=True)
def _rehash(slots, code_hash, codes):
    mask = slots.shape[0] - 1
    for code in range(codes):
        slot = np.int64(code_hash[code] & np.uint64(mask))
        while slots[slot] != _EMPTY:
            slot = (slot + 1) & mask
        slots[slot] = code


def _coded(codes: np.ndarray, dictionary: pa.Array) -> pa.DictionaryArray:
    """int32 codes (-1: null) over `dictionary`, the indices unchecked and uncopied (they came from
    it).
    """
    return coded_array(codes, dictionary)


def _grown(array: np.ndarray, need: int) -> np.ndarray:
    if need <= array.shape[0]:
        return array
    out = np.empty(max(need, 2 * array.shape[0]), array.dtype)
    out[:array.shape[0]] = array
    return out


class SetShapes:
    """The set-wide dictionary of input_sizes values."""

    def __init__(self) -> None:
        self.state = np.zeros(3, np.int64)  # codes, tensors, dims stored
        self.slots = np.full(64, _EMPTY, np.int64)
        self.code_hash = np.empty(32, np.uint64)
        # code -> its tensors [code_tensor[c], code_tensor[c + 1])
        self.code_tensor = np.zeros(33, np.int64)
        # tensor -> its dims [tensor_dim[t], tensor_dim[t + 1])
        self.tensor_dim = np.zeros(33, np.int64)
        self.dims = np.empty(32, np.int64)
        # the Python form's index of the same codes
        self.lookup: dict[tuple[tuple[int, ...], ...], int] = {}
        self._dictionary: pa.Array | None = None

    def __len__(self) -> int:
        return int(self.state[0])

    def _room(self, values: int, tensors: int, dims: int) -> None:
        codes, stored_tensors, stored_dims = self.state.tolist()
        self.code_hash = _grown(self.code_hash, codes + values)
        self.code_tensor = _grown(self.code_tensor, codes + values + 1)
        self.tensor_dim = _grown(self.tensor_dim, stored_tensors + tensors + 1)
        self.dims = _grown(self.dims, stored_dims + dims)
        if 2 * (codes + values) > self.slots.shape[0]:
            size = self.slots.shape[0]
            while 2 * (codes + values) > size:
                size *= 2
            self.slots = np.full(size, _EMPTY, np.int64)
            _rehash(self.slots, self.code_hash, codes)

    def codes(
        self, counts: np.ndarray, ndims: np.ndarray, dims: np.ndarray, compiled: bool
    ) -> np.ndarray:
        """int32 codes of the entries' values (-1: null)."""
        counts = np.ascontiguousarray(counts, np.int64)
        ndims = np.ascontiguousarray(ndims, np.int64)
        dims = np.ascontiguousarray(dims, np.int64)
        out = np.empty(counts.shape[0], np.int32)
        if not compiled:
            if (
                int(counts[counts > 0].sum()) != ndims.shape[0]
                or int(ndims.sum()) != dims.shape[0]
                or (ndims.shape[0] and int(ndims.min()) < 0)
            ):
                raise ValueError("input_sizes: the tensors' dims do not add up")
            return self._codes_python(counts, ndims, dims, out)
        use_compiled()  # numba loaded here, for the sets the fast path reads
        self._room(counts.shape[0], ndims.shape[0], dims.shape[0])
        # (the kernel checks that the dims add up before it reads them: it indexes without bounds
        # checks)
        if not _codes(
            counts,
            ndims,
            dims,
            out,
            self.slots,
            self.code_hash,
            self.code_tensor,
            self.tensor_dim,
            self.dims,
            self.state,
        ):
            raise ValueError("input_sizes: the tensors' dims do not add up")
        return out

    def _codes_python(
        self, counts: np.ndarray, ndims: np.ndarray, dims: np.ndarray, out: np.ndarray
    ) -> np.ndarray:
        """The same codes without numba: a dict keyed by the value, whose new values go into the
        same arrays.
        """
        if len(self.lookup) != len(self):  # values the compiled form added: indexed once
            self.lookup = {value: code for code, value in enumerate(self.values())}
        t = d = 0
        dims_list = dims.tolist()
        ndims_list = ndims.tolist()
        for i, count in enumerate(counts.tolist()):
            if count < 0:
                out[i] = -1
                continue
            shapes = []
            for n in ndims_list[t:t + count]:
                shapes.append(tuple(dims_list[d:d + n]))
                d += n
            t += count
            key = tuple(shapes)
            code = self.lookup.get(key)
            if code is None:
                self._room(1, count, sum(len(s) for s in shapes))
                flat = np.array([v for s in shapes for v in s], np.int64)
                code = _insert_python(self, np.array([len(s) for s in shapes], np.int64), flat)
                self.lookup[key] = code
            out[i] = code
        return out

    def values(self) -> list[tuple[tuple[int, ...], ...]]:
        codes, tensors, _ = (int(v) for v in self.state)
        bounds = self.tensor_dim[:tensors + 1].tolist()
        dims = self.dims.tolist()
        shape_of = [tuple(dims[bounds[t]:bounds[t + 1]]) for t in range(tensors)]
        per_code = self.code_tensor[:codes + 1].tolist()
        return [tuple(shape_of[per_code[c]:per_code[c + 1]]) for c in range(codes)]

    def dictionary(self) -> pa.Array:
        """The values so far as a list<list<int64>> array (kept until a value is added)."""
        codes, tensors, stored = (int(v) for v in self.state)
        if self._dictionary is None or len(self._dictionary) != codes:
            inner = pa.ListArray.from_arrays(
                numeric_array(self.tensor_dim[: tensors + 1], pa.int32()),
                numeric_array(self.dims[:stored].copy(), pa.int64()),
            )
            self._dictionary = pa.ListArray.from_arrays(
                numeric_array(self.code_tensor[: codes + 1], pa.int32()), inner
            )
        return self._dictionary

    def array(self, codes: np.ndarray) -> pa.Array:
        """int32 codes (-1: null; all below len(self)) as a dictionary array over the values so far.
        """
        return _coded(codes, self.dictionary())

    def remap(self, array: pa.DictionaryArray, compiled: bool = True) -> pa.DictionaryArray:
        """A dictionary array of another SetShapes (a part read by another process) in this one's
        codes."""
        values = array.dictionary
        outer = values.offsets.to_numpy()
        inner = values.values
        inner_offsets = inner.offsets.to_numpy()
        counts = np.diff(outer).astype(np.int64)
        ndims = np.diff(inner_offsets[outer[0]:outer[-1] + 1]).astype(np.int64)
        dims = inner.values.to_numpy(zero_copy_only=False)[
            inner_offsets[outer[0]] : inner_offsets[outer[-1]]
        ]
        table = np.append(self.codes(counts, ndims, dims, compiled), np.int32(-1))
        indices = array.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        return self.array(table[indices])


def _insert_python(shapes: SetShapes, ndims: np.ndarray, flat: np.ndarray) -> int:
    """One new value appended (the Python form: no numba), its hash and slot as the compiled form
    gives them.
    """
    h = _hash_python(ndims, flat)
    code, tensors, stored = (int(v) for v in shapes.state)
    shapes.code_hash[code] = h
    shapes.tensor_dim[tensors + 1 : tensors + 1 + ndims.shape[0]] = shapes.tensor_dim[
        tensors
    ] + np.cumsum(ndims)
    shapes.dims[stored:stored + flat.shape[0]] = flat
    shapes.code_tensor[code + 1] = tensors + ndims.shape[0]
    shapes.state[:] = (code + 1, tensors + ndims.shape[0], stored + flat.shape[0])
    mask = shapes.slots.shape[0] - 1
    slot = h & mask
    while shapes.slots[slot] != _EMPTY:
        slot = (slot + 1) & mask
    shapes.slots[slot] = code
    return code


_M64 = (1 << 64) - 1


def _mix_python(h: int, v: int) -> int:
    h ^= (v + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2)) & _M64
    h = (h * 0xBF58476D1CE4E5B9) & _M64
    return h ^ (h >> 31)


def _hash_python(ndims: np.ndarray, flat: np.ndarray) -> int:
    h = _mix_python(0x243F6A8885A308D3, ndims.shape[0])
    for n in ndims.tolist():
        h = _mix_python(h, n + 1000003)
    for v in flat.tolist():
        h = _mix_python(h, v & _M64)
    return h


class SetStringLists:
    """The set-wide dictionary of input_dtypes values (a list of dtype names per entry: ['Float',
    'Float']) for dictionary reads. Each value is stored as a one-shape value of a SetShapes, the
    shape being its names' set-wide codes (`strings`, the column's SetStrings); its Arrow dictionary
    is a list<string> array (4 bytes a row where list<dictionary<string>> took 8, and the hang
    analysis hashes each distinct value once)."""

    def __init__(self, strings: SetStrings) -> None:
        self.strings = strings
        self.lists = SetShapes()
        self._dictionary: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.lists)

    def codes(self, counts: np.ndarray, items: np.ndarray, compiled: bool) -> np.ndarray:
        """int32 codes of the entries' lists (counts: names per entry, -1 null; items: the names'
        set-wide codes, -1 a null name)."""
        counts = np.asarray(counts, np.int64)
        one_shape = np.where(counts < 0, -1, 1)
        return self.lists.codes(one_shape, counts[counts >= 0], items, compiled)

    def dictionary(self) -> pa.Array:
        """The values so far as a list<string> array (kept until a value or a name is added)."""
        codes, tensors, stored = self.lists.state.tolist()
        if self._dictionary is None or len(self._dictionary) != codes:
            # each value is one shape: its names are that shape's dims (names only ever added: the
            # codes of the values so far stay good)
            offsets = self.lists.tensor_dim[:tensors + 1].astype(np.int32)
            dims = self.lists.dims[:stored]
            if dims.shape[0] == 0 or int(dims.min()) >= 0:
                # on its buffers: dictionary_decode imports pyarrow.compute (more than a small
                # set's whole analysis)
                names = self.strings.values
                items = string_array([names[c] for c in dims.tolist()])
            else:
                items = coded_array(dims, self.strings.dictionary()).dictionary_decode()
            self._dictionary = pa.ListArray.from_arrays(numeric_array(offsets, pa.int32()), items)
        return self._dictionary

    def array(self, codes: np.ndarray) -> pa.Array:
        """int32 codes (-1: null; all below len(self)) as a dictionary array over the lists so far.
        """
        return _coded(codes, self.dictionary())

    def remap(self, array: pa.DictionaryArray, compiled: bool = True) -> pa.DictionaryArray:
        """A dictionary array of another SetStringLists (a part read by another process) in this
        one's codes."""
        values = array.dictionary
        offsets = values.offsets.to_numpy()
        flat = values.values.slice(offsets[0], offsets[-1] - offsets[0])
        encoded = flat.dictionary_encode()
        table = self.strings.table(encoded.dictionary.to_pylist())
        items = table[encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)]
        mapping = np.append(
            self.codes(np.diff(offsets).astype(np.int64), items.astype(np.int64), compiled),
            np.int32(-1),
        )
        return self.array(mapping[array.indices.fill_null(-1).to_numpy(zero_copy_only=False)])
