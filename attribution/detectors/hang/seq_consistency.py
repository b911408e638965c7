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

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.columns import (
    bool_column,
    code_column,
    int_column,
    take_rows,
    validity,
)
from faultlens.attribution.detectors.hang.graph import Analysis, Divergence, ranks_text
from faultlens.attribution.detectors.hang.small import distinct

_COLUMNS = ("rank", "pg_name", "record_id", "collective_seq_id")
_SIGNATURE = ("op", "input_sizes", "output_sizes", "input_dtypes")


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
    rows = _Rows.of(table)
    if rows.rank.shape[0] < 2:
        return ()
    coll = np.flatnonzero(rows.coll)
    # the last collective entry of each (rank, group)
    rows.pairs, last_rows = _last_of(rows.pair[coll], coll)
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


@dataclass
class _Rows:
    """The entries (rows with a record_id and a collective_seq_id; a dump's status rows have none),
    each rank's in record order: the table's row, rank, group code, seq id, collective or p2p, the
    (rank, group) pair code and which pairs occur in collectives (set by find_contradictions); op
    and p2p seq read at the few rows asked for."""

    table: pa.Table
    row: np.ndarray
    rank: np.ndarray
    group: np.ndarray
    seq: np.ndarray
    coll: np.ndarray
    pair: np.ndarray
    pairs: np.ndarray
    names: list[str]

    @classmethod
    def of(cls, table: pa.Table) -> _Rows:
        n = table.num_rows
        seq, has_seq = int_column(table.column("collective_seq_id"))
        row = np.flatnonzero(validity(table.column("record_id")) & has_seq)
        rank = int_column(table.column("rank"))[0][row]
        if not _sorted(rank):
            record = int_column(table.column("record_id"))[0][row]
            order = np.lexsort((record, rank))
            row, rank = row[order], rank[order]
        group, names = _codes(table.column("pg_name"))
        group = group[row]
        is_p2p = bool_column(table.column("is_p2p") if "is_p2p" in table.column_names else None, n)
        pair = rank * (int(group.max(initial=0)) + 1) + group
        return cls(table, row, rank, group, seq[row], ~is_p2p[row], pair, pair[:0], names)

    def has(self, ranks: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Whether each rank recorded anything in the group beside it."""
        width = int(self.group.max(initial=0)) + 1
        return np.isin(ranks * width + groups, self.pairs)

    def values(self, name: str, at: np.ndarray) -> list:
        """A column's values at entries `at` (None where the table has no such column)."""
        if name not in self.table.column_names:
            return [None] * len(at)
        return take_rows(self.table.column(name), self.row[np.asarray(at, np.int64)]).to_pylist()

    def value(self, name: str, at: int):
        return self.values(name, np.array([at]))[0]


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A string column as int64 codes (-1 null) and the values they index, from its dictionary
    where it has one (no string copy; no pandas: Arrow's to_numpy and fill_null with a Python
    scalar import it)."""
    if not pa.types.is_dictionary(column.type):
        import pyarrow.compute as pc  # here: its import costs more than a small set's analysis

        column = pc.dictionary_encode(column)
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column])
    column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return np.empty(0, np.int64), []
    codes = np.concatenate([code_column(chunk.indices) for chunk in column.chunks])
    return codes.astype(np.int64), [str(v) for v in column.chunk(0).dictionary.to_pylist()]


def _sorted(values: np.ndarray) -> bool:
    """Each rank's rows together (the order within a rank is the dump's)."""
    if values.shape[0] == 0:
        return True
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return distinct(values[starts]).shape[0] == starts.shape[0]


def _last_of(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (sorted) and the last row of each (rows ascending)."""
    if rows.shape[0] == 0:
        return keys, rows
    unique, first_from_end = np.unique(keys[::-1], return_index=True)
    return unique, rows[::-1][first_from_end]


def _lonely(rows: _Rows, coll: np.ndarray, last_rows: np.ndarray) -> list[int]:
    """The rows of `last_rows` whose (group, seq) no other collective row has: counted over the rows
    whose seq is one of theirs only (a search in their sorted seqs, not a sort of every row)."""
    wanted = distinct(rows.seq[last_rows])
    at = np.clip(np.searchsorted(wanted, rows.seq[coll]), 0, wanted.shape[0] - 1)
    near = coll[wanted[at] == rows.seq[coll]]
    pairs = np.stack([rows.group[near], rows.seq[near]], axis=1)
    unique, counts = np.unique(pairs, axis=0, return_counts=True)
    once = {
        (int(g), int(q))
        for (g, q), c in zip(unique.tolist(), counts.tolist(), strict=True)
        if c == 1
    }
    return [i for i in last_rows.tolist() if (int(rows.group[i]), int(rows.seq[i])) in once]


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
