"""The assembly: dumps, as they come, written into the buffers of the chunk being filled (codes of
set-wide dictionaries, the wanted columns only; chunks.py), built into Arrow chunks of CHUNK_ROWS
rows, and the chunks into the set's table, with the process groups' membership (pg_ranks) from
pg_config where it is sound, else rebuilt from the entries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.arrow import (
    SetStrings,
    numeric_array,
    remapped_to_set,
    repeat_strings,
    same_type,
    sparse_lists,
    with_dictionary,
)
from faultlens.collectors.artifacts.flight_recorder.chunks import ChunkBuffers
from faultlens.collectors.artifacts.flight_recorder.groups import (
    comm_lib_of,
    complete_partitions,
    config_ranks,
    status_value,
)
from faultlens.collectors.artifacts.flight_recorder.memory import mapped_full
from faultlens.collectors.artifacts.flight_recorder.model import (
    INT_COLUMNS,
    SCHEMA,
    TIME_COLUMNS,
    Dump,
    SizesColumn,
)
from faultlens.collectors.artifacts.flight_recorder.shapes import SetShapes, SetStringLists
from faultlens.collectors.sources.source import NodeIdentity

_STATUS_COLUMNS = (("pg_last_enqueued", "last_enqueued_collective"),
                   ("pg_last_started", "last_started_collective"),
                   ("pg_last_completed", "last_completed_collective"))


def _unique_first(
    values: np.ndarray, valid: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The valid values' distinct values (sorted), the first row of each, and each row's index into
    them (-1 where not valid); the fast path has them from the scanner (fr_fastpickle.unique_first).
    """
    valid_rows = np.flatnonzero(valid) if values.shape[0] else np.empty(0, np.int64)
    distinct, first_valid = np.unique(values[valid_rows], return_index=True)
    codes = np.full(values.shape[0], -1, np.int32)
    if valid_rows.shape[0]:
        codes[valid_rows] = np.searchsorted(distinct, values[valid_rows]).astype(np.int32)
    return distinct, valid_rows[first_valid], codes


