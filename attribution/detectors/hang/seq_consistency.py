"""A rank whose sequence ids contradict its own group's (a flipped bit in a valid dump): found
across ranks, named, and its entries read as unknown.

The members of a group record the same collectives in the same order with the same
collective_seq_id. A dump's own checks (collectors/artifacts/flight_recorder/values.py
check_sequences) refuse seq ids that go back or repeat within a group or pass the group's pg_status;
what no dump can show alone is a group's *last* entry (its "last entered", what the hang analysis
compares) that says a seq no peer recorded while it sits where its peers recorded another: same
group, op, sizes and dtypes, between the same neighbours in the rank's own record order (the entries
just before and after it, as (group, collective seq, p2p seq); a neighbour's group may be the one
its peer plays the same part in, e.g. the other tensor-parallel group), and the peers agree on one
seq their own histories back (the group's previous collective one below it, or none recorded) while
the rank's own does not (or two or more peers say so where it has no earlier entry). Such an entry
contradicts its group:

- it is named in one line (the file, the group, the entry, what it says and what the peers
  recorded there), nothing is corrected;
- the rank's entries are read as unknown, as a refused dump's are (the hang analysis' `unreadable`
  ranks): never evidence of being ahead or behind, never a culprit by absence.

A seq a peer recorded anywhere in the group is never called a contradiction: a rank that skipped a
collective, or fell behind with a peer, says such a seq too. p2p entries are not compared (their
p2p_seq_id counts a rank's own sends and receives, partner by partner).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.columns import (
    bool_column,
    code_column,
    int_column,
    primitive_values,
    single_chunk,
    take_rows,
    validity,
)
from faultlens.attribution.detectors.hang.graph import Analysis, Divergence, ranks_text
from faultlens.attribution.detectors.hang.small import distinct

_COLUMNS = ("rank", "pg_name", "record_id", "collective_seq_id")
_SIGNATURE = ("op", "input_sizes", "output_sizes", "input_dtypes")
_BLOCK = 1 << 18  # entries sorted or looked up at a time (bounded scratch)


@dataclass(frozen=True)
class SeqContradiction:
    """One entry whose seq id contradicts its group: rank, group, the entry (its index among the
    rank's entries and its record_id), what it says, what its peers recorded at its place."""

    rank: int
    group: str
    entry: int
    record_id: int
    says: int
    peers_seq: int
    peers: tuple[int, ...]
    op: str

    def problem(self) -> str:
        """One line (the file's name goes before it)."""
        shown = ", ".join(map(str, self.peers[:8])) + (", ..." if len(self.peers) > 8 else "")
        return (
            f"entry {self.entry} (record_id {self.record_id}) collective_seq_id "
            f"{self.says} in process group {self.group!r} ({self.op}) contradicts its group: "
            f"rank(s) {shown} recorded this collective (same op, sizes, neighbours) at seq "
            f"{self.peers_seq}, no rank at {self.says}; the rank's entries are read as "
            "unknown"
        )


def find_contradictions(table: pa.Table) -> tuple[SeqContradiction, ...]:
    """The contradicting last entries of `table` (a dump set's collectives rows, each dump's rows
    together in record order, as read_dump_dir gives them)."""
    if table.num_rows < 2 or any(c not in table.column_names for c in _COLUMNS):
        return ()
    if _none_lonely(table):  # most sets: nothing of the set's size is built
        return ()
    rows = _Rows.of(table)
    if rows.rank.shape[0] < 2:
        return ()
    coll = _indices(rows.coll, rows.row.dtype)
    # the last collective entry of each (rank, group)
    rows.pairs, last_rows = _last_of(rows, coll)
    # of those, the ones whose (group, seq) no other row of the set has
    lonely = _lonely(rows, coll, last_rows)
    found = []
    for i in lonely:
        hit = _place_in_peers(i, rows)
        if hit is None or not _same_signature(rows, i, hit[2]):
            continue
        first_of_rank = int(np.flatnonzero(rows.rank == rows.rank[i])[0])
        found.append(
            SeqContradiction(
                rank=int(rows.rank[i]),
                group=str(rows.names[rows.group[i]]),
                entry=i - first_of_rank,
                record_id=int(rows.value("record_id", i)),
                says=int(rows.seq[i]),
                peers_seq=hit[0],
                peers=hit[1],
                op=str(rows.value("op", i)),
            )
        )
    return tuple(found)


def _none_lonely(table: pa.Table) -> bool:
    """True where no (rank, group)'s last collective entry has a (group, seq) that no other
    collective row has: two passes over the table's slices, scratch of a slice and a few values per
    (rank, group). False where some has, or where a rank's entries do not lie together (the full
    check, _Rows, then decides; it finds a subset of these candidates)."""
    group_column = table.column("pg_name")
    if not pa.types.is_dictionary(group_column.type):  # (a plain read: small sets, tests)
        import pyarrow.compute as pc  # here: its import costs more than a small set's analysis

        group_column = pc.dictionary_encode(group_column)
    if group_column.num_chunks == 0:
        return table.num_rows == 0
    group_column = group_column.unify_dictionaries()
    width = len(group_column.chunk(0).dictionary) + 1
    table = table.set_column(table.column_names.index("pg_name"), "pg_name", group_column)
    wanted = ("record_id", "collective_seq_id", "rank", "pg_name", "is_p2p")
    slices = _common_slices(table, tuple(c for c in wanted if c in table.column_names))
    last: dict[int, tuple[int, int]] = {}  # rank * width + group + 1 -> (group, seq)
    seen: set[int] = set()
    current: int | None = None
    for start, length in slices:
        rank, group, seq, coll = _slice_entries(table, start, length)
        if rank.shape[0]:
            starts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
            for r in rank[starts].tolist():
                if r != current and r in seen:  # a rank's entries in two places
                    return False
                seen.add(r)
                current = r
        rank, group, seq = rank[coll], group[coll], seq[coll]
        keys = rank.astype(np.int64) * width + group + 1
        unique, from_end = np.unique(keys[::-1], return_index=True)
        at = keys.shape[0] - 1 - from_end
        last.update(zip(unique.tolist(), zip(group[at].tolist(), seq[at].tolist(), strict=True),
                        strict=True))
    if not last:
        return True
    pairs = np.array(list(last.values()), np.int64)
    seqs = distinct(pairs[:, 1])
    mine = (pairs[:, 0] + 1) * seqs.shape[0] + np.searchsorted(seqs, pairs[:, 1])
    keys_wanted = distinct(mine)
    counts = np.zeros(keys_wanted.shape[0], np.int64)
    for start, length in slices:
        _, group, seq, coll = _slice_entries(table, start, length)
        group, seq = group[coll], seq[coll]
        where = np.minimum(np.searchsorted(seqs, seq), seqs.shape[0] - 1)
        hit = seqs[where] == seq
        keys = (group[hit].astype(np.int64) + 1) * seqs.shape[0] + where[hit]
        at = np.minimum(np.searchsorted(keys_wanted, keys), keys_wanted.shape[0] - 1)
        counts += np.bincount(at[keys_wanted[at] == keys], minlength=keys_wanted.shape[0])
    return bool(np.all(counts >= 2))


def _slice_entries(
    table: pa.Table, start: int, length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The entries of one slice (rows with a record_id and a seq id): rank, group code (-1: no
    name), seq, and whether each is a collective (not p2p)."""
    seq, has_seq = _narrow_ints(table.column("collective_seq_id").slice(start, length))
    keep = validity(table.column("record_id").slice(start, length))
    at = np.flatnonzero(keep & has_seq if has_seq is not None else keep)
    rank = _narrow_ints(table.column("rank").slice(start, length))[0][at]
    group = code_column(single_chunk(table.column("pg_name").slice(start, length)).indices)[at]
    if "is_p2p" in table.column_names:
        p2p = bool_column(table.column("is_p2p").slice(start, length), length)[at]
    else:
        p2p = np.zeros(at.shape[0], bool)
    return rank, group, seq[at], ~p2p


@dataclass
class _Rows:
    """The entries (rows with a record_id and a collective_seq_id; a dump's status rows have none),
    each rank's in record order: the table's row, rank, group code, seq id (each in its narrowest
    width), collective or p2p, and which (rank, group) pair codes occur in collectives (set by
    find_contradictions); op and p2p seq read at the few rows asked for."""

    table: pa.Table
    row: np.ndarray
    rank: np.ndarray
    group: np.ndarray
    seq: np.ndarray
    coll: np.ndarray
    pairs: np.ndarray
    names: list[str]

    @classmethod
    def of(cls, table: pa.Table) -> _Rows:
        """Built slice by slice (the columns' common chunks: no whole-column copy), in the
        columns' own widths: a few bytes a row where a whole-set int64 copy of each column cost
        ~80 (160 MiB at 1,024 ranks x 2,000 entries)."""
        names_of = table.column_names
        p2p_column = table.column("is_p2p") if "is_p2p" in names_of else None
        codes, names = _codes(table.column("pg_name"))
        n = table.num_rows
        row_type = np.int32 if n < 2**31 else np.int64
        # filled in place (at most n entries), then cut to the entries found
        row, coll = np.empty(n, row_type), np.ones(n, bool)
        rank: np.ndarray | None = None
        seq: np.ndarray | None = None
        found = 0
        for start, length in _common_slices(table, ("record_id", "collective_seq_id", "rank")):
            part_seq, has_seq = _narrow_ints(table.column("collective_seq_id").slice(start, length))
            keep = validity(table.column("record_id").slice(start, length))
            at = np.flatnonzero(keep & has_seq if has_seq is not None else keep)
            part_rank = _narrow_ints(table.column("rank").slice(start, length))[0]
            rank = _widened(rank, part_rank.dtype, n)
            seq = _widened(seq, part_seq.dtype, n)
            end = found + at.shape[0]
            row[found:end] = at + start
            rank[found:end] = part_rank[at]
            seq[found:end] = part_seq[at]
            if p2p_column is not None:
                coll[found:end] = ~bool_column(p2p_column.slice(start, length), length)[at]
            found = end
        row, coll = row[:found], coll[:found]
        rank = rank[:found] if rank is not None else np.empty(0, np.int32)
        seq = seq[:found] if seq is not None else np.empty(0, np.int32)
        if not _sorted(rank):
            record = int_column(take_rows(table.column("record_id"), row))[0]
            order = np.lexsort((record, rank))
            row, rank, seq, coll = row[order], rank[order], seq[order], coll[order]
        group = codes[row]
        del codes
        return cls(table, row, rank, group, seq, coll, np.empty(0, np.int64), names)

    def pair_of(self, at: np.ndarray) -> np.ndarray:
        """The (rank, group) pair code (int64) of entries `at`."""
        width = int(self.group.max(initial=0)) + 1
        return self.rank[at].astype(np.int64) * width + self.group[at]

    def has(self, ranks: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Whether each rank recorded anything in the group beside it."""
        width = int(self.group.max(initial=0)) + 1
        return np.isin(ranks.astype(np.int64) * width + groups, self.pairs)

    def values(self, name: str, at: np.ndarray) -> list:
        """A column's values at entries `at` (None where the table has no such column)."""
        if name not in self.table.column_names:
            return [None] * len(at)
        return take_rows(self.table.column(name), self.row[np.asarray(at, np.int64)]).to_pylist()

    def value(self, name: str, at: int):
        return self.values(name, np.array([at]))[0]


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A string column as codes (-1 null; int16 where the values allow, else int32) and the values
    they index, from its dictionary where it has one (no string copy; no pandas: Arrow's to_numpy
    and fill_null with a Python scalar import it)."""
    if not pa.types.is_dictionary(column.type):
        import pyarrow.compute as pc  # here: its import costs more than a small set's analysis

        column = pc.dictionary_encode(column)
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column])
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return np.empty(0, np.int32), []
    names = [str(v) for v in column.chunk(0).dictionary.to_pylist()]
    code_type = np.int16 if len(names) < 2**15 else np.int32
    out = np.empty(len(column), code_type)
    at = 0
    for chunk in column.chunks:
        out[at:at + len(chunk)] = code_column(chunk.indices)
        at += len(chunk)
    return out, names


def _indices(mask: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """np.flatnonzero(mask) in `dtype`, block by block (no int64 array of every row)."""
    out = np.empty(int(np.count_nonzero(mask)), dtype)
    at = 0
    for a in range(0, mask.shape[0], _BLOCK):
        found = np.flatnonzero(mask[a:a + _BLOCK])
        out[at:at + found.shape[0]] = found + a
        at += found.shape[0]
    return out


def _widened(out: np.ndarray | None, dtype: np.dtype, n: int) -> np.ndarray:
    """`out` (n items, None: not made yet) in a type that holds `dtype`'s values too."""
    if out is None:
        return np.empty(n, dtype)
    if np.can_cast(dtype, out.dtype):
        return out
    return out.astype(np.promote_types(out.dtype, dtype))


def _common_slices(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, length) of the slices where none of `columns` changes chunk (each column's slice
    there is one chunk, read without a copy), at most _BLOCK rows each (bounded scratch)."""
    cuts = {0, table.num_rows}
    for name in columns:
        at = 0
        for chunk in table.column(name).chunks:
            at += len(chunk)
            cuts.add(at)
    ends = sorted(cuts)
    return [
        (at, min(_BLOCK, b - at))
        for a, b in itertools.pairwise(ends)
        for at in range(a, b, _BLOCK)
    ]


def _narrow_ints(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None]:
    """An integer column of one chunk as its values in its own width (at least int32; int64 where
    wider than 32 bits), -1 where null, and its validity (None: no nulls)."""
    array = single_chunk(column)
    if len(array) == 0:
        return np.empty(0, np.int32), None
    if not pa.types.is_integer(array.type) or array.buffers()[1] is None:
        values, valid = int_column(array)
        return values, valid
    values, valid = primitive_values(array)
    if values.dtype.itemsize < 4 or values.dtype == np.uint32:
        values = values.astype(np.int64 if values.dtype == np.uint32 else np.int32)
    elif values.dtype == np.uint64:
        values = values.astype(np.int64)
    if valid is not None:
        values = np.where(valid, values, values.dtype.type(-1))
    return values, valid


def _sorted(values: np.ndarray) -> bool:
    """Each rank's rows together (the order within a rank is the dump's)."""
    if values.shape[0] == 0:
        return True
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return distinct(values[starts]).shape[0] == starts.shape[0]


def _last_of(rows: _Rows, coll: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (rank, group) pair codes of the collective entries `coll` (ascending), sorted,
    and the last entry of each: in blocks of whole ranks (each rank's entries lie together), so the
    sort's scratch is a block's, not the set's."""
    if coll.shape[0] == 0:
        return np.empty(0, np.int64), coll
    keys_out, rows_out = [], []
    changes = np.flatnonzero(rows.rank[1:] != rows.rank[:-1]) + 1
    starts = [0]
    for b in changes.tolist():
        if b - starts[-1] >= _BLOCK:
            starts.append(b)
    starts.append(rows.rank.shape[0])
    cuts = np.searchsorted(coll, starts)
    for a, b in itertools.pairwise(cuts.tolist()):
        if b <= a:
            continue
        block = coll[a:b]
        keys = rows.pair_of(block)
        unique, first_from_end = np.unique(keys[::-1], return_index=True)
        keys_out.append(unique)
        rows_out.append(block[::-1][first_from_end])
    keys, last = np.concatenate(keys_out), np.concatenate(rows_out)
    order = np.argsort(keys, kind="stable")
    return keys[order], last[order]


def _lonely(rows: _Rows, coll: np.ndarray, last_rows: np.ndarray) -> list[int]:
    """The rows of `last_rows` whose (group, seq) no other collective row has: each collective row's
    (group, seq) looked up in the sorted pairs of theirs, block by block (bounded scratch), and the
    hits counted (exact for any seq: a seq is matched by value, then paired with its group)."""
    if last_rows.shape[0] == 0:
        return []
    seqs = distinct(rows.seq[last_rows])

    def keys_of(at: np.ndarray) -> np.ndarray:
        seq = rows.seq[at]
        where = np.minimum(np.searchsorted(seqs, seq), seqs.shape[0] - 1)
        hit = seqs[where] == seq
        # (group, seq index) as one int64; -1 where the seq is none of theirs
        return np.where(hit, rows.group[at].astype(np.int64) * seqs.shape[0] + where, -1)

    mine = keys_of(last_rows)
    wanted = distinct(mine)
    counts = np.zeros(wanted.shape[0], np.int64)
    for a in range(0, coll.shape[0], _BLOCK):
        keys = keys_of(coll[a:a + _BLOCK])
        keys = keys[keys >= 0]
        at = np.minimum(np.searchsorted(wanted, keys), wanted.shape[0] - 1)
        counts += np.bincount(at[wanted[at] == keys], minlength=wanted.shape[0])
    once = counts[np.searchsorted(wanted, mine)] == 1
    return last_rows[once].tolist()


def _previous_in_group(rows: _Rows, i: int) -> int | None:
    """The seq of the collective of row i's group that row i's rank recorded just before it."""
    at = i - 1
    while at >= 0 and rows.rank[at] == rows.rank[i]:
        if rows.group[at] == rows.group[i] and rows.coll[at]:
            return int(rows.seq[at])
        at -= 1
    return None


def _place_in_peers(i: int, rows: _Rows) -> tuple[int, tuple[int, ...], int] | None:
    """Where the peers (other ranks of row i's group) recorded a collective of that group between
    the same neighbours as row i (the entries just before and after it in the rank's record order:
    same group, or a group of the same op that neither rank recorded in the other's place, e.g. the
    other tensor-parallel group; same seq ids): (their seq, the ranks, one of their rows) where
    they agree on one seq other than row i's and their own histories back it (the group's previous
    collective one below it, or none recorded) while row i's does not (its previous one is not one
    below it, or it has none and two or more peers agree). Else None: one rank against one with
    nothing before them, or a rank whose own history backs its seq (it may have skipped one), is
    no contradiction anyone can name."""
    rank, group, seq = rows.rank, rows.group, rows.seq
    n = rank.shape[0]
    mine = _previous_in_group(rows, i)
    if mine is not None and int(seq[i]) == mine + 1:
        return None
    sides = [s for s in (-1, 1) if 0 <= i + s < n and rank[i + s] == rank[i]]
    if not sides:
        return None
    peers = np.flatnonzero((group == group[i]) & rows.coll & (rank != rank[i]))
    for side in sides:  # (the cheap tests first: a group's rows may be millions)
        j = peers + side
        inside = (j >= 0) & (j < n)
        peers, j = peers[inside], j[inside]
        keep = (rank[j] == rank[peers]) & (seq[j] == seq[i + side])
        peers, j = peers[keep], j[keep]
        theirs, own = group[j], group[i + side]
        # the same group, or one the other rank never recorded in its place (the other TP group)
        parallel = (
            (theirs != own)
            & ~rows.has(np.full(j.shape[0], rank[i]), theirs)
            & ~rows.has(rank[peers], np.full(j.shape[0], own))
        )
        keep = (theirs == own) | parallel
        peers, j = peers[keep], j[keep]
        keep = _equal(rows.values("op", j), rows.value("op", i + side))
        keep &= _equal(rows.values("p2p_seq_id", j), rows.value("p2p_seq_id", i + side))
        peers = peers[keep]
    matched = peers
    if matched.shape[0] == 0:
        return None
    said = distinct(seq[matched])
    if said.shape[0] != 1 or int(said[0]) == int(seq[i]):
        return None
    backed = [
        int(j)
        for j in matched.tolist()
        if (before := _previous_in_group(rows, j)) is None or before + 1 == int(said[0])
    ]
    if not backed or (mine is None and len(backed) < 2):
        return None
    return int(said[0]), tuple(sorted(int(rank[j]) for j in backed)), backed[0]


def _same_signature(rows: _Rows, i: int, j: int) -> bool:
    return all(rows.value(name, i) == rows.value(name, j) for name in _SIGNATURE)


def _equal(values: list, value) -> np.ndarray:
    return np.array([v == value for v in values], bool)


def release_unreadable_waits(analysis: Analysis) -> None:
    """A rank whose dump was refused (or contradicts its group) is read as a missing one, but it
    wrote a dump: it was alive then. So
    - a wait on it and on a rank that wrote no dump at all is a wait on the latter;
    - a rank that stopped after its group's latest collective did not stop on its death (waits.py
      "stopped"): that wait is dropped;
    - any other wait on it (a send/recv with it not completed, a collective of a group it is in) is
      dropped where its waiters are themselves shown lagging by the readable dumps (a divergence
      among ranks that dumped readably): the culprit those dumps show is not hidden behind a rank
      nobody can read. Waits by no such laggard stay (waits.py decides them)."""
    if not analysis.unreadable:
        return
    missing, unreadable = analysis.missing, analysis.unreadable
    shown = {
        r
        for d in analysis.divergences
        if d.level not in ("missing", "stopped") and not set(d.laggards) & missing
        for r in d.laggards
    }

    def released(d: Divergence) -> bool:
        if d.level not in ("missing", "stopped") or not set(d.laggards) <= unreadable:
            return False
        return d.level == "stopped" or set(d.waiters) <= shown

    # a wait on a rank that wrote no file at all and on one whose file was refused: the one that
    # wrote nothing is what it waits on (the other was alive to write)
    for d in analysis.divergences + analysis.ambiguous_stops:
        if (
            d.level in ("missing", "stopped")
            and set(d.laggards) - unreadable
            and set(d.laggards) & unreadable
        ):
            d.laggards = tuple(r for r in d.laggards if r not in unreadable)
    gone = [d for d in analysis.divergences + analysis.ambiguous_stops if released(d)]
    if not gone:
        return
    analysis.divergences = [d for d in analysis.divergences if not released(d)]
    analysis.ambiguous_stops = [d for d in analysis.ambiguous_stops if not released(d)]
    waiters = sorted({r for d in gone for r in d.waiters})
    analysis.evidence.append(
        f"rank(s) {ranks_text(waiters)} are not counted as waiting on rank(s) "
        f"{ranks_text(sorted({r for d in gone for r in d.laggards}))}, whose dump was refused or "
        "contradicts its group: it was written, so they did not stop on its death, and the "
        "readable dumps show them lagging themselves"
    )


def without_ranks(table: pa.Table, ranks: set[int]) -> pa.Table:
    """The table without the rows of `ranks` (their entries and status rows)."""
    rank = int_column(table.column("rank"))[0]
    return take_rows(table, np.flatnonzero(~np.isin(rank, sorted(ranks))))
