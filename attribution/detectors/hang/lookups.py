"""What the root decision reads of the table after the two passes, cached and batched: each rank's
own entry order across groups (history) and, per (group, seq) key, the record id of each rank's
entry (key orders).

Each uncached read is a pass over the table (seconds at 16,384 ranks), so the checks of many ranks
(the members of a cycle, the terminal ranks alone) are made together (Lookups.batch): one pass reads
every history they need, a dry run of the checks collects the keys they may ask for, one pass reads
those, and the checks then run on the cache. A pass decodes only the slices that hold the ranks or
groups it reads (SliceDecoder.slices). In a batch the key orders (the consensus of the other ranks)
are read from the slices that hold the checked ranks: every rank of a table of up to one slice
(SLICE_ROWS: ~2,000 ranks x 2,000 entries), the ~2,000 ranks around them beyond."""

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

from faultlens.attribution.detectors.hang.columns import LazyColumn, filled_values, take_rows
from faultlens.attribution.detectors.hang.decode import (
    SliceDecoder,
    key_codes,
    key_parts,
    member_of,
)
from faultlens.attribution.detectors.hang.graph import Analysis
from faultlens.attribution.detectors.hang.skips import groups_by_role
from faultlens.attribution.detectors.hang.small import distinct

T = TypeVar("T")
# a key-order question wider than this is not answered (memory), as before the cache
MAX_KEYS = 200_000


def rows_for_keys(decoder: SliceDecoder, keys: Iterable[tuple[int, int]],
                  ranks: np.ndarray | None = None) -> dict[tuple[int, int], np.ndarray]:
    """Global row indices of the collective entries of each (group, seq) key, in one pass over the
    slices that hold their groups (ranks, sorted: only the slices that also hold one of these
    ranks)."""
    pairs = np.array([(g, s) for g, s in keys if s >= 0], np.int64).reshape(-1, 2)
    wanted = distinct(key_codes(pairs[:, 0], pairs[:, 1]))
    if wanted.shape[0] == 0:
        return {}
    out: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    groups = distinct(key_parts(wanted)[0])
    for index in decoder.indexed(groups=groups) if ranks is None else decoder.indexed(ranks=ranks):
        combined = key_codes(index.group, index.seq)
        hit = np.flatnonzero(member_of(combined, wanted) & (index.group >= 0))
        if hit.shape[0] == 0:
            continue
        hit_keys = combined[hit]
        order = np.argsort(hit_keys, kind="stable")  # rows of one key stay in table order
        hit, hit_keys = hit[order], hit_keys[order]
        starts = np.flatnonzero(np.r_[True, hit_keys[1:] != hit_keys[:-1]])
        key_groups, key_seqs = key_parts(hit_keys[starts])
        for g, s, block in zip(
            key_groups.tolist(),
            key_seqs.tolist(),
            np.split(hit + index.start, starts[1:]),
            strict=True,
        ):
            out[(g, s)].append(block)
    return {key: np.concatenate(blocks) for key, blocks in out.items()}


def rows_for_ranks(
    decoder: SliceDecoder, ranks: Iterable[int]
) -> dict[int, tuple[np.ndarray, ...]]:
    """Per rank: the seqs, groups, completion and record ids of its collective entries, in one pass.
    """
    wanted = distinct(np.array([r for r in ranks if r >= 0], np.int64))
    pieces: dict[int, list[tuple[np.ndarray, ...]]] = defaultdict(list)
    if wanted.shape[0] == 0:
        return {}
    for index in decoder.indexed(ranks=wanted):
        hit = np.flatnonzero((index.group >= 0) & member_of(index.rank.astype(np.int64), wanted))
        if hit.shape[0] == 0:
            continue
        order = np.argsort(index.rank[hit], kind="stable")
        hit = hit[order]
        hit_ranks = index.rank[hit]
        starts = np.flatnonzero(np.r_[True, hit_ranks[1:] != hit_ranks[:-1]])
        for rank, block in zip(hit_ranks[starts].tolist(), np.split(hit, starts[1:]), strict=True):
            pieces[rank].append(
                (index.seq[block], index.group[block], index.complete[block], block + index.start)
            )
    out: dict[int, tuple[np.ndarray, ...]] = {}
    records = LazyColumn(decoder.table, "record_id")
    for rank, parts in pieces.items():
        rows = np.concatenate([p[3] for p in parts])
        out[rank] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                     np.concatenate([p[2] for p in parts]), records.at(rows)[0])
    return out


