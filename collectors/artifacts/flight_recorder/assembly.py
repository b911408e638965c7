"""The assembly: dumps, as they come, into per-dump parts (codes of set-wide dictionaries, the wanted columns
only), the parts into Arrow chunks of CHUNK_ROWS rows (chunks.py), and the chunks into the set's table, with the
process groups' membership (pg_ranks) from pg_config where it is sound, else rebuilt from the entries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.collectors.artifacts.flight_recorder.arrow import (
    _list_from_counts,
    _repeat_strings,
    _Strings,
    _with_dictionary,
)
from faultlens.collectors.artifacts.flight_recorder.chunks import _ChunkBuilder
from faultlens.collectors.artifacts.flight_recorder.groups import _comm_lib, _config_ranks, _status_value
from faultlens.collectors.artifacts.flight_recorder.model import (
    _INT_COLUMNS,
    _TIME_COLUMNS,
    SCHEMA,
    _Dump,
    _SizesColumn,
)
from faultlens.collectors.sources.source import NodeIdentity

_STATUS_COLUMNS = (("pg_last_enqueued", "last_enqueued_collective"),
                   ("pg_last_started", "last_started_collective"),
                   ("pg_last_completed", "last_completed_collective"))


@dataclass
class _Assembly:
    columns: set[str]
    dictionary: bool
    strings: dict[str, _Strings] = field(default_factory=lambda: {
        k: _Strings() for k in ("op", "state", "pg_name", "pg_desc", "pg_id", "dump_id", "fr_version",
                                "comm_lib", "node", "input_dtypes", "output_dtypes", "frames")})
    parts: list[dict[str, Any]] = field(default_factory=list)
    group_members: dict[str, set[int]] = field(default_factory=dict)  # from entries
    group_configs: dict[str, set[tuple[int, ...]]] = field(default_factory=dict)
    config_objects: list[tuple[int, ...]] = field(default_factory=list)
    row_group: dict[int, str] = field(default_factory=dict)  # rows carrying pg_ranks -> their group
    group_first_row: dict[str, int] = field(default_factory=dict)
    group_desc: dict[str, str] = field(default_factory=dict)
    ranks_rows: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    carried: set[tuple[str, int]] = field(default_factory=set)  # (group, id of the cached ranks tuple)
    rows: int = 0  # rows so far in the whole set (row indices below are set-wide)
    chunk_rows: int = 0  # rows of the parts not yet built into a chunk
    chunks: list[pa.Table] = field(default_factory=list)
    world_size: int | None = None
    all_ranks: set[int] = field(default_factory=set)
    max_world_size: int | None = None  # fr_limits' (read once per set, not per dump)

    def add(self, dump: _Dump, dump_id: str) -> None:
        self.all_ranks.add(dump.rank)
        if dump.world_size:
            self.world_size = max(self.world_size or 0, dump.world_size)
        part: dict[str, Any] = {"n": dump.n}
        # the order of the remaps below is the order codes are given in (the dictionaries' order)
        id_values, local_codes, first_row_of_id = self._add_groups(part, dump)
        self._add_values(part, dump)
        self._add_status_columns(part, dump.pg_status, id_values, local_codes)
        self._add_lists(part, dump)
        self._add_membership(part, dump)
        status_rows = len(self._add_status_rows(part, dump.pg_status, id_values, part["pg_name"][first_row_of_id]))
        self._add_dump_values(part, dump, dump_id)
        self.rows += dump.n + status_rows
        self.chunk_rows += dump.n + status_rows
        self.parts.append(part)

    # -- the steps of add

    def _add_groups(self, part: dict[str, Any], dump: _Dump) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Set-wide codes of the entries' strings and local pg ids; returns the local ids (as text), each
        entry's code into them (-1 = none) and the first entry of each."""
        n = dump.n
        names = dump.strings["pg_name"]
        part["pg_name"] = self.strings["pg_name"].remap(names.values, names.codes)  # group key: name, else local id
        for key in ("op", "state", "pg_desc"):
            column = dump.strings[key]
            part[key] = self.strings[key].remap(column.values, column.codes)
        pg_ids, pg_valid = dump.pg_id
        valid_rows = np.flatnonzero(pg_valid) if n else np.empty(0, np.int64)
        unique_ids, first_valid = np.unique(pg_ids[valid_rows], return_index=True)
        id_values = [str(v) for v in unique_ids.tolist()]
        local_codes = np.full(n, -1, np.int32)
        if valid_rows.shape[0]:
            local_codes[valid_rows] = np.searchsorted(unique_ids, pg_ids[valid_rows]).astype(np.int32)
        part["pg_id"] = self.strings["pg_id"].remap(id_values, local_codes)
        return id_values, local_codes, valid_rows[first_valid]

    def _add_values(self, part: dict[str, Any], dump: _Dump) -> None:
        """Copies of the wanted integer and time columns, and the flags: the parser's 2-D arrays are released with
        the dump."""
        for column, key in _INT_COLUMNS.items():
            if column in self.columns:
                values, valid = dump.ints[key]
                part[column] = (values.copy(), valid.copy())
        for column, key in _TIME_COLUMNS.items():
            if column not in self.columns and column != "time_created":
                continue
            values, valid = dump.ints[key]
            if column != "time_created":
                valid = valid & (values != 0)  # the JSON form writes 0 for "not seen"
            part[column] = (values.copy(), valid.copy())
        part["is_p2p"] = dump.is_p2p.copy()
        part["retired"] = dump.retired.copy()

    def _add_status_columns(self, part: dict[str, Any], status: Any, id_values: list[str],
                            local_codes: np.ndarray) -> None:
        """pg_status per row, by the entry's local pg id."""
        for column, key in _STATUS_COLUMNS:
            if column not in self.columns:
                continue
            # one value per local pg id, plus "none" last (where local code -1 lands)
            by_id = np.zeros(len(id_values) + 1, np.int64)
            known = np.zeros(len(id_values) + 1, bool)
            for i, pid in enumerate(id_values):
                value = _status_value(status, pid, key)
                if value is not None:
                    by_id[i] = value
                    known[i] = True
            part[column] = (by_id[local_codes], known[local_codes])

    def _add_lists(self, part: dict[str, Any], dump: _Dump) -> None:
        for key in ("input_sizes", "output_sizes"):
            if key in self.columns:
                sizes = dump.sizes[key]
                part[key] = _SizesColumn(sizes.counts.astype(np.int32), sizes.ndims.astype(np.int32), sizes.dims)
        for key in ("input_dtypes", "output_dtypes"):
            if key in self.columns:
                column = dump.dtypes[key]
                part[key] = (column.counts.astype(np.int32),
                             self.strings[key].remap(column.values or [], column.items))
        if dump.frames is not None and "frames" in self.columns:
            part["frames"] = (dump.frames.counts, self.strings["frames"].remap(dump.frames.values or [],
                                                                              dump.frames.items))

    def _add_membership(self, part: dict[str, Any], dump: _Dump) -> None:
        """Membership evidence of the dump's groups: the config where it is sound, else the ranks seen in
        entries (rebuild_membership)."""
        base = self.rows
        names_in_dump, first_rows = np.unique(part["pg_name"], return_index=True)
        for code, first in zip(names_in_dump.tolist(), first_rows.tolist(), strict=True):
            if code < 0:
                continue
            name = self.strings["pg_name"].values[code]
            self.group_members.setdefault(name, set()).add(dump.rank)
            self.group_first_row.setdefault(name, base + first)
            desc_code = part["pg_desc"][first]
            if desc_code >= 0:
                self.group_desc.setdefault(name, self.strings["pg_desc"].values[int(desc_code)])
            ranks = _config_ranks(dump.pg_config, name, self.max_world_size)
            if ranks is not None:
                # keyed by the cached tuple's identity: hashing a 16,384-rank tuple for every dump costs seconds
                key = (name, id(ranks))
                if key not in self.carried:
                    self.carried.add(key)
                    self.config_objects.append(ranks)  # keeps id() unique while the assembly lives
                    self.group_configs.setdefault(name, set()).add(ranks)
                    self.ranks_rows.append((base + first, ranks))
                    self.row_group[base + first] = name

    @staticmethod
    def _add_status_rows(part: dict[str, Any], status: Any, id_values: list[str],
                         first_names: np.ndarray) -> list[tuple]:
        """Status rows: one per pg_status group (or one marker)."""
        status_ids = [str(k) for k in status] or [None]
        id_to_name = dict(zip(id_values, first_names.tolist(), strict=True))
        part["status"] = []
        for pid in status_ids:
            part["status"].append((
                pid, id_to_name.get(pid, -1),
                None if pid is None else _status_value(status, pid, "last_enqueued_collective"),
                None if pid is None else _status_value(status, pid, "last_started_collective"),
                None if pid is None else _status_value(status, pid, "last_completed_collective"),
            ))
        return part["status"]

    def _add_dump_values(self, part: dict[str, Any], dump: _Dump, dump_id: str) -> None:
        """The values every row of the dump shares."""
        part["rank"] = dump.rank
        part["dump_id"] = self.strings["dump_id"].remap([dump_id], np.zeros(1, np.int32))[0]
        part["fr_version"] = self.strings["fr_version"].remap([dump.version], np.zeros(1, np.int32))[0] \
            if dump.version is not None else -1
        lib = _comm_lib(dump)
        part["comm_lib"] = self.strings["comm_lib"].remap([lib], np.zeros(1, np.int32))[0] if lib else -1
        part["node"] = dump.node
        created, created_valid = dump.ints["time_created_ns"]
        part["dump_ts"] = int(created[created_valid].max()) if created_valid.any() else dump.mtime_ns

    # -- membership rebuilt where the config is broken

    def rebuild_membership(self) -> None:
        for name, members in self.group_members.items():
            if name in self.group_configs:
                continue
            ranks = set(members)
            if self.group_desc.get(name) == "default_pg":
                # the default group holds every rank: world_size when a dump says it, else 0..highest rank read
                ranks |= set(range(self.world_size or max(self.all_ranks, default=-1) + 1))
            rebuilt = tuple(sorted(ranks))
            self.ranks_rows.append((self.group_first_row[name], rebuilt))
            self.row_group[self.group_first_row[name]] = name

    # -- Arrow

    def flush_chunk(self, identity: NodeIdentity | None) -> None:
        """Build the parts so far into one Arrow chunk and drop them (memory: one chunk of parts at a time)."""
        if self.parts:
            self.chunks.append(self._chunk_table(identity))
            self.parts = []
            self.chunk_rows = 0

    def table(self, identity: NodeIdentity | None) -> pa.Table:
        """The whole set: the chunks (dictionaries rewrapped with the final, set-wide values) plus pg_ranks."""
        self.flush_chunk(identity)
        self.rebuild_membership()
        columns: dict[str, pa.ChunkedArray] = {}
        for name in self.chunks[0].column_names:
            pieces = [_with_dictionary(chunk.column(name).chunk(0), self.strings.get(name), self.dictionary)
                      for chunk in self.chunks]
            columns[name] = pa.chunked_array(pieces, type=pieces[0].type)
        self.chunks = []
        if "pg_ranks" in self.columns:
            columns["pg_ranks"] = pa.chunked_array([self._pg_ranks_array(self.rows)])
        if identity is not None:
            self._identity_columns(columns, identity)
        ordered = [c for c in SCHEMA.names if c in columns]
        return pa.table({c: columns[c] for c in ordered})

    def _identity_columns(self, columns: dict[str, pa.ChunkedArray], identity: NodeIdentity) -> None:
        """The node identity's values (job, attempt, ...) on every row (node aside: it is per dump)."""
        for name, value in identity.columns().items():
            if name in self.columns and name != "node" and value is not None:
                if name == "attempt":
                    columns[name] = pa.chunked_array([pa.array(np.full(self.rows, int(value), np.int32))])
                else:
                    columns[name] = pa.chunked_array([_repeat_strings([(self.rows, str(value))], self.rows,
                                                                      self.dictionary)])

    def _chunk_table(self, identity: NodeIdentity | None) -> pa.Table:
        return _ChunkBuilder(self.parts, self.chunk_rows, self.strings, self.columns, self.group_desc,
                             identity).build()

    def _pg_ranks_array(self, total: int) -> pa.Array:
        counts = np.full(total, -1, np.int32)
        rows = sorted(self.ranks_rows)
        for row, ranks in rows:
            counts[row] = len(ranks)
        values = np.fromiter((r for _, ranks in rows for r in ranks), np.int32,
                             count=sum(len(r) for _, r in rows))
        return _list_from_counts(counts, pa.array(values, pa.int32()))
