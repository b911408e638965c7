"""Collective-hang analysis over flight-recorder rows: which rank(s) the job is waiting for, in which group and
collective, and why.

How the answer is reached
-------------------------
1. **Groups and members.** Entries are grouped by process-group *name* (`process_group[0]`, the same on every rank;
   `pg_id` is rank-local). Members come from `pg_ranks` (the dump's `pg_config`). Where that is broken (gloo keys it
   '' with ranks '[]', groups overwrite each other) membership is rebuilt from the entries: the ranks that recorded
   the group, plus every expected rank for the default group. Expected ranks are `expected_ranks`, else every rank
   named by a group, else 0..highest rank seen. Expected ranks with no dump are *missing dumps* (a SIGKILLed rank
   writes none): they are nodes of the wait graph below, and evidence.
2. **Per group, match by sequence id.** For each member: E = the highest `collective_seq_id` it entered, C = the
   highest it completed in order (everything below its first incomplete entry; `state == completed` or `retired`),
   S = the highest it started. p2p entries are matched separately, per pair of peers by `p2p_seq_id`.
   - E differs: the first divergent collective is min(E)+1; members at min(E) *never joined* it, members above
     wait for them.
   - else C differs: members at min(C) *joined and stalled* (they entered it, their peers completed it);
   - else S differs: members that have not started it while the others have are behind;
   - else every member entered the same last collective: none completed -> the whole group is stuck together.
   Each divergence is an edge "waiter -> laggard" of a wait-for graph over ranks (through one node per divergence,
   so a 16,384-rank group costs 16,384 edges, not 16,384^2).
3. **Causality across groups (root cause vs follow-ons).** In a job with tensor/data/expert/pipeline groups one
   stuck rank makes its peers wait in the group they share, and those peers make *their* peers wait in other
   groups, and so on. Each of those shows up as a divergence, but only ranks that wait on *nobody* are root
   causes: the culprits are the terminal strongly-connected components of the wait-for graph (nothing they wait
   on) that others wait on. A rank that lags in one group because it is itself waiting in another is a follow-on.
   A cycle (rank 2 waits for rank 3 in a sub-group while rank 3 waits for rank 2 in the world group) arises when
   one rank *skipped* a collective and went on to the next one. It is broken by program-order precedent: training
   loops interleave their groups periodically, so from a rank's own history the point where its next collective
   of group H was due (relative to its sequence in group K) is predicted; a rank that entered K beyond that point
   without H skipped H (root cause); one that is blocked in K before that point lags in H only because of K
   (follow-on). Its out-edges are dropped and the components recomputed.
4. **Mismatches.** At each (group, sequence id) the entries of all members are compared: op name, dtypes and, for
   ops whose shapes must agree (all_reduce, broadcast, reduce, all_gather, reduce_scatter, barrier), the input
   sizes. The ranks outside the majority are the odd ones (gloo even completes an all_reduce of equal element count
   but different shape; only the trace shows it).
5. **Root anomaly.** Among the culprits' divergences and the mismatches, the earliest in time (`time_created` of
   the collective) is the root cause; later ones are reported as follow-on evidence, never as culprits.

On the real NCCL set (tests/data/nccl-fr-gpu_error_2nd: 16 ranks, TP/DP/EP/PP groups, GPU errors on ranks 9 and 14):
in TENSOR_MODEL_PARALLEL_GROUP '37' ranks 8, 10, 11 entered up to 87771 while rank 9 stopped at 87760 (and never
completed 87749 onwards, which its peers did); '38' shows the same for rank 14; the expert, data and context groups
spanning ranks 8-15 show 9 and 14 behind as well; pipeline p2p shows stage-0 ranks (1, 6) ahead of 9 and 14.
Ranks 0-7 wait only through p2p and lag nowhere; ranks 8, 10-13, 15 lag nowhere. The terminal components are {9}
and {14}: exactly the two faulty ranks, never the ranks that merely wait on them.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from attribution._hang_kernels import combine_signatures, row_signatures


class HangVerdict(StrEnum):
    NO_HANG = "no_hang"
    NEVER_JOINED = "never_joined"
    STALLED = "stalled"
    SIZE_MISMATCH = "size_mismatch"
    OP_MISMATCH = "op_mismatch"
    MISSING_DUMPS = "missing_dumps"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class HangReport:
    verdict: HangVerdict
    culprit_ranks: tuple[int, ...]
    pg_id: str | None
    pg_name: str | None
    pg_desc: str | None
    collective_seq_id: int | None
    op: str | None
    never_joined: tuple[int, ...]
    stalled: tuple[int, ...]
    missing_dumps: tuple[int, ...]
    reason: str
    confidence: float
    evidence: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value, "culprit_ranks": list(self.culprit_ranks), "pg_id": self.pg_id,
            "pg_name": self.pg_name, "pg_desc": self.pg_desc, "collective_seq_id": self.collective_seq_id,
            "op": self.op, "never_joined": list(self.never_joined), "stalled": list(self.stalled),
            "missing_dumps": list(self.missing_dumps), "reason": self.reason, "confidence": self.confidence,
            "evidence": list(self.evidence),
        }


# ops whose input shapes must agree on every member (others: all_to_all, scatter/gather roots, coalesced, p2p)
_SHAPE_MUST_MATCH = re.compile(r":(all_reduce|allreduce|_allreduce_base|broadcast|reduce|all_gather|allgather|"
                               r"_all_gather_base|all_gather_into_tensor|reduce_scatter|_reduce_scatter_base|"
                               r"reduce_scatter_tensor|barrier)(_coalesced)?$")
_P2P_OP = re.compile(r"(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)")
COLUMNS = ("rank", "pg_id", "pg_name", "pg_desc", "pg_ranks", "record_id", "collective_seq_id", "p2p_seq_id",
           "is_p2p", "op", "state", "retired", "time_created", "input_sizes", "input_dtypes")
MAX_EVIDENCE = 24


# ---------------------------------------------------------------------------------------------------------------
# columns


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Dictionary codes (int32, -1 for null) and the dictionary values of a string-like column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    indices = column.indices
    codes = indices.to_numpy(zero_copy_only=False)
    if indices.null_count:
        codes = np.where(indices.is_null().to_numpy(zero_copy_only=False), -1, codes)
    return codes.astype(np.int32, copy=False), column.dictionary.to_pylist()


def _ints(column: pa.ChunkedArray, fill: int = -1) -> tuple[np.ndarray, np.ndarray]:
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = ~array.is_null().to_numpy(zero_copy_only=False) if array.null_count else np.ones(len(array), bool)
    values = array.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return values, valid


class _Lazy:
    """An int64 column read only at the rows asked for (time_created, record_id: needed for a few rows; a full
    copy of 33 M rows would cost 260 MB each)."""

    def __init__(self, table: pa.Table, name: str) -> None:
        self.column = table.column(name) if name in table.column_names else None

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows, np.int64)
        if self.column is None or rows.shape[0] == 0:
            return np.zeros(rows.shape[0], np.int64), np.zeros(rows.shape[0], bool)
        return _ints(self.column.take(pa.array(rows)))


def _bools(column: pa.ChunkedArray | None, n: int) -> np.ndarray:
    if column is None:
        return np.zeros(n, bool)
    return column.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


# ---------------------------------------------------------------------------------------------------------------
# the wait-for graph


@dataclass
class _Divergence:
    group: int  # group code
    level: str  # "entered", "completed", "started", "p2p", "missing"
    seq: int | None  # first divergent sequence id
    laggards: tuple[int, ...]
    waiters: tuple[int, ...]
    time: int  # time_created of the divergent collective (ns), for ordering
    op: str | None = None
    pg_id: str | None = None
    detail: str = ""


@dataclass
class _Mismatch:
    group: int
    seq: int
    kind: HangVerdict
    odd: tuple[int, ...]
    majority: tuple[int, ...]
    tie: bool
    time: int
    detail: str
    op: str | None
    pg_id: str | None


@dataclass
class _Analysis:
    group_names: list[str]
    group_descs: dict[int, str | None]
    members: dict[int, tuple[int, ...]]
    membership_rebuilt: set[int]
    dumped: set[int]
    expected: set[int]
    missing: set[int]
    divergences: list[_Divergence] = field(default_factory=list)
    mismatches: list[_Mismatch] = field(default_factory=list)
    stuck_groups: list[tuple[int, int, tuple[int, ...], int]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    history: Any = None  # rank -> (seqs, groups, index of first incomplete) in record order

    def label(self, group: int) -> str:
        name = self.group_names[group]
        desc = self.group_descs.get(group)
        return f"group {name!r}" + (f" ({desc})" if desc and desc != name else "")


def _ranks_text(ranks: Sequence[int], limit: int = 12) -> str:
    ranks = sorted(ranks)
    if len(ranks) <= limit:
        return ", ".join(map(str, ranks))
    return ", ".join(map(str, ranks[:limit])) + f", ... ({len(ranks)} ranks)"


def _strongly_connected(n_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    graph = csr_matrix((np.ones(src.shape[0], np.int8), (src, dst)), shape=(n_nodes, n_nodes))
    _, labels = connected_components(graph, directed=True, connection="strong")
    return labels


# ---------------------------------------------------------------------------------------------------------------
# analysis


def analyze_collectives(collectives: pa.Table, expected_ranks: Sequence[int] | None = None) -> HangReport:
    """Analyse one dump set's `collectives` rows (any number of ranks). See the module docstring."""
    missing_columns = [c for c in ("rank", "collective_seq_id") if c not in collectives.column_names]
    if missing_columns:
        raise ValueError(f"collectives table lacks column(s) {', '.join(missing_columns)}")
    table = collectives
    n = table.num_rows
    ranks_all = table.column("rank").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
    dumped = {int(r) for r in np.unique(ranks_all) if r >= 0}
    if not dumped:
        return _report_empty(expected_ranks)

    # -- groups
    if "pg_name" in table.column_names:
        name_codes, names = _codes(table.column("pg_name"))
    else:
        name_codes, names = np.full(n, -1, np.int32), []
    if "pg_id" in table.column_names:
        id_codes, ids = _codes(table.column("pg_id"))
    else:
        id_codes, ids = np.full(n, -1, np.int32), []
    names = [str(x) if x is not None else "" for x in names]
    empty_name = np.array([not x for x in names] + [True], bool)  # index -1 -> True
    use_id = (name_codes < 0) | empty_name[name_codes]
    group_names = list(names) + [f"pg_id {x}" for x in ids]
    group = np.where(use_id, np.where(id_codes >= 0, len(names) + id_codes, -1), name_codes).astype(np.int32)
    if "record_id" in table.column_names:
        # status rows (pg_status, record_id null) count only where the dump named their group
        status_row = table.column("record_id").is_null().to_numpy(zero_copy_only=False)
        group[status_row & use_id] = -1
    desc_codes, descs = (_codes(table.column("pg_desc")) if "pg_desc" in table.column_names
                         else (np.full(n, -1, np.int32), []))
    group_descs: dict[int, str | None] = {}
    has_desc = (group >= 0) & (desc_codes >= 0)
    if has_desc.any():
        pairs = pa.table({"g": group[has_desc], "d": desc_codes[has_desc]}).group_by("g").aggregate([("d", "min")])
        for g, d in zip(pairs.column("g").to_pylist(), pairs.column("d_min").to_pylist(), strict=True):
            group_descs[int(g)] = descs[int(d)]

    # -- membership
    configured: dict[int, Counter] = defaultdict(Counter)
    if "pg_ranks" in table.column_names:
        pg_ranks = table.column("pg_ranks")
        rows = np.nonzero(~pg_ranks.is_null().to_numpy(zero_copy_only=False) & (group >= 0))[0]
        if rows.shape[0]:
            values = pg_ranks.take(pa.array(rows)).to_pylist()
            for row, value in zip(rows, values, strict=True):
                if value:
                    configured[int(group[row])][tuple(sorted(int(v) for v in value))] += 1
    seen: dict[int, set[int]] = defaultdict(set)
    if (group >= 0).any():
        pairs = pa.table({"g": group[group >= 0], "r": ranks_all[group >= 0]}).group_by(["g", "r"]).aggregate([])
        for g, r in zip(pairs.column("g").to_pylist(), pairs.column("r").to_pylist(), strict=True):
            seen[int(g)].add(int(r))
    expected = set(int(r) for r in expected_ranks) if expected_ranks is not None else set()
    if expected_ranks is None:
        for counter in configured.values():
            for ranks in counter:
                expected.update(ranks)
        expected.update(range(max(max(dumped), max(expected, default=0)) + 1))
    members: dict[int, tuple[int, ...]] = {}
    rebuilt: set[int] = set()
    for g in set(seen) | set(configured):
        if configured.get(g):
            ranks = set()
            for value in configured[g]:
                ranks.update(value)
            if group_descs.get(g) == "default_pg":
                ranks |= expected
            members[g] = tuple(sorted(ranks | seen[g]))
        else:
            ranks = set(seen[g])
            if group_descs.get(g) == "default_pg":
                ranks |= expected
            members[g] = tuple(sorted(ranks))
            rebuilt.add(g)
    missing = expected - dumped
    analysis = _Analysis(group_names, group_descs, members, rebuilt, dumped, expected, missing)
    if rebuilt:
        shown = [analysis.label(g) + f": [{_ranks_text(members[g])}]" for g in sorted(rebuilt)][:6]
        analysis.evidence.append("pg_config unusable for " + ", ".join(shown)
                                 + " - membership rebuilt from the entries")
    if missing:
        analysis.evidence.append(f"no dump from rank(s) {_ranks_text(sorted(missing))} (expected "
                                 f"{len(expected)} ranks, read {len(dumped)})")

    # -- entry rows
    if "record_id" in table.column_names:
        is_entry = ~table.column("record_id").is_null().to_numpy(zero_copy_only=False)
    else:
        is_entry = np.ones(n, bool)
    seq, seq_valid = _ints(table.column("collective_seq_id"))
    is_p2p = _bools(table.column("is_p2p") if "is_p2p" in table.column_names else None, n)
    op_codes, ops = (_codes(table.column("op")) if "op" in table.column_names else (np.full(n, -1, np.int32), []))
    p2p_op = np.array([bool(_P2P_OP.search(str(o))) for o in ops] + [False], bool)
    is_p2p = is_p2p | p2p_op[op_codes]
    state_codes, states = (_codes(table.column("state")) if "state" in table.column_names
                           else (np.full(n, -1, np.int32), []))
    state_rank = np.array([{"scheduled": 0, "started": 1, "completed": 2}.get(str(s), 0) for s in states] + [0],
                          np.int8)[state_codes]
    retired = _bools(table.column("retired") if "retired" in table.column_names else None, n)
    complete = (state_rank == 2) | retired
    started = state_rank >= 1
    times = _Lazy(table, "time_created")
    order = _Lazy(table, "record_id")

    coll = is_entry & seq_valid & ~is_p2p & (group >= 0)
    rows = np.nonzero(coll)[0]
    c_group, c_rank, c_seq = group[rows], ranks_all[rows], seq[rows]
    c_complete, c_started = complete[rows], started[rows]

    # per (group, rank): E, C, S
    per = pa.table({
        "g": c_group, "r": c_rank, "s": c_seq,
        "s_incomplete": pa.array(c_seq, mask=c_complete),
        "s_started": pa.array(c_seq, mask=~c_started),
    })
    agg = per.group_by(["g", "r"]).aggregate([("s", "max"), ("s_incomplete", "min"), ("s_started", "max")])
    del per
    g_arr = agg.column("g").to_numpy()
    r_arr = agg.column("r").to_numpy()
    e_arr = agg.column("s_max").to_numpy()
    first_inc = agg.column("s_incomplete_min").fill_null(np.iinfo(np.int64).max).to_numpy()
    c_arr = np.where(first_inc == np.iinfo(np.int64).max, e_arr, first_inc - 1)
    s_arr = agg.column("s_started_max").fill_null(-1).to_numpy()
    has_incomplete = first_inc != np.iinfo(np.int64).max
    progress: dict[int, dict[int, tuple[int, int, int, bool]]] = defaultdict(dict)
    for g, r, e, c, s, inc in zip(g_arr.tolist(), r_arr.tolist(), e_arr.tolist(), c_arr.tolist(), s_arr.tolist(),
                                  has_incomplete.tolist(), strict=True):
        progress[g][r] = (e, c, s, inc)

    # time of (group, seq) collectives, to order anomalies; built lazily for the few keys needed
    def seq_time(g: int, s: int, among: Sequence[int] | None = None) -> tuple[int, str | None, str | None]:
        mask = (c_group == g) & (c_seq == s)
        if among is not None:
            mask &= np.isin(c_rank, np.asarray(among))
        hits = rows[mask]
        if hits.shape[0] == 0:
            return np.iinfo(np.int64).max, None, None
        created, created_valid = times.at(hits)
        t = int(created[created_valid].min()) if created_valid.any() else np.iinfo(np.int64).max
        op = Counter(int(op_codes[h]) for h in hits[:64]).most_common(1)[0][0]
        pid = Counter(int(id_codes[h]) for h in hits[:64]).most_common(1)[0][0]
        return t, (ops[op] if op >= 0 else None), (str(ids[pid]) if pid >= 0 else None)

    # -- divergences per group
    for g, by_rank in progress.items():
        group_members = members.get(g, tuple(by_rank))
        present = [r for r in group_members if r in by_rank]
        absent_dumped = [r for r in group_members if r not in by_rank and r in dumped]
        absent_missing = [r for r in group_members if r in missing]
        if not present:
            continue
        e_values = {r: by_rank[r][0] for r in present}
        for r in absent_dumped:
            # a dumped member with no entry of this group: it has not entered anything the dump still holds
            e_values[r] = min(e_values.values()) - 1 if len(present) else -1
        e_min, e_max = min(e_values.values()), max(e_values.values())
        if e_min < e_max:
            laggards = tuple(sorted(r for r, e in e_values.items() if e == e_min))
            waiters = tuple(sorted(r for r, e in e_values.items() if e > e_min))
            t, op, pid = seq_time(g, e_min + 1, waiters)
            analysis.divergences.append(_Divergence(
                g, "entered", e_min + 1, laggards, waiters, t, op, pid,
                f"{analysis.label(g)} seq {e_min + 1} {op or ''}: rank(s) {_ranks_text(waiters)} entered it, "
                f"rank(s) {_ranks_text(laggards)} never did (last entered: {e_min})"))
        else:
            c_values = {r: by_rank[r][1] for r in present}
            c_min, c_max = min(c_values.values()), max(c_values.values())
            s_values = {r: by_rank[r][2] for r in present}
            s_min, s_max = min(s_values.values()), max(s_values.values())
            if c_min < c_max:
                laggards = tuple(sorted(r for r, c in c_values.items() if c == c_min))
                waiters = tuple(sorted(r for r, c in c_values.items() if c > c_min))
                t, op, pid = seq_time(g, c_min + 1)
                analysis.divergences.append(_Divergence(
                    g, "completed", c_min + 1, laggards, waiters, t, op, pid,
                    f"{analysis.label(g)} seq {c_min + 1} {op or ''}: rank(s) {_ranks_text(laggards)} entered it "
                    f"but never completed it; rank(s) {_ranks_text(waiters)} did"))
            elif s_min < s_max and s_min < e_max:
                laggards = tuple(sorted(r for r, s in s_values.items() if s == s_min))
                waiters = tuple(sorted(r for r, s in s_values.items() if s > s_min))
                t, op, pid = seq_time(g, s_min + 1)
                analysis.divergences.append(_Divergence(
                    g, "started", s_min + 1, laggards, waiters, t, op, pid,
                    f"{analysis.label(g)} seq {s_min + 1} {op or ''}: started on rank(s) {_ranks_text(waiters)}, "
                    f"not on rank(s) {_ranks_text(laggards)}"))
            elif any(by_rank[r][3] for r in present) and not absent_missing:
                stuck = tuple(sorted(r for r in present if by_rank[r][3]))
                analysis.stuck_groups.append((g, c_min + 1, stuck, int(seq_time(g, c_min + 1)[0])))
        if absent_missing:
            waiting = tuple(sorted(r for r in present if by_rank[r][3]))
            if waiting:
                t, op, pid = seq_time(g, min(by_rank[r][1] for r in waiting) + 1, waiting)
                analysis.divergences.append(_Divergence(
                    g, "missing", min(by_rank[r][1] for r in waiting) + 1, tuple(absent_missing), waiting, t, op,
                    pid, f"{analysis.label(g)}: rank(s) {_ranks_text(waiting)} wait in {op or 'a collective'} "
                    f"that needs rank(s) {_ranks_text(absent_missing)}, which wrote no dump"))

    # -- p2p, per pair of peers
    _p2p_divergences(analysis, is_entry, is_p2p, group, ranks_all, op_codes, ops, table, complete, times)

    # -- mismatches
    _find_mismatches(analysis, table, rows, c_group, c_rank, c_seq, op_codes, ops, times, id_codes, ids)

    def history(rank: int) -> tuple[list[int], list[int], int | None] | None:
        mine = np.nonzero(c_rank == rank)[0]
        if mine.shape[0] == 0:
            return None
        mine = mine[np.argsort(order.at(rows[mine])[0], kind="stable")]
        incomplete = np.nonzero(~c_complete[mine])[0]
        return (c_seq[mine].tolist(), c_group[mine].tolist(),
                int(incomplete[0]) if incomplete.shape[0] else None)

    analysis.history = history
    return _decide(analysis)