class Lookups:
    """The cached reads (see the module docstring); installed on the Analysis as history, key_rows
    and batch.
    """

    def __init__(self, analysis: Analysis, decoder: SliceDecoder) -> None:
        self.analysis = analysis
        self.decoder = decoder
        self.histories: dict[int, tuple[list[int], list[int], int | None] | None] = {}
        # (group, seq) -> rank -> record id
        self.positions: dict[tuple[int, int], dict[int, int]] = {}
        self.recording: set[tuple[int, int]] | None = None  # the keys a dry run asks for
        # in a batch: the key orders are read from the slices that hold the checked ranks (all of a
        # job of up to ~2,000 x 2,000 entries; at 16,384 ranks the ~2,000 ranks around each: their
        # order is the program's)
        self.near: np.ndarray | None = None
        self._by_role: dict[tuple, list[int]] | None = None

    # -- histories

    def history(self, rank: int) -> tuple[list[int], list[int], int | None] | None:
        """rank -> (seqs, groups, index of its first incomplete entry) in its own record order;
        None: no entry.
        """
        if rank not in self.histories:
            self._read_histories([rank])
        return self.histories[rank]

    def _read_histories(self, ranks: list[int]) -> None:
        found = rows_for_ranks(self.decoder, ranks)
        for rank in ranks:
            rows = found.get(rank)
            if rows is None:
                self.histories[rank] = None
                continue
            seqs, groups, complete, order = rows
            sort = np.argsort(order, kind="stable")
            incomplete = np.nonzero(~complete[sort])[0]
            self.histories[rank] = (seqs[sort].tolist(), groups[sort].tolist(),
                                    int(incomplete[0]) if incomplete.shape[0] else None)

    # -- key orders

    def by_role(self) -> dict[tuple, list[int]]:
        if self._by_role is None:
            self._by_role = groups_by_role(self.analysis)
        return self._by_role

    def key_rows(self, due_roles: list[tuple], due_seqs: list[int], roles: list[tuple],
                 seqs: list[int]) -> dict[tuple, dict[int, tuple[int, int]]]:
        """For the collective `due` (role, seq) and each of the others: per rank that entered both
        (in its own group of each role), the record ids of the two entries (its own order)."""
        due = (due_roles[0], due_seqs[0])
        others = list(zip(roles, seqs, strict=True))
        by_role = self.by_role()
        wanted = {(g, due[1]) for g in by_role.get(due[0], ())}
        for role, seq in others:
            wanted |= {(g, seq) for g in by_role.get(role, ())}
        if len(wanted) > MAX_KEYS:
            return {}
        if self.recording is not None:
            self.recording |= wanted
            return {}
        self._read_keys(wanted)
        due_pos = self._positions(*due)
        return {
            (role, seq): {
                r: (due_pos[r], p) for r, p in self._positions(role, seq).items() if r in due_pos
            }
            for role, seq in others
        }

    def _read_keys(self, keys: set[tuple[int, int]]) -> None:
        missing = [k for k in keys if k not in self.positions]
        if not missing:
            return
        rows_of = rows_for_keys(self.decoder, missing, self.near)
        for key in missing:
            self.positions[key] = {}
        if not rows_of:
            return
        all_rows = np.concatenate(list(rows_of.values()))
        ranks = filled_values(take_rows(self.decoder.table.column("rank"), all_rows))
        records, _ = LazyColumn(self.decoder.table, "record_id").at(all_rows)
        i = 0
        for key, rows in rows_of.items():
            found = self.positions[key]
            for _ in range(len(rows)):
                found.setdefault(int(ranks[i]), int(records[i]))
                i += 1

    def _positions(self, role: tuple, seq: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for g in self.by_role().get(role, ()):
            found = self.positions.get((g, seq), {})
            for r in self.analysis.members.get(g, ()):
                rec = found.get(r)
                if rec is not None:
                    out.setdefault(r, rec)
        return out

    # -- many checks, two passes

    def batch(self, ranks: list[int], check: Callable[[int], T]) -> dict[int, T]:
        """check(rank) for each rank, the table read twice in all: the ranks' histories, then every
        key a dry run of the checks asked for."""
        self._read_histories([r for r in ranks if r not in self.histories])
        self.recording = set()
        try:
            for rank in ranks:
                check(rank)
            wanted = self.recording
        finally:
            self.recording = None
        # the key orders of this batch come from the slices holding its ranks: a cache of its own
        saved, self.positions = self.positions, {}
        self.near = distinct(np.array(ranks, np.int64))
        try:
            self._read_keys(wanted)
            return {rank: check(rank) for rank in ranks}
        finally:
            self.positions, self.near = saved, None


def install(analysis: Analysis, decoder: SliceDecoder) -> Any:
    lookups = Lookups(analysis, decoder)
    analysis.history = lookups.history
    analysis.key_rows = lookups.key_rows
    analysis.batch = lookups.batch
    return lookups