@dataclass
class Assembly:
    """Dumps written, one after another, into the chunk buffers of one set (or of one reader's part
    of it), with the set-wide dictionaries and process-group facts; table() builds the set."""

    columns: set[str]
    dictionary: bool
    strings: dict[str, SetStrings] = field(default_factory=lambda: {
        k: SetStrings() for k in ("op", "state", "pg_name", "pg_desc", "pg_id", "dump_id",
                                  "fr_version", "comm_lib", "node", "input_dtypes", "output_dtypes",
                                  "frames")})
    group_members: dict[str, set[int]] = field(default_factory=dict)  # from entries
    group_configs: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    config_objects: list[tuple[int, ...]] = field(default_factory=list)
    row_group: dict[int, str] = field(default_factory=dict)  # rows carrying pg_ranks -> their group
    group_first_row: dict[str, int] = field(default_factory=dict)
    group_desc: dict[str, str] = field(default_factory=dict)
    ranks_rows: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    # (group, id of the cached ranks tuple)
    carried: set[tuple[str, int]] = field(default_factory=set)
    rows: int = 0  # rows so far in the whole set (row indices below are set-wide)
    chunk_rows: int = 0  # rows not yet built into a chunk
    chunks: list[pa.Table] = field(default_factory=list)
    world_size: int | None = None
    all_ranks: set[int] = field(default_factory=set)
    max_world_size: int | None = None  # fr_limits' (read once per set, not per dump)
    # the chunk buffers written through numba kernels (the sets the fast path reads)
    compiled: bool = False

    def __post_init__(self) -> None:
        # a dictionary read keeps input_sizes and input_dtypes as codes of set-wide dictionaries of
        # their values (shapes.py)
        self.buffers = ChunkBuffers(self.columns, self.compiled, coded_lists=self.dictionary)
        self.shapes = SetShapes()
        self.dtype_lists = SetStringLists(self.strings["input_dtypes"])
        # inputs and outputs share one dictionary of shapes and one of dtype lists
        self.vocabularies: dict[str, SetShapes | SetStringLists] = {
            "input_sizes": self.shapes, "output_sizes": self.shapes,
            "input_dtypes": self.dtype_lists, "output_dtypes": self.dtype_lists}

    def add(self, dump: Dump, dump_id: str) -> None:
        self.all_ranks.add(dump.rank)
        if dump.world_size:
            self.world_size = max(self.world_size or 0, dump.world_size)
        n = dump.n
        status_ids = [str(k) for k in dump.pg_status] or [None]
        end = n + len(status_ids)
        # (before any row is taken: a value they refuse leaves no row behind)
        list_codes = self._list_codes(dump)
        first = self.buffers.take(end)
        end += first
        # the order of the remaps below is the order codes are given in (the dictionaries' order)
        names, descs, id_values, local_codes, first_row_of_id = self._add_groups(dump, first, end)
        self._add_values(dump, first, end)
        self._add_status_columns(dump.pg_status, id_values, local_codes, status_ids, first, n, end)
        for name, codes in list_codes.items():
            self.buffers.put_codes(name, first, n, end, codes)
        self._add_lists(dump, first, n, end)
        self._add_membership(dump, names, descs)
        id_to_name = dict(zip(id_values, names[first_row_of_id].tolist(), strict=True))
        self.buffers.put_codes(
            "pg_name",
            first,
            n,
            end,
            None if self.buffers.fill is not None else names,
            [id_to_name.get(pid, -1) for pid in status_ids],
        )
        self.buffers.put_status_ids(first + n, status_ids)
        self._add_dump_values(dump, dump_id, first, end)
        self.rows += end - first
        self.chunk_rows += end - first

    # -- the steps of add

    def _code(self, name: str, value: str | None) -> int:
        """The set-wide code of one value of a column (-1: none)."""
        return self.strings[name].code(value)

    def _add_groups(self, dump: Dump, first: int,
                    end: int) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray]:
        """Set-wide codes of the entries' strings and local pg ids; returns the entries' pg_name and
        pg_desc codes, the local ids (as text), each entry's code into them (-1 = none) and the
        first entry of each."""
        n = dump.n
        codes = {}
        # pg_name: the group key (name, else local id)
        for key in ("pg_name", "op", "state", "pg_desc"):
            column = dump.strings[key]
            # pg_name's status rows: written at the end of add
            codes[key] = self.buffers.put_mapped(
                key, first, n, end, self.strings[key], column.values, column.codes
            )
        unique_ids, first_rows, local_codes = dump.pg_groups or _unique_first(*dump.pg_id)
        id_values = [str(v) for v in unique_ids.tolist()]
        self.buffers.put_mapped(
            "pg_id", first, n, end, self.strings["pg_id"], id_values, local_codes
        )
        return codes["pg_name"], codes["pg_desc"], id_values, local_codes, first_rows

    def _add_values(self, dump: Dump, first: int, end: int) -> None:
        """The integer and time columns, ts, and the flags."""
        n = dump.n
        for column, key in INT_COLUMNS.items():
            values, valid = dump.ints[key]
            self.buffers.put_ints(column, first, n, end, values, valid)
        for column, key in TIME_COLUMNS.items():
            if column not in self.buffers.values:
                continue
            values, valid = dump.ints[key]
            # the JSON form writes 0 for "not seen"
            self.buffers.put_ints(
                column, first, n, end, values, valid, nonzero=column != "time_created"
            )
        # an entry's creation time, else (and on status rows) the dump's time
        if "ts" in self.columns:
            created, created_valid = dump.ints["time_created_ns"]
            dump_ts = self._dump_ts(dump)
            self.buffers.put_codes(
                "ts", first, n, end, np.where(created_valid, created, dump_ts), dump_ts
            )
        self.buffers.put_codes("is_p2p", first, n, end, dump.is_p2p)
        self.buffers.put_codes("retired", first, n, end, dump.retired)

    def _add_status_columns(self, status: Any, id_values: list[str], local_codes: np.ndarray,
                            status_ids: list[str | None], first: int, n: int, end: int) -> None:
        """pg_status per row, by the entry's local pg id; on a status row, its group's."""
        for column, key in _STATUS_COLUMNS:
            if column not in self.columns:
                continue
            # one value per local pg id, plus "none" last (where local code -1 lands)
            by_id = np.zeros(len(id_values) + 1, np.int64)
            known = np.zeros(len(id_values) + 1, bool)
            for i, pid in enumerate(id_values):
                value = status_value(status, pid, key)
                if value is not None:
                    by_id[i] = value
                    known[i] = True
            rows = [None if pid is None else status_value(status, pid, key) for pid in status_ids]
            self.buffers.put_ints(
                column, first, n, end, by_id[local_codes], known[local_codes], rows
            )

    def _list_codes(self, dump: Dump) -> dict[str, np.ndarray]:
        """The entries' codes in the dictionaries of list values, for the list columns a dictionary
        read codes.
        """
        out = {}
        for key in ("input_sizes", "output_sizes"):
            if key in self.buffers.coded_lists:
                sizes = dump.sizes[key]
                out[key] = self.shapes.codes(sizes.counts, sizes.ndims, sizes.dims, self.compiled)
        for key in ("input_dtypes", "output_dtypes"):
            if key in self.buffers.coded_lists:
                column = dump.dtypes[key]
                # (the dtype strings of both in the inputs' dictionary, as the shared lists are)
                items = self.strings["input_dtypes"].remap(column.values or [], column.items)
                out[key] = self.dtype_lists.codes(column.counts, items, self.compiled)
        return out

    def _add_lists(self, dump: Dump, first: int, n: int, end: int) -> None:
        for key in ("input_sizes", "output_sizes"):
            if key in self.buffers.lists:
                sizes = dump.sizes[key]
                self.buffers.put_list(key, first, n, end, sizes.counts,
                                      SizesColumn(sizes.counts, sizes.ndims.astype(np.int32),
                                                  sizes.dims))
        for key in ("input_dtypes", "output_dtypes"):
            if key in self.buffers.lists:
                column = dump.dtypes[key]
                self.buffers.put_list(key, first, n, end, column.counts,
                                      self.strings[key].remap(column.values or [], column.items))
        if "frames" in self.columns:
            frames = dump.frames
            if frames is None:
                self.buffers.put_list("frames", first, n, end, None)
            else:
                self.buffers.put_list(
                    "frames",
                    first,
                    n,
                    end,
                    frames.counts,
                    self.strings["frames"].remap(frames.values or [], frames.items),
                )

    def _add_membership(self, dump: Dump, names: np.ndarray, descs: np.ndarray) -> None:
        """Membership evidence of the dump's groups: the config where it is sound, else the ranks
        seen in entries (rebuild_membership)."""
        base = self.rows
        # codes below -1 never come: put_mapped writes -1 for those
        if self.buffers.fill is not None:
            names_in_dump, first_rows = self.buffers.fill.first_rows(
                names, len(self.strings["pg_name"].values)
            )
        else:
            names_in_dump, first_rows = np.unique(names, return_index=True)
        for code, first in zip(names_in_dump.tolist(), first_rows.tolist(), strict=True):
            if code < 0:
                continue
            name = self.strings["pg_name"].values[code]
            self.group_members.setdefault(name, set()).add(dump.rank)
            self.group_first_row.setdefault(name, base + first)
            desc_code = descs[first]
            if desc_code >= 0:
                self.group_desc.setdefault(name, self.strings["pg_desc"].values[int(desc_code)])
            ranks = config_ranks(dump.pg_config, name, self.max_world_size)
            if ranks is not None:
                # keyed by the cached tuple's identity: hashing a 16,384-rank tuple for every dump
                # costs seconds
                key = (name, id(ranks))
                if key not in self.carried:
                    self.carried.add(key)
                    self.config_objects.append(ranks)  # keeps id() unique while the assembly lives
                    self.group_configs.setdefault(name, set()).add(ranks)
                    self.ranks_rows.append((base + first, ranks))
                    self.row_group[base + first] = name

    @staticmethod
    def _dump_ts(dump: Dump) -> int:
        created, created_valid = dump.ints["time_created_ns"]
        return int(created[created_valid].max()) if created_valid.any() else dump.mtime_ns

    def _add_dump_values(self, dump: Dump, dump_id: str, first: int, end: int) -> None:
        """The values every row of the dump shares."""
        self.buffers.put_value("rank", first, end, dump.rank)
        for name, value in (("dump_id", dump_id), ("fr_version", dump.version),
                            ("comm_lib", comm_lib_of(dump) or None)):
            if name in self.columns:
                self.buffers.put_value(name, first, end, self._code(name, value))
        self.buffers.put_node(first, end, dump.node)

    # -- membership rebuilt where the config is broken

    def rebuild_membership(self) -> None:
        job = self.all_ranks | set(range(self.world_size or 0))
        unconfigured = {
            name: members
            for name, members in self.group_members.items()
            if name not in self.group_configs
        }
        completed = complete_partitions(unconfigured, self.group_desc, job)
        for name, members in unconfigured.items():
            ranks = set(members) | set(completed.get(name, ()))
            if self.group_desc.get(name) == "default_pg":
                # the default group holds every rank: world_size when a dump says it, else
                # 0..highest rank read
                ranks |= set(range(self.world_size or max(self.all_ranks, default=-1) + 1))
            rebuilt = tuple(sorted(ranks))
            self.ranks_rows.append((self.group_first_row[name], rebuilt))
            self.row_group[self.group_first_row[name]] = name

    # -- Arrow

    def flush_chunk(self, identity: NodeIdentity | None) -> None:
        """Build the rows so far into one Arrow chunk (memory: one chunk's buffers at a time)."""
        if self.chunk_rows:
            self.chunks.append(
                self.buffers.build(self.strings, self.group_desc, identity, self.vocabularies)
            )
            self.chunk_rows = 0

    def table(self, identity: NodeIdentity | None) -> pa.Table:
        """The whole set: the chunks (dictionaries rewrapped with the final, set-wide values) plus
        pg_ranks.
        """
        self.flush_chunk(identity)
        self.rebuild_membership()
        columns: dict[str, pa.ChunkedArray] = {}
        for name in self.chunks[0].column_names:
            pieces = same_type([
                self.final_dictionary(name, chunk.column(name).chunk(0)) for chunk in self.chunks
            ])
            columns[name] = pa.chunked_array(pieces, type=pieces[0].type)
        self.chunks = []
        if "pg_ranks" in self.columns:
            columns["pg_ranks"] = pa.chunked_array([self._pg_ranks_array(self.rows)])
        if identity is not None:
            self._identity_columns(columns, identity)
        ordered = [c for c in SCHEMA.names if c in columns]
        return pa.table({c: columns[c] for c in ordered})

    def final_dictionary(self, name: str, array: pa.Array, keep: bool | None = None) -> pa.Array:
        """A chunk's column with the set's final dictionary (dictionaries only grow: its codes stay
        valid); string columns decoded unless the read keeps dictionaries (keep: whatever the read
        does)."""
        keep = self.dictionary if keep is None else keep
        if name in self.vocabularies and pa.types.is_dictionary(array.type):
            out = pa.DictionaryArray.from_arrays(
                array.indices, self.vocabularies[name].dictionary(), safe=False
            )
            return out if keep else out.dictionary_decode()
        return with_dictionary(array, self.strings.get(name), keep)

    def remapped(self, name: str, array: pa.Array) -> pa.Array:
        """A column of a part another assembly read (its final dictionaries) in this assembly's
        codes.
        """
        if name in self.vocabularies and pa.types.is_dictionary(array.type):
            return self.vocabularies[name].remap(array)
        return remapped_to_set(array, self.strings.get(name))

    def _identity_columns(
        self, columns: dict[str, pa.ChunkedArray], identity: NodeIdentity
    ) -> None:
        """The node identity's values (job, attempt, ...) on every row (node aside: it is per dump).
        """
        for name, value in identity.columns().items():
            if name in self.columns and name != "node" and value is not None:
                if name == "attempt":
                    columns[name] = pa.chunked_array(
                        [numeric_array(mapped_full(self.rows, int(value), np.int32), pa.int32())]
                    )
                else:
                    columns[name] = pa.chunked_array(
                        [repeat_strings([(self.rows, str(value))], self.rows, self.dictionary)])

    def _pg_ranks_array(self, total: int) -> pa.Array:
        # one group's first row each: distinct
        rows = sorted(self.ranks_rows, key=lambda row_ranks: row_ranks[0])
        return sparse_lists(total, [row for row, _ in rows], [ranks for _, ranks in rows])