def _p2p_divergences(analysis: _Analysis, is_entry: np.ndarray, is_p2p: np.ndarray, group: np.ndarray,
                     ranks_all: np.ndarray, op_codes: np.ndarray, ops: list[Any], table: pa.Table,
                     complete: np.ndarray, times: _Lazy) -> None:
    if "p2p_seq_id" not in table.column_names:
        return
    rows = np.nonzero(is_entry & is_p2p & (group >= 0))[0]
    if rows.shape[0] == 0:
        return
    p2p_seq, p2p_valid = _ints(table.column("p2p_seq_id").take(pa.array(rows)))
    created, created_valid = times.at(rows)
    parsed: dict[int, tuple[int, int] | None] = {}
    for code in np.unique(op_codes[rows]):
        match = _P2P_OP.search(str(ops[code])) if code >= 0 else None
        if not match:
            parsed[int(code)] = None
            continue
        kind, a, arrow, b = match.group(1), int(match.group(2)), match.group(3), int(match.group(4))
        # 'send 0->1': self 0, peer 1; 'recv 1<-0': self 1, peer 0 (group-local ranks)
        del kind, arrow
        parsed[int(code)] = (a, b)
    best: dict[tuple[int, int, int], tuple[int, bool, int]] = {}
    peers: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i, row in enumerate(rows.tolist()):
        pair = parsed.get(int(op_codes[row]))
        if pair is None or not p2p_valid[i]:
            continue
        g = int(group[row])
        members = analysis.members.get(g, ())
        _self_local, peer_local = pair
        if peer_local >= len(members):
            continue
        peer = members[peer_local]
        rank = int(ranks_all[row])
        peers[(g, rank)].add(peer)
        key = (g, rank, peer)
        value = (int(p2p_seq[i]), bool(complete[row]), int(created[i]) if created_valid[i] else 0)
        if key not in best or value[0] > best[key][0]:
            best[key] = (value[0], value[1] and best.get(key, (0, True, 0))[1], value[2])
        elif not value[1]:
            best[key] = (best[key][0], False, best[key][2])
    for (g, a, b), (seq_a, done_a, t_a) in best.items():
        if len(peers[(g, a)]) != 1:
            continue
        if b in analysis.missing:
            if not done_a:
                analysis.divergences.append(_Divergence(
                    g, "missing", seq_a, (b,), (a,), t_a, None, None,
                    f"{analysis.label(g)} p2p: rank {a} waits on rank {b}, which wrote no dump"))
            continue
        if b not in analysis.dumped or len(peers.get((g, b), ())) > 1:
            continue
        seq_b = best.get((g, b, a), (-1, True, 0))[0]
        if seq_a > seq_b and not done_a:
            analysis.divergences.append(_Divergence(
                g, "p2p", seq_b + 1, (b,), (a,), t_a, None, None,
                f"{analysis.label(g)} p2p: rank {a} posted p2p op {seq_a} with rank {b}, which is at {seq_b}"))


def _find_mismatches(analysis: _Analysis, table: pa.Table, rows: np.ndarray, c_group: np.ndarray,
                     c_rank: np.ndarray, c_seq: np.ndarray, op_codes: np.ndarray, ops: list[Any],
                     times: _Lazy, id_codes: np.ndarray, ids: list[Any]) -> None:
    if rows.shape[0] == 0:
        return
    shape_ops = np.array([bool(_SHAPE_MUST_MATCH.search(str(o))) for o in ops] + [False], bool)
    c_ops = op_codes[rows]
    sizes = table.column("input_sizes") if "input_sizes" in table.column_names else None
    dtypes = table.column("input_dtypes") if "input_dtypes" in table.column_names else None
    size_sig, dtype_sig = row_signatures(sizes, dtypes, rows)
    size_sig = np.where(shape_ops[c_ops], size_sig, np.uint64(0))
    op_sig = c_ops.astype(np.uint64)
    combined = combine_signatures(op_sig, size_sig, dtype_sig)
    keyed = pa.table({"g": c_group, "s": c_seq, "sig": combined})
    agg = keyed.group_by(["g", "s"]).aggregate([("sig", "min"), ("sig", "max")])
    del keyed, combined
    differ = pc.not_equal(agg.column("sig_min"), agg.column("sig_max")).to_numpy(zero_copy_only=False)
    if not differ.any():
        return
    bad_g = agg.column("g").to_numpy()[differ]
    bad_s = agg.column("s").to_numpy()[differ]
    for g, s in list(zip(bad_g.tolist(), bad_s.tolist(), strict=True))[:256]:
        hit = np.nonzero((c_group == g) & (c_seq == s))[0]
        signature: dict[int, tuple[int, int, int]] = {}
        for h in hit.tolist():
            signature.setdefault(int(c_rank[h]), (int(op_sig[h]), int(size_sig[h]), int(dtype_sig[h])))
        counts = Counter(signature.values())
        ranked = counts.most_common()
        top = ranked[0][1]
        tie = len(ranked) > 1 and ranked[1][1] == top
        majority_sig = ranked[0][0] if not tie else min(
            (sig for sig, c in ranked if c == top),
            key=lambda sig: min(r for r, v in signature.items() if v == sig))
        odd = tuple(sorted(r for r, v in signature.items() if v != majority_sig))
        majority = tuple(sorted(r for r, v in signature.items() if v == majority_sig))
        ops_seen = {v[0] for v in signature.values()}
        kind = HangVerdict.OP_MISMATCH if len(ops_seen) > 1 else HangVerdict.SIZE_MISMATCH
        rows_hit = rows[hit]
        created, created_valid = times.at(rows_hit)
        t = int(created[created_valid].min()) if created_valid.any() else np.iinfo(np.int64).max
        describe = _describe_entries(table, rows_hit, c_rank[hit], ops, op_codes)
        op = ops[majority_sig[0]] if majority_sig[0] < len(ops) else None
        pid_counter = Counter(int(id_codes[r]) for r in rows_hit[:64])
        pid_code = pid_counter.most_common(1)[0][0]
        what = "op" if kind == HangVerdict.OP_MISMATCH else "size/dtype"
        detail = (f"{analysis.label(g)} seq {s}: {what} mismatch, rank(s) {_ranks_text(odd)} differ from "
                  f"rank(s) {_ranks_text(majority)}{' (a tie)' if tie else ''}: {describe}")
        analysis.mismatches.append(_Mismatch(g, s, kind, odd, majority, tie, t, detail, op,
                                             str(ids[pid_code]) if pid_code >= 0 else None))


def _describe_entries(table: pa.Table, rows: np.ndarray, ranks: np.ndarray, ops: list[Any],
                      op_codes: np.ndarray) -> str:
    parts = []
    shown: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    sizes = table.column("input_sizes").take(pa.array(rows)).to_pylist() if "input_sizes" in table.column_names \
        else [None] * len(rows)
    dtypes = table.column("input_dtypes").take(pa.array(rows)).to_pylist() \
        if "input_dtypes" in table.column_names else [None] * len(rows)
    for i, row in enumerate(rows.tolist()):
        op = ops[op_codes[row]] if op_codes[row] >= 0 else None
        shown[(op, repr(sizes[i]) + " " + repr(dtypes[i]))].append(int(ranks[i]))
    for (op, what), who in list(shown.items())[:4]:
        parts.append(f"{op} {what} on rank(s) {_ranks_text(sorted(set(who)), 6)}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# deciding


def _decide(analysis: _Analysis) -> HangReport:
    divergences = analysis.divergences
    evidence = list(analysis.evidence)
    # wait-for graph: rank nodes, then one node per divergence
    rank_nodes = sorted(analysis.dumped | analysis.missing)
    node_of = {r: i for i, r in enumerate(rank_nodes)}
    n_ranks = len(rank_nodes)

    def build(dropped: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src: list[int] = []
        dst: list[int] = []
        for i, d in enumerate(divergences):
            hub = n_ranks + i
            for w in d.waiters:
                if w not in dropped:
                    src.append(node_of[w])
                    dst.append(hub)
            for lag in d.laggards:
                src.append(hub)
                dst.append(node_of[lag])
        src_a, dst_a = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        labels = _strongly_connected(n_ranks + len(divergences), src_a, dst_a)
        return src_a, dst_a, labels

    skippers: dict[int, str] = {}
    culprits: list[int] = []
    unresolved_cycle = False
    if divergences:
        src, dst, labels = build(set())
        culprits, cyclic = _terminal_ranks(n_ranks, src, dst, labels, rank_nodes)
        laggards = {lag for d in divergences for lag in d.laggards}
        component_size = Counter(labels[:n_ranks].tolist())
        in_cycle = {rank_nodes[i] for i in range(n_ranks) if component_size[int(labels[i])] > 1}
        # ranks of a cycle (each lags somewhere while waiting elsewhere): which one skipped (root), which are only
        # blocked (follow-ons)?
        candidates = sorted((laggards & in_cycle) - analysis.missing)[:64]
        for rank in candidates:
            verdict = _skipped(analysis, rank, divergences)
            if verdict:
                skippers[rank] = verdict
        if skippers:
            src, dst, labels = build(set(skippers))
            culprits, cyclic = _terminal_ranks(n_ranks, src, dst, labels, rank_nodes)
            evidence.extend(skippers.values())
        unresolved_cycle = cyclic

    # the root anomaly: earliest of the culprits' divergences and the mismatches
    culprit_divs = [d for d in divergences if set(d.laggards) & set(culprits)]
    level_rank = {"entered": 0, "completed": 1, "started": 2, "missing": 3, "p2p": 4}
    # headline: a collective (not p2p) divergence, covering the most culprits, earliest
    first_div = min(culprit_divs, key=lambda d: (d.level == "p2p", -len(set(d.laggards) & set(culprits)), d.time,
                                                 level_rank[d.level]), default=None)
    first_mismatch = min(analysis.mismatches, key=lambda m: (m.time, m.tie), default=None)
    root_is_mismatch = first_mismatch is not None and (first_div is None or first_mismatch.time <= first_div.time)

    follow_ons = [d for d in divergences if d not in culprit_divs]
    for d in sorted(culprit_divs, key=lambda d: d.time)[:MAX_EVIDENCE]:
        evidence.append(d.detail)
    for d in sorted(follow_ons, key=lambda d: d.time)[:MAX_EVIDENCE]:
        evidence.append("follow-on: " + d.detail)
    for m in sorted(analysis.mismatches, key=lambda m: m.time)[:MAX_EVIDENCE]:
        prefix = "" if root_is_mismatch and m is first_mismatch else "follow-on: "
        evidence.append(prefix + m.detail)

    missing = tuple(sorted(analysis.missing))
    if root_is_mismatch:
        m = first_mismatch
        odd = m.odd
        confidence = 0.95 if len(m.majority) >= 2 * len(m.odd) else 0.8
        if m.tie:
            # no majority: the side the wait-for graph already blames (it lagged: it skipped), else both sides
            involved = set(m.odd) | set(m.majority)
            blamed = involved & set(culprits)
            odd, confidence = (tuple(sorted(blamed)), 0.75) if blamed else (tuple(sorted(involved)), 0.4)
        return HangReport(
            verdict=m.kind, culprit_ranks=odd, pg_id=m.pg_id, pg_name=analysis.group_names[m.group],
            pg_desc=analysis.group_descs.get(m.group), collective_seq_id=m.seq, op=m.op, never_joined=(),
            stalled=(), missing_dumps=missing,
            reason=m.detail, confidence=confidence, evidence=tuple(evidence))
    if culprits:
        d = first_div
        culprit_set = set(culprits)
        never = sorted(r for r in culprits if any(r in x.laggards and x.level in ("entered", "p2p", "missing")
                                                  for x in culprit_divs))
        stalled = sorted(r for r in culprits if r not in never and r not in analysis.missing)
        if culprit_set & analysis.missing:
            verdict = HangVerdict.MISSING_DUMPS
        elif never:
            verdict = HangVerdict.NEVER_JOINED
        else:
            verdict = HangVerdict.STALLED
        groups_per_culprit = Counter(r for x in culprit_divs for r in set(x.laggards) & culprit_set)
        if unresolved_cycle:
            confidence = 0.5
        elif skippers:
            confidence = 0.8
        else:
            confidence = 0.95 if min(groups_per_culprit.values()) >= 2 else 0.85
        waiting = sorted({w for x in divergences for w in x.waiters} - culprit_set)
        reason = (f"rank(s) {_ranks_text(culprits)} {_verdict_phrase(verdict)}: {d.detail}"
                  + (f"; {len(waiting)} other rank(s) wait on them (follow-ons)" if waiting else ""))
        if unresolved_cycle:
            reason += "; the ranks wait on each other (a cycle no history could order)"
        return HangReport(
            verdict=verdict, culprit_ranks=tuple(culprits), pg_id=d.pg_id, pg_name=analysis.group_names[d.group],
            pg_desc=analysis.group_descs.get(d.group), collective_seq_id=d.seq, op=d.op,
            never_joined=tuple(r for r in never if r not in analysis.missing),
            stalled=tuple(stalled), missing_dumps=missing, reason=reason, confidence=confidence,
            evidence=tuple(evidence))
    if missing:
        return HangReport(
            verdict=HangVerdict.MISSING_DUMPS, culprit_ranks=missing, pg_id=None, pg_name=None, pg_desc=None,
            collective_seq_id=None, op=None, never_joined=(), stalled=(), missing_dumps=missing,
            reason=f"no dump from rank(s) {_ranks_text(missing)}; the ranks that dumped agree with each other, so "
                   "the missing rank(s) (killed, or dead before the dump) are the likely cause",
            confidence=0.7, evidence=tuple(evidence))
    if analysis.stuck_groups:
        g, seq, stuck, _t = min(analysis.stuck_groups, key=lambda x: x[3])
        evidence.append(f"{analysis.label(g)} seq {seq}: every member entered it and none completed it")
        return HangReport(
            verdict=HangVerdict.STALLED, culprit_ranks=(), pg_id=None, pg_name=analysis.group_names[g],
            pg_desc=analysis.group_descs.get(g), collective_seq_id=seq, op=None, never_joined=(),
            stalled=stuck, missing_dumps=(),
            reason=f"{analysis.label(g)} seq {seq}: all {len(stuck)} members joined and none completed; no rank "
                   "lags in the trace (fabric, or a peer outside these dumps)",
            confidence=0.4, evidence=tuple(evidence))
    return HangReport(
        verdict=HangVerdict.NO_HANG, culprit_ranks=(), pg_id=None, pg_name=None, pg_desc=None,
        collective_seq_id=None, op=None, never_joined=(), stalled=(), missing_dumps=(),
        reason=f"all {len(analysis.dumped)} dumps agree: every group's members reached and completed the same "
               "collectives, with matching ops and sizes",
        confidence=0.8, evidence=tuple(evidence))


def _verdict_phrase(verdict: HangVerdict) -> str:
    return {HangVerdict.NEVER_JOINED: "never joined the collective their peers wait in",
            HangVerdict.STALLED: "joined the collective but did not complete it while their peers did",
            HangVerdict.MISSING_DUMPS: "wrote no dump and their peers wait on them"}.get(verdict, "lag")


def _terminal_ranks(n_ranks: int, src: np.ndarray, dst: np.ndarray, labels: np.ndarray,
                    rank_nodes: list[int]) -> tuple[list[int], bool]:
    """Ranks in terminal strongly-connected components that someone waits on; and whether such a component holds
    more than one rank (a cycle)."""
    if src.shape[0] == 0:
        return [], False
    crossing = labels[src] != labels[dst]
    has_exit = set(labels[src[crossing]].tolist())
    waited_on = set(dst[dst < n_ranks].tolist())
    members_of: dict[int, list[int]] = defaultdict(list)
    for node in range(n_ranks):
        members_of[int(labels[node])].append(node)
    culprits: list[int] = []
    cyclic = False
    for label, nodes in members_of.items():
        if label in has_exit:
            continue
        if not any(node in waited_on for node in nodes):
            continue
        if len(nodes) > 1:
            cyclic = True
        culprits.extend(rank_nodes[node] for node in nodes)
    return sorted(culprits), cyclic


def _skipped(analysis: _Analysis, rank: int, divergences: list[_Divergence]) -> str | None:
    """Program-order precedent: did `rank` skip a collective of a group it lags in? Returns the evidence text, or
    None when its lag is explained by where it is blocked (or history cannot tell)."""
    history = analysis.history(rank) if analysis.history else None
    if history is None:
        return None
    seqs, groups_in_order, incomplete_at = history
    if incomplete_at is None:
        # dumps taken after the timeout mark everything retired: the rank waits where it is ahead of its peers,
        # its latest entry in such a group
        ahead = {d.group for d in divergences if rank in d.waiters}
        hits = [i for i, g in enumerate(groups_in_order) if g in ahead]
        if not hits:
            return None
        incomplete_at = hits[-1]
    blocked_group, blocked_seq = groups_in_order[incomplete_at], seqs[incomplete_at]
    for d in divergences:
        if rank not in d.laggards or d.level != "entered" or d.group == blocked_group:
            continue
        lag_group, due_seq = d.group, d.seq
        # K-count (blocked group's seq) at each entry of the lagging group H, in this rank's order
        k_count = -1
        points: list[tuple[int, int]] = []  # (H seq, K seq entered before it)
        for i in range(len(seqs)):
            if groups_in_order[i] == blocked_group:
                k_count = seqs[i]
            elif groups_in_order[i] == lag_group:
                points.append((seqs[i], k_count))
        if len(points) < 3 or points[-1][0] != due_seq - 1:
            continue
        predicted = _predict(points, due_seq)
        if predicted is None:
            continue
        if blocked_seq > predicted:
            return (f"rank {rank} skipped {analysis.label(lag_group)} seq {due_seq}: its own history puts that "
                    f"collective before {analysis.label(blocked_group)} seq {predicted + 1}, yet it entered "
                    f"{analysis.group_names[blocked_group]!r} seq {blocked_seq} without it")
    return None


def _predict(points: list[tuple[int, int]], due_seq: int) -> int | None:
    """K-count at which H seq `due_seq` was due, if the history of (H seq, K count) pairs is periodic."""
    by_seq = dict(points)
    for period in range(1, 17):
        if len(points) < period + 2:
            break
        diffs = []
        for h_seq, k in points[-(8 * period):]:
            before = by_seq.get(h_seq - period)
            if before is None or k < 0 or before < 0:
                continue
            diffs.append(k - before)
        if len(diffs) >= 2 and len(set(diffs)) == 1:
            base = by_seq.get(due_seq - period)
            if base is None or base < 0:
                return None
            return base + diffs[0]
    return None


def _report_empty(expected_ranks: Sequence[int] | None) -> HangReport:
    missing = tuple(sorted(int(r) for r in expected_ranks)) if expected_ranks else ()
    return HangReport(
        verdict=HangVerdict.MISSING_DUMPS if missing else HangVerdict.UNKNOWN, culprit_ranks=(), pg_id=None,
        pg_name=None, pg_desc=None, collective_seq_id=None, op=None, never_joined=(), stalled=(),
        missing_dumps=missing, reason="no flight-recorder rows to analyse", confidence=0.0, evidence=())
