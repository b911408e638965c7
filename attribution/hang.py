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
3. **Independent roots (root causes vs follow-ons).** In a job with tensor/data/expert/pipeline groups one stuck
   rank makes its peers wait in the group they share, and those peers make *their* peers wait in other groups.
   Each of those shows up as a divergence, but only ranks that wait on *nobody* are root causes: every terminal
   strongly-connected component of the wait-for graph (nothing it waits on) that others wait on is a root, with
   its own group, collective, evidence chain and the ranks that wait on it (reverse reachability), however far
   apart in time the roots are. Follow-ons are exactly the ranks that reach a root. A rank that joined a
   collective its own group's peers completed (stalled inside it) is a root whatever it waits on elsewhere (its
   later, enqueued work waits behind the stall); its out-edges are dropped.
   Stacks (collectors/pystack.py, py-spy): a rank blocked in a send/recv gloo does not record waits on its peer:
   one more edge. A stuck rank's frame is evidence ("rank 3 is in DataLoader.__next__").
4. **Cycles.** A cycle (rank 2 waits for rank 3 in a sub-group while rank 3 waits for rank 2 in the world group)
   arises when one rank *skipped* a collective, or ran two in another order. Broken first by each rank's own
   cross-group entry order (record order): for a cycle member that lags in group G at seq k, the collectives it
   entered after its last G entry are compared with the order in which the ranks outside the cycle entered the
   same collectives (in the groups of the same part: same desc and size, e.g. the other TP groups): if they
   entered G's seq k first, the member went past it - it skipped (root). No periodic history is needed. Then by
   program-order prediction where the member's own history is periodic (the point where its next collective of
   group H was due relative to its sequence in group K). A skipper's out-edges are dropped and the components
   recomputed. A cycle nothing can order is reported whole, kind `cycle`, confidence 0.5 (below the policy's
   threshold: never a failover).
5. **Mismatches.** At each (group, sequence id) the entries of all members are compared: op name, dtypes and, for
   ops whose shapes must agree (all_reduce, broadcast, reduce, all_gather, reduce_scatter, barrier), the input
   sizes. The ranks outside the majority are the odd ones (gloo even completes an all_reduce of equal element count
   but different shape; only the trace shows it). A mismatch is its own root, or evidence of the root its odd
   ranks belong to (the root's headline when earlier than its divergence); a tie is decided by the roots the graph
   found; a follow-on only when its odd ranks were already waiting on a root when they made it.
6. **Kinds** (HangRoot.kind; the report's `verdict` keeps the coarse family): never_joined, stuck_outside (never
   joined and inside no collective: every entry it recorded completed, or its stack is in user code), skipped,
   stalled, size_mismatch, op_mismatch, missing_dumps, cycle. Confidence: the lowest of the roots'.

On the real NCCL set (tests/data/nccl-fr-gpu_error_2nd: 16 ranks, TP/DP/EP/PP groups, GPU errors on ranks 9 and 14):
in TENSOR_MODEL_PARALLEL_GROUP '37' ranks 8, 10, 11 entered up to 87771 while rank 9 stopped at 87760 (and never
completed 87749 onwards, which its peers did); '38' shows the same for rank 14; the expert, data and context groups
spanning ranks 8-15 show 9 and 14 behind as well; pipeline p2p shows stage-0 ranks (1, 6) ahead of 9 and 14.
Ranks 0-7 wait only through p2p and lag nowhere; ranks 8, 10-13, 15 lag nowhere. The terminal components are {9}
and {14}: exactly the two faulty ranks, never the ranks that merely wait on them. On the real gloo sub-group hang
(tests: torch_artifacts 'subgroup_hang'), rank 2 waits for rank 3 in the pair group while ranks 0, 1, 3 wait for
rank 2 in the world group: a cycle {2, 3}; rank 3's history (pair collective k after world collective k) shows it
entered world seq 5 where pair seq 4 was due, so rank 3 is the skipper and rank 2 a follow-on. The hang corpus
(tests/torch_jobs/hang_corpus: 23 real 8-rank gloo dump sets) and bench/bench_hang_accuracy.py measure the rest.

Scale: the table is read in slices (SLICE_ROWS); pass 1 keeps only per-(group, rank) progress and per-(group, seq)
signature extremes, pass 2 fetches the rows of the few keys that need detail. 16,384 ranks x 2,000 entries is
~33 M rows; see bench/bench_hang.py.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from faultlens.attribution._hang_kernels import combine_signatures, row_signatures


class HangVerdict(StrEnum):
    NO_HANG = "no_hang"
    NEVER_JOINED = "never_joined"
    STALLED = "stalled"
    SIZE_MISMATCH = "size_mismatch"
    OP_MISMATCH = "op_mismatch"
    MISSING_DUMPS = "missing_dumps"
    STUCK_OUTSIDE = "stuck_outside"  # never joined, and inside no collective at all (a root's kind only)
    SKIPPED = "skipped"  # left the collective out and went on (a root's kind only)
    CYCLE = "cycle"  # waits on the others of a cycle nothing could order (a root's kind only)
    UNKNOWN = "unknown"


#: the coarse report-level family of each root kind (report.verdict keeps the families the decision rules know)
_FAMILY = {HangVerdict.STUCK_OUTSIDE: HangVerdict.NEVER_JOINED, HangVerdict.SKIPPED: HangVerdict.NEVER_JOINED,
           HangVerdict.CYCLE: HangVerdict.NEVER_JOINED}


@dataclass(frozen=True)
class HangRoot:
    """One independent root cause: the ranks that others wait on (directly or through other ranks), what they
    did, where, and who waits on them."""

    kind: HangVerdict
    ranks: tuple[int, ...]
    kinds: tuple[tuple[int, str], ...]  # per rank: its own kind (a root of two ranks may mix them)
    pg_id: str | None
    pg_name: str | None
    pg_desc: str | None
    collective_seq_id: int | None
    op: str | None
    waiting_ranks: tuple[int, ...]  # every rank whose lag is explained by waiting on this root
    where: tuple[str, ...]  # per rank, where its Python stack says it is (when stacks were given)
    confidence: float
    reason: str
    evidence: tuple[str, ...]  # the chain: the root's own divergences first, then the ranks waiting on it

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "ranks": list(self.ranks), "kinds": {str(r): k for r, k in self.kinds},
                "pg_id": self.pg_id, "pg_name": self.pg_name, "pg_desc": self.pg_desc,
                "collective_seq_id": self.collective_seq_id, "op": self.op,
                "waiting_ranks": list(self.waiting_ranks), "where": list(self.where),
                "confidence": self.confidence, "reason": self.reason, "evidence": list(self.evidence)}


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
    roots: tuple[HangRoot, ...] = ()  # every independent root; the fields above describe roots[0] (the headline)
    follow_ons: tuple[int, ...] = ()  # ranks whose lag is explained by waiting on a root
    unresolved_cycle: bool = False  # a cycle no information could order was reported whole (low confidence)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value, "culprit_ranks": list(self.culprit_ranks), "pg_id": self.pg_id,
            "pg_name": self.pg_name, "pg_desc": self.pg_desc, "collective_seq_id": self.collective_seq_id,
            "op": self.op, "never_joined": list(self.never_joined), "stalled": list(self.stalled),
            "missing_dumps": list(self.missing_dumps), "reason": self.reason, "confidence": self.confidence,
            "evidence": list(self.evidence), "roots": [r.to_dict() for r in self.roots],
            "follow_ons": list(self.follow_ons), "unresolved_cycle": self.unresolved_cycle,
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


def _ints(column: pa.ChunkedArray, fill: int = -1) -> tuple[np.ndarray, np.ndarray]:
    if pa.types.is_timestamp(column.type):  # ns since the epoch, whatever the store's unit
        column = column.cast(pa.timestamp("ns", tz=column.type.tz)).cast(pa.int64())
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
    incomplete: set[int] = field(default_factory=set)  # ranks with an entry not completed (inside a collective)
    where: dict[int, Any] = field(default_factory=dict)  # rank -> faultlens.collectors.pystack.Whereabouts, from stacks
    key_rows: Any = None  # (due key, later keys) -> {key: {rank: (record of due, record of key)}}
    device_states: bool = False  # entries carry 'started'/'completed' states (NCCL), not only `retired` (gloo)

    def label(self, group: int) -> str:
        if not 0 <= group < len(self.group_names):
            return "p2p"
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


SLICE_ROWS = 1 << 22  # rows decoded at a time: bounds the analysis' own memory on 33 M-row sets


class _GlobalCodes:
    """One code space for a string column across slices and chunks (dictionary-encoded or plain)."""

    def __init__(self) -> None:
        self.lookup: dict[Any, int] = {}
        self.values: list[Any] = []
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def _remap(self, dictionary: pa.Array) -> np.ndarray:
        key = (dictionary.buffers()[1].address if dictionary.buffers()[1] is not None else 0, len(dictionary))
        cached = self._cache.get(key)
        if cached is not None and len(cached) == len(dictionary):
            return cached
        table = np.empty(len(dictionary) + 1, np.int32)
        for i, value in enumerate(dictionary.to_pylist()):
            code = self.lookup.get(value)
            if code is None:
                code = self.lookup[value] = len(self.values)
                self.values.append(value)
            table[i] = code
        table[-1] = -1  # index -1 (null) stays -1
        self._cache[key] = table
        return table

    def codes(self, column: pa.ChunkedArray | None, n: int) -> np.ndarray:
        if column is None:
            return np.full(n, -1, np.int32)
        pieces = []
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = pc.dictionary_encode(chunk)
            indices = chunk.indices
            local = indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
            pieces.append(self._remap(chunk.dictionary)[local])
        return np.concatenate(pieces) if pieces else np.empty(0, np.int32)


@dataclass
class _Decoded:
    """The columns of one slice the analysis needs, as NumPy arrays (global codes)."""

    start: int
    rank: np.ndarray
    group: np.ndarray
    is_entry: np.ndarray
    seq: np.ndarray
    coll: np.ndarray  # an entry of a collective (not p2p) with a sequence id and a group
    p2p: np.ndarray
    op: np.ndarray
    pg_id: np.ndarray
    complete: np.ndarray
    started: np.ndarray


_STATES = {"scheduled": 0, "started": 1, "completed": 2}


class _Decoder:
    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.names = _GlobalCodes()
        self.ids = _GlobalCodes()
        self.descs = _GlobalCodes()
        self.ops = _GlobalCodes()
        self.states = _GlobalCodes()
        self.group_of: dict[tuple[str, Any], int] = {}
        self.group_names: list[str] = []

    def column(self, part: pa.Table, name: str) -> pa.ChunkedArray | None:
        return part.column(name) if name in part.column_names else None

    def _groups(self, name_codes: np.ndarray, id_codes: np.ndarray) -> np.ndarray:
        names = np.empty(len(self.names.values) + 1, np.int32)
        for code, value in enumerate(self.names.values):
            if value:
                names[code] = self.group_of.setdefault(("name", value), len(self.group_of))
            else:
                names[code] = -1
        names[-1] = -1
        ids = np.empty(len(self.ids.values) + 1, np.int32)
        for code, value in enumerate(self.ids.values):
            ids[code] = self.group_of.setdefault(("id", value), len(self.group_of))
        ids[-1] = -1
        by_name = names[name_codes]
        return np.where(by_name >= 0, by_name, ids[id_codes]).astype(np.int32)

    def labels(self) -> list[str]:
        out = [""] * len(self.group_of)
        for (kind, value), code in self.group_of.items():
            out[code] = str(value) if kind == "name" else f"pg_id {value}"
        return out

    def decode(self, start: int, length: int) -> _Decoded:
        part = self.table.slice(start, length)
        n = part.num_rows
        rank = part.column("rank").fill_null(-1).to_numpy().astype(np.int32, copy=False)
        name_codes = self.names.codes(self.column(part, "pg_name"), n)
        id_codes = self.ids.codes(self.column(part, "pg_id"), n)
        group = self._groups(name_codes, id_codes)
        record = self.column(part, "record_id")
        is_entry = ~record.is_null().to_numpy(zero_copy_only=False) if record is not None else np.ones(n, bool)
        # status rows (pg_status, record_id null) count only where the dump named their group
        unnamed = (name_codes < 0) | np.array([not v for v in self.names.values] + [True], bool)[name_codes]
        group[~is_entry & unnamed] = -1
        seq, seq_valid = _ints(part.column("collective_seq_id"))
        op = self.ops.codes(self.column(part, "op"), n)
        p2p_op = np.array([bool(_P2P_OP.search(str(o))) for o in self.ops.values] + [False], bool)
        p2p = _bools(self.column(part, "is_p2p"), n) | p2p_op[op]
        state_codes = self.states.codes(self.column(part, "state"), n)
        state_rank = np.array([_STATES.get(str(v), 0) for v in self.states.values] + [0], np.int8)
        state = state_rank[state_codes]
        complete = (state == 2) | _bools(self.column(part, "retired"), n)
        coll = is_entry & seq_valid & ~p2p & (group >= 0)
        return _Decoded(start, rank, group, is_entry, seq, coll, p2p & is_entry & (group >= 0), op, id_codes,
                        complete, state >= 1)

    def slices(self) -> Iterator[_Decoded]:
        """Slices on the table's own chunk boundaries (zero-copy), each at most SLICE_ROWS rows."""
        bounds = [0]
        for chunk in self.table.column("rank").chunks:
            end = bounds[-1] + len(chunk)
            while end - bounds[-1] > SLICE_ROWS:
                bounds.append(bounds[-1] + SLICE_ROWS)
            if end > bounds[-1]:
                bounds.append(end)
        for start, stop in itertools.pairwise(bounds):
            yield self.decode(start, stop - start)


STACKS_METADATA_KEY = b"faultlens.stacks"


def attach_stacks(table: pa.Table, stacks: Mapping[int, Any]) -> pa.Table:
    """The table with the ranks' Python stacks (faultlens.collectors.pystack.ProcessStack) in its schema metadata, so
    that a dump requester can hand them to the analysis together with the rows."""
    import json

    from faultlens.collectors.pystack import stack_to_json

    if not stacks:
        return table
    metadata = dict(table.schema.metadata or {})
    metadata[STACKS_METADATA_KEY] = json.dumps({str(int(r)): stack_to_json(s) for r, s in stacks.items()}).encode()
    return table.replace_schema_metadata(metadata)


def stacks_from_metadata(table: pa.Table) -> dict[int, Any]:
    import json

    from faultlens.collectors.pystack import parse_py_spy

    raw = (table.schema.metadata or {}).get(STACKS_METADATA_KEY)
    if not raw:
        return {}
    try:
        document = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(document, dict):
        return {}
    return {int(r): parse_py_spy(v, source=f"stack of rank {r}") for r, v in document.items()
            if str(r).lstrip("-").isdigit()}


def _group_max(tables: list[pa.Table], keys: list[str], aggregations: list[tuple[str, str]]) -> pa.Table:
    merged = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return merged.group_by(keys).aggregate(aggregations)


def analyze_collectives(collectives: pa.Table, expected_ranks: Sequence[int] | None = None,
                        stacks: Mapping[int, Any] | None = None) -> HangReport:
    """Analyse one dump set's `collectives` rows (any number of ranks). See the module docstring.

    stacks: rank -> faultlens.collectors.pystack.ProcessStack (py-spy), where taken; default: the table's schema
    metadata `faultlens.stacks` (attach_stacks), else none. They name where a culprit that never joined is, and give the
    send/recv waits that gloo does not record.

    The table may hold only the columns the analysis reads (COLUMNS) and may keep strings dictionary-encoded;
    it is read in slices of SLICE_ROWS, so the analysis' own memory stays bounded on very large sets."""
    missing_columns = [c for c in ("rank", "collective_seq_id") if c not in collectives.column_names]
    if missing_columns:
        raise ValueError(f"collectives table lacks column(s) {', '.join(missing_columns)}")
    table = collectives
    if table.num_rows == 0:
        return _report_empty(expected_ranks)
    if stacks is None:
        stacks = stacks_from_metadata(table)
    decoder = _Decoder(table)

    # -- pass 1: progress per (group, rank), signatures per (group, seq), membership evidence
    dumped: set[int] = set()
    progress_parts: list[pa.Table] = []
    signature_parts: list[pa.Table] = []
    seen_parts: list[pa.Table] = []
    configured: dict[int, Counter] = defaultdict(Counter)
    p2p_rows: list[np.ndarray] = []
    sizes_column = table.column("input_sizes") if "input_sizes" in table.column_names else None
    dtypes_column = table.column("input_dtypes") if "input_dtypes" in table.column_names else None
    for part in decoder.slices():
        dumped.update(int(r) for r in np.unique(part.rank) if r >= 0)
        named = part.group >= 0
        desc = decoder.descs.codes(table.column("pg_desc").slice(part.start, len(part.rank)), len(part.rank)) \
            if "pg_desc" in table.column_names else np.full(len(part.rank), -1, np.int32)
        # members seen and group descriptions: collective rows come with the progress aggregate below, the few
        # other named rows (status rows, p2p entries) here
        other = np.nonzero(named & ~part.coll)[0]
        seen_parts.append(pa.table({"g": part.group[other], "r": part.rank[other],
                                    "d": pa.array(desc[other], mask=desc[other] < 0)})
                          .group_by(["g", "r"]).aggregate([("d", "min")]))
        if "pg_ranks" in table.column_names:
            pg_ranks = table.column("pg_ranks").slice(part.start, len(part.rank))
            rows = np.nonzero(~pg_ranks.is_null().to_numpy(zero_copy_only=False) & named)[0]
            if rows.shape[0]:
                for row, value in zip(rows, pg_ranks.take(pa.array(rows)).to_pylist(), strict=True):
                    if value:
                        configured[int(part.group[row])][tuple(sorted(int(v) for v in value))] += 1
        p2p_rows.append(np.nonzero(part.p2p)[0] + part.start)
        rows = np.nonzero(part.coll)[0]
        c_seq = part.seq[rows]
        c_desc = desc[rows]
        progress_parts.append(pa.table({
            "g": part.group[rows], "r": part.rank[rows], "s": c_seq,
            "s_incomplete": pa.array(c_seq, mask=part.complete[rows]),
            "s_started": pa.array(c_seq, mask=~part.started[rows]),
            "s_complete": pa.array(c_seq, mask=~part.complete[rows]),
            "d": pa.array(c_desc, mask=c_desc < 0),
        }).group_by(["g", "r"]).aggregate([("s", "max"), ("s_incomplete", "min"), ("s_incomplete", "max"),
                                           ("s_started", "max"), ("s_complete", "max"), ("d", "min")]))
        signature_parts.append(_signatures(part, rows, sizes_column, dtypes_column, decoder.ops.values)
                               .group_by(["g", "s"]).aggregate([("sig", "min"), ("sig", "max")]))
    if not dumped:
        return _report_empty(expected_ranks)
    group_names = decoder.labels()
    agg = _group_max(progress_parts, ["g", "r"], [("s_max", "max"), ("s_incomplete_min", "min"),
                                                  ("s_incomplete_max", "max"), ("s_started_max", "max"),
                                                  ("s_complete_max", "max"), ("d_min", "min")])
    seen_table = _group_max(seen_parts, ["g", "r"], [("d_min", "min")])
    group_descs: dict[int, str | None] = {}
    seen: dict[int, set[int]] = defaultdict(set)
    for keys in (seen_table, agg):
        groups_col, ranks_col = keys.column("g").to_numpy(), keys.column("r").to_numpy()
        descs_col = keys.column("d_min_min").fill_null(-1).to_numpy()
        for g in np.unique(groups_col).tolist():
            mine = groups_col == g
            seen[int(g)].update(ranks_col[mine].tolist())
            d = descs_col[mine].max()
            if d >= 0 and int(g) not in group_descs:
                group_descs[int(g)] = decoder.descs.values[int(d)]

    # -- membership
    expected = set(int(r) for r in expected_ranks) if expected_ranks is not None else set()
    if expected_ranks is None:
        for counter in configured.values():
            for ranks in counter:
                expected.update(ranks)
        expected.update(range(max(max(dumped), max(expected, default=0)) + 1))
    members: dict[int, tuple[int, ...]] = {}
    rebuilt: set[int] = set()
    for g in set(seen) | set(configured):
        ranks = set(seen[g])
        if configured.get(g):
            for value in configured[g]:
                ranks.update(value)
        else:
            rebuilt.add(g)
        if group_descs.get(g) == "default_pg":
            ranks |= expected
        members[g] = tuple(sorted(ranks))
    missing = expected - dumped
    analysis = _Analysis(group_names, group_descs, members, rebuilt, dumped, expected, missing)
    if rebuilt:
        shown = [analysis.label(g) + f": [{_ranks_text(members[g])}]" for g in sorted(rebuilt)][:6]
        analysis.evidence.append("pg_config unusable for " + ", ".join(shown)
                                 + " - membership rebuilt from the entries")
    if missing:
        analysis.evidence.append(f"no dump from rank(s) {_ranks_text(sorted(missing))} (expected "
                                 f"{len(expected)} ranks, read {len(dumped)})")

    big = np.iinfo(np.int64).max
    e_arr = agg.column("s_max_max").to_numpy()
    first_inc = agg.column("s_incomplete_min_min").fill_null(big).to_numpy()
    last_inc = agg.column("s_incomplete_max_max").fill_null(-1).to_numpy()
    last_done = agg.column("s_complete_max_max").fill_null(-1).to_numpy()
    # collectives of one group complete in order: a completed entry means every earlier one completed too (gloo
    # leaves some entries unretired that did complete, e.g. an async all_reduce right after a send)
    c_arr = np.maximum(np.where(first_inc == big, e_arr, first_inc - 1), last_done)
    has_inc = last_inc > last_done
    s_arr = np.maximum(agg.column("s_started_max_max").fill_null(-1).to_numpy(), last_done)
    progress: dict[int, dict[int, tuple[int, int, int, bool]]] = defaultdict(dict)
    for g, r, e, c, st, inc in zip(agg.column("g").to_pylist(), agg.column("r").to_pylist(), e_arr.tolist(),
                                   c_arr.tolist(), s_arr.tolist(), has_inc.tolist(), strict=True):
        progress[g][r] = (e, c, st, inc)

    # -- divergences per group (times and ops filled in by pass 2)
    # completion is evidence only where entries carry device states (NCCL's 'started'/'completed'); gloo's are
    # always 'scheduled' and `retired` depends on when each rank dumped (a rank that dumped at the end of a run
    # before its last barrier was retired is no stalled rank), so there only entering is compared
    device_states = any(str(v) in ("started", "completed") for v in decoder.states.values)
    blocked_somewhere = {r for by_rank in progress.values() for r, v in by_rank.items() if v[3]}
    pending: list[tuple[_Divergence, tuple[int, ...] | None, str]] = []
    stuck_pending: list[tuple[int, int, tuple[int, ...]]] = []
    for g, by_rank in progress.items():
        group_members = members.get(g, tuple(by_rank))
        present = [r for r in group_members if r in by_rank]
        absent_dumped = [r for r in group_members if r not in by_rank and r in dumped]
        absent_missing = [r for r in group_members if r in missing]
        if not present:
            continue
        e_values = {r: by_rank[r][0] for r in present}
        below = min(e_values.values()) - 1
        for r in absent_dumped:
            # a dumped member with no entry of this group: it has not entered anything the dump still holds
            e_values[r] = below
        e_min, e_max = min(e_values.values()), max(e_values.values())
        if e_min < e_max:
            laggards = tuple(sorted(r for r, e in e_values.items() if e == e_min))
            waiters = tuple(sorted(r for r, e in e_values.items() if e > e_min))
            pending.append((_Divergence(g, "entered", e_min + 1, laggards, waiters, 0), waiters,
                            f"rank(s) {_ranks_text(waiters)} entered it, rank(s) {_ranks_text(laggards)} never did "
                            f"(last entered: {e_min})"))
        else:
            c_values = {r: by_rank[r][1] for r in present}
            c_min, c_max = min(c_values.values()), max(c_values.values())
            s_values = {r: by_rank[r][2] for r in present}
            s_min, s_max = min(s_values.values()), max(s_values.values())
            if c_min < c_max and device_states:
                laggards = tuple(sorted(r for r, c in c_values.items() if c == c_min))
                waiters = tuple(sorted(r for r, c in c_values.items() if c > c_min))
                pending.append((_Divergence(g, "completed", c_min + 1, laggards, waiters, 0), None,
                                f"rank(s) {_ranks_text(laggards)} entered it but never completed it; rank(s) "
                                f"{_ranks_text(waiters)} did"))
            elif s_min < s_max and s_min < e_max and device_states:
                laggards = tuple(sorted(r for r, st in s_values.items() if st == s_min))
                waiters = tuple(sorted(r for r, st in s_values.items() if st > s_min))
                pending.append((_Divergence(g, "started", s_min + 1, laggards, waiters, 0), None,
                                f"started on rank(s) {_ranks_text(waiters)}, not on rank(s) {_ranks_text(laggards)}"))
            elif (any if device_states else all)(by_rank[r][3] for r in present) and not absent_missing:
                stuck_pending.append((g, c_min + 1, tuple(sorted(r for r in present if by_rank[r][3]))))
        if absent_missing:
            # those inside the group's latest collective wait on the missing ranks; so do those that left it with
            # an error (a dump on the way out marks it retired): every member at the group's highest entry
            top = max(by_rank[r][0] for r in present)
            waiting = tuple(sorted(r for r in present
                                   if by_rank[r][3] or (by_rank[r][0] == top and r not in blocked_somewhere)))
            if waiting:
                seq = min(by_rank[r][1] for r in waiting) + 1
                pending.append((_Divergence(g, "missing", seq, tuple(absent_missing), waiting, 0), waiting,
                                f"rank(s) {_ranks_text(waiting)} wait in it; it needs rank(s) "
                                f"{_ranks_text(absent_missing)}, which wrote no dump"))

    # -- mismatching (group, seq) keys
    sig = _group_max(signature_parts, ["g", "s"], [("sig_min", "min"), ("sig_max", "max")])
    differ = pc.not_equal(sig.column("sig_min_min"), sig.column("sig_max_max")).to_numpy(zero_copy_only=False)
    bad_keys = list(zip(sig.column("g").to_numpy()[differ].tolist(), sig.column("s").to_numpy()[differ].tolist(),
                        strict=True))[:256]
    del sig, signature_parts, progress_parts

    # -- pass 2: the rows of the keys that need detail (divergent collectives, mismatches)
    wanted = {(d.group, d.seq) for d, _, _ in pending} | {(g, s) for g, s, _ in stuck_pending} | set(bad_keys)
    rows_of = _rows_for_keys(decoder, wanted)
    times = _Lazy(table, "time_created")
    details = _KeyDetails(table, rows_of, times, decoder)
    for d, among, text in pending:
        d.time, d.op, d.pg_id = details.time_op(d.group, d.seq, among)
        d.detail = f"{analysis.label(d.group)} seq {d.seq} {d.op or ''}: {text}"
        analysis.divergences.append(d)
    for g, seq, stuck in stuck_pending:
        analysis.stuck_groups.append((g, seq, stuck, details.time_op(g, seq, None)[0]))
    for g, s in bad_keys:
        mismatch = _mismatch(analysis, table, details, g, s, sizes_column, dtypes_column)
        if mismatch is not None:
            analysis.mismatches.append(mismatch)

    # -- p2p, per pair of peers
    p2p_all = np.concatenate(p2p_rows) if p2p_rows else np.empty(0, np.int64)
    _p2p_divergences(analysis, table, p2p_all, decoder, times)

    def history(rank: int) -> tuple[list[int], list[int], int | None] | None:
        rows = _rows_for_rank(decoder, rank)
        if rows is None:
            return None
        seqs, groups, complete, order = rows
        sort = np.argsort(order, kind="stable")
        incomplete = np.nonzero(~complete[sort])[0]
        return seqs[sort].tolist(), groups[sort].tolist(), int(incomplete[0]) if incomplete.shape[0] else None

    analysis.history = history
    analysis.device_states = device_states
    analysis.incomplete = {r for by_rank in progress.values() for r, v in by_rank.items() if v[3]}
    analysis.key_rows = lambda due_roles, due_seqs, roles, seqs: _key_orders(
        analysis, decoder, (due_roles[0], due_seqs[0]), list(zip(roles, seqs, strict=True)))
    if stacks:
        _stack_edges(analysis, stacks)
    return _decide(analysis)


def _key_orders(analysis: _Analysis, decoder: _Decoder, due: tuple[tuple, int],
                others: list[tuple[tuple, int]]) -> dict[tuple, dict[int, tuple[int, int]]]:
    """For the collective `due` (role, seq) and each of `others`: per rank that entered both (in its own group of
    each role), the record ids of the two entries (its own order)."""
    by_role: dict[tuple, list[int]] = defaultdict(list)
    for g in analysis.members:
        by_role[_role(analysis, g)].append(g)
    wanted = {(g, due[1]) for g in by_role.get(due[0], ())}
    for role, seq in others:
        wanted |= {(g, seq) for g in by_role.get(role, ())}
    if len(wanted) > 200_000:
        return {}
    rows_of = _rows_for_keys(decoder, wanted)
    if not rows_of:
        return {}
    all_rows = np.concatenate(list(rows_of.values()))
    ranks = decoder.table.column("rank").take(pa.array(all_rows)).to_numpy(zero_copy_only=False)
    records, _ = _Lazy(decoder.table, "record_id").at(all_rows)
    position: dict[tuple[int, int, int], int] = {}
    i = 0
    for (g, seq), rows in rows_of.items():
        for _ in range(len(rows)):
            position.setdefault((g, seq, int(ranks[i])), int(records[i]))
            i += 1

    def positions(role: tuple, seq: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for g in by_role.get(role, ()):
            for r in analysis.members.get(g, ()):
                rec = position.get((g, seq, r))
                if rec is not None:
                    out.setdefault(r, rec)
        return out

    due_pos = positions(*due)
    result: dict[tuple, dict[int, tuple[int, int]]] = {}
    for role, seq in others:
        other_pos = positions(role, seq)
        result[(role, seq)] = {r: (due_pos[r], p) for r, p in other_pos.items() if r in due_pos}
    return result


def _stack_edges(analysis: _Analysis, stacks: Mapping[int, Any]) -> None:
    """Where each rank's Python stack puts it; a rank blocked in a send/recv (which gloo does not record) waits on
    its peer: an edge of the wait-for graph the trace alone cannot show."""
    from faultlens.collectors.pystack import StackPlace, where

    for rank, stack in stacks.items():
        rank = int(rank)
        if rank not in analysis.dumped:
            continue
        place = where(stack)
        analysis.where[rank] = place
        if place.kind == StackPlace.UNKNOWN:
            continue
        if place.kind == StackPlace.OUTSIDE:
            # stuck in its own code, it waits on nobody: not even on a member without a dump whose group it
            # last completed
            for d in analysis.divergences:
                if d.level == "missing" and rank in d.waiters:
                    d.waiters = tuple(w for w in d.waiters if w != rank)
        peer = place.peer
        if place.kind != StackPlace.IN_P2P or peer is None or peer == rank or peer not in analysis.expected:
            continue
        shared = [g for g, m in analysis.members.items() if rank in m and peer in m and len(m) == 2]
        group = shared[0] if shared else -1
        analysis.divergences.append(_Divergence(
            group, "stack", None, (peer,), (rank,), _BIG, place.op, None,
            f"{analysis.label(group)} p2p: {place.text(rank)}: it waits on rank {peer}"))


def _signatures(part: _Decoded, rows: np.ndarray, sizes: pa.ChunkedArray | None, dtypes: pa.ChunkedArray | None,
                ops: list[Any]) -> pa.Table:
    """(group, seq, signature of op + sizes (for shape-bound ops) + dtypes) of a slice's collective rows."""
    shape_ops = np.array([bool(_SHAPE_MUST_MATCH.search(str(o))) for o in ops] + [False], bool)
    c_ops = part.op[rows]
    length = len(part.rank)
    size_sig, dtype_sig = row_signatures(sizes.slice(part.start, length) if sizes is not None else None,
                                         dtypes.slice(part.start, length) if dtypes is not None else None, rows)
    size_sig = np.where(shape_ops[c_ops], size_sig, np.uint64(0))
    combined = combine_signatures(c_ops.astype(np.uint64), size_sig, dtype_sig)
    return pa.table({"g": part.group[rows], "s": part.seq[rows], "sig": combined})


def _rows_for_keys(decoder: _Decoder, keys: set[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
    """Global row indices of the collective entries of each (group, seq) key, in one pass."""
    out: dict[tuple[int, int], list[np.ndarray]] = defaultdict(list)
    if not keys:
        return {}
    wanted = np.array(sorted(g * (1 << 40) + s for g, s in keys if s >= 0), np.int64)
    for part in decoder.slices():
        rows = np.nonzero(part.coll)[0]
        combined = part.group[rows].astype(np.int64) * (1 << 40) + part.seq[rows]
        hit = rows[np.isin(combined, wanted)]
        if hit.shape[0] == 0:
            continue
        for key, row in zip((part.group[hit].astype(np.int64) * (1 << 40) + part.seq[hit]).tolist(), hit.tolist(),
                            strict=True):
            out[(key >> 40, key & ((1 << 40) - 1))].append(row + part.start)
    return {key: np.asarray(rows, np.int64) for key, rows in out.items()}


def _rows_for_rank(decoder: _Decoder, rank: int) -> tuple[np.ndarray, ...] | None:
    seqs, groups, complete, rows_all = [], [], [], []
    for part in decoder.slices():
        hit = np.nonzero(part.coll & (part.rank == rank))[0]
        seqs.append(part.seq[hit])
        groups.append(part.group[hit])
        complete.append(part.complete[hit])
        rows_all.append(hit + part.start)
    rows = np.concatenate(rows_all)
    if rows.shape[0] == 0:
        return None
    order = _Lazy(decoder.table, "record_id").at(rows)[0]
    return np.concatenate(seqs), np.concatenate(groups), np.concatenate(complete), order


class _KeyDetails:
    """Per (group, seq): the ranks, times, ops and local pg ids of its rows."""

    def __init__(self, table: pa.Table, rows_of: dict[tuple[int, int], np.ndarray], times: _Lazy,
                 decoder: _Decoder) -> None:
        self.rows_of = rows_of
        all_rows = np.concatenate(list(rows_of.values())) if rows_of else np.empty(0, np.int64)
        index = {int(r): i for i, r in enumerate(all_rows.tolist())}
        self.index = index
        needed = [c for c in ("rank", "op", "pg_id", "input_sizes", "input_dtypes") if c in table.column_names]
        small = table.select(needed)
        taken = small.take(pa.array(all_rows)) if all_rows.shape[0] else small.slice(0, 0)
        self.rank = taken.column("rank").fill_null(-1).to_numpy().astype(np.int64)
        self.time, self.time_valid = times.at(all_rows)
        n = taken.num_rows
        self.op = decoder.ops.codes(taken.column("op") if "op" in taken.column_names else None, n)
        self.pg_id = decoder.ids.codes(taken.column("pg_id") if "pg_id" in taken.column_names else None, n)
        self.decoder = decoder
        self.taken = taken

    def positions(self, g: int, s: int) -> np.ndarray:
        rows = self.rows_of.get((g, s))
        if rows is None:
            return np.empty(0, np.int64)
        return np.array([self.index[int(r)] for r in rows.tolist()], np.int64)

    def time_op(self, g: int, s: int, among: Sequence[int] | None) -> tuple[int, str | None, str | None]:
        pos = self.positions(g, s)
        if among is not None and pos.shape[0]:
            pos = pos[np.isin(self.rank[pos], np.asarray(among))]
        if pos.shape[0] == 0:
            return np.iinfo(np.int64).max, None, None
        valid = self.time_valid[pos]
        t = int(self.time[pos][valid].min()) if valid.any() else np.iinfo(np.int64).max
        op = Counter(int(c) for c in self.op[pos[:64]]).most_common(1)[0][0]
        pid = Counter(int(c) for c in self.pg_id[pos[:64]]).most_common(1)[0][0]
        return (t, self.decoder.ops.values[op] if op >= 0 else None,
                str(self.decoder.ids.values[pid]) if pid >= 0 else None)


def _mismatch(analysis: _Analysis, table: pa.Table, details: _KeyDetails, g: int, s: int,
              sizes: pa.ChunkedArray | None, dtypes: pa.ChunkedArray | None) -> _Mismatch | None:
    pos = details.positions(g, s)
    if pos.shape[0] == 0:
        return None
    taken = details.taken.take(pa.array(pos))
    ops = details.decoder.ops.values
    op_codes = details.op[pos]
    shape_ops = np.array([bool(_SHAPE_MUST_MATCH.search(str(o))) for o in ops] + [False], bool)
    local = np.arange(taken.num_rows, dtype=np.int64)
    size_sig, dtype_sig = row_signatures(taken.column("input_sizes") if "input_sizes" in taken.column_names
                                         else None,
                                         taken.column("input_dtypes") if "input_dtypes" in taken.column_names
                                         else None, local)
    size_sig = np.where(shape_ops[op_codes], size_sig, np.uint64(0))
    ranks = details.rank[pos]
    signature: dict[int, tuple[int, int, int]] = {}
    for i in range(len(pos)):
        signature.setdefault(int(ranks[i]), (int(op_codes[i]), int(size_sig[i]), int(dtype_sig[i])))
    ranked = Counter(signature.values()).most_common()
    if len(ranked) < 2:
        return None
    top = ranked[0][1]
    tie = ranked[1][1] == top
    majority_sig = ranked[0][0] if not tie else min(
        (sig for sig, c in ranked if c == top), key=lambda sig: min(r for r, v in signature.items() if v == sig))
    odd = tuple(sorted(r for r, v in signature.items() if v != majority_sig))
    majority = tuple(sorted(r for r, v in signature.items() if v == majority_sig))
    kind = HangVerdict.OP_MISMATCH if len({v[0] for v in signature.values()}) > 1 else HangVerdict.SIZE_MISMATCH
    valid = details.time_valid[pos]
    t = int(details.time[pos][valid].min()) if valid.any() else np.iinfo(np.int64).max
    describe = _describe_entries(taken, ranks, [ops[c] if c >= 0 else None for c in op_codes])
    op = ops[majority_sig[0]] if 0 <= majority_sig[0] < len(ops) else None
    pid = Counter(int(c) for c in details.pg_id[pos[:64]]).most_common(1)[0][0]
    what = "op" if kind == HangVerdict.OP_MISMATCH else "size/dtype"
    detail = (f"{analysis.label(g)} seq {s}: {what} mismatch, rank(s) {_ranks_text(odd)} differ from "
              f"rank(s) {_ranks_text(majority)}{' (a tie)' if tie else ''}: {describe}")
    return _Mismatch(g, s, kind, odd, majority, tie, t, detail, op,
                     str(details.decoder.ids.values[pid]) if pid >= 0 else None)


def _p2p_divergences(analysis: _Analysis, table: pa.Table, rows: np.ndarray, decoder: _Decoder,
                     times: _Lazy) -> None:
    if "p2p_seq_id" not in table.column_names or rows.shape[0] == 0:
        return
    taken = table.take(pa.array(rows))
    part = _Decoder.decode(_replace_table(decoder, taken), 0, taken.num_rows)
    p2p_seq, p2p_valid = _ints(taken.column("p2p_seq_id"))
    created, created_valid = times.at(rows)
    ops = decoder.ops.values
    parsed: dict[int, tuple[int, int] | None] = {}
    for code in np.unique(part.op):
        match = _P2P_OP.search(str(ops[code])) if code >= 0 else None
        # 'send 0->1': self 0, peer 1; 'recv 1<-0': self 1, peer 0 (group-local ranks)
        parsed[int(code)] = (int(match.group(2)), int(match.group(4))) if match else None
    best: dict[tuple[int, int, int], tuple[int, bool, int]] = {}
    peers: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i in range(taken.num_rows):
        pair = parsed.get(int(part.op[i]))
        if pair is None or not p2p_valid[i] or part.group[i] < 0:
            continue
        g = int(part.group[i])
        members = analysis.members.get(g, ())
        peer_local = pair[1]
        if peer_local >= len(members):
            continue
        peer = members[peer_local]
        rank = int(part.rank[i])
        peers[(g, rank)].add(peer)
        key = (g, rank, peer)
        value = (int(p2p_seq[i]), bool(part.complete[i]), int(created[i]) if created_valid[i] else 0)
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


def _replace_table(decoder: _Decoder, table: pa.Table) -> _Decoder:
    """The decoder's code spaces over another table (the taken p2p rows)."""
    clone = _Decoder.__new__(_Decoder)
    clone.__dict__.update(decoder.__dict__)
    clone.table = table
    return clone


def _describe_entries(taken: pa.Table, ranks: np.ndarray, ops: list[Any]) -> str:
    parts = []
    shown: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    sizes = taken.column("input_sizes").to_pylist() if "input_sizes" in taken.column_names else [None] * len(ranks)
    dtypes = taken.column("input_dtypes").to_pylist() if "input_dtypes" in taken.column_names \
        else [None] * len(ranks)
    for i in range(len(ranks)):
        shown[(ops[i], repr(sizes[i]) + " " + repr(dtypes[i]))].append(int(ranks[i]))
    for (op, what), who in list(shown.items())[:4]:
        parts.append(f"{op} {what} on rank(s) {_ranks_text(sorted(set(who)), 6)}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# deciding


_BIG = np.iinfo(np.int64).max
_LEVEL_RANK = {"entered": 0, "completed": 1, "started": 2, "missing": 3, "p2p": 4, "stack": 5}


@dataclass
class _Root:
    ranks: list[int]
    divergences: list[_Divergence] = field(default_factory=list)
    mismatches: list[_Mismatch] = field(default_factory=list)
    cyclic: bool = False
    waiting: set[int] = field(default_factory=set)


def _decide(analysis: _Analysis) -> HangReport:
    """The wait-for graph's independent roots (see the module docstring), each with its own kind and chain."""
    divergences = analysis.divergences
    evidence = list(analysis.evidence)
    rank_nodes = sorted(analysis.dumped | analysis.missing)
    node_of = {r: i for i, r in enumerate(rank_nodes)}
    n_ranks = len(rank_nodes)

    def build(dropped: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src: list[int] = []
        dst: list[int] = []
        for i, d in enumerate(divergences):
            hub = n_ranks + i
            live = [w for w in d.waiters if w not in dropped and w in node_of]
            if not live:
                continue  # nobody (left) waits here: its laggards are not waited on through it
            for w in live:
                src.append(node_of[w])
                dst.append(hub)
            for lag in d.laggards:
                if lag in node_of:
                    src.append(hub)
                    dst.append(node_of[lag])
        src_a, dst_a = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        labels = _strongly_connected(n_ranks + len(divergences), src_a, dst_a)
        return src_a, dst_a, labels

    # -- terminal components; cycles broken by each rank's own order (consensus of the others), then history
    skippers: dict[int, str] = {}
    components: list[list[int]] = []
    src = dst = np.empty(0, np.int64)
    # a rank that joined a collective its own group's peers completed is stuck inside it, whatever it (or its
    # enqueued later work) waits on elsewhere: a culprit in its own right
    # (only where the dumps carry device states, as NCCL's do: gloo's entries are always 'scheduled' and
    # `retired` depends on when each rank dumped, so there a last unretired entry is no evidence of a stall)
    stalled = {lag for d in divergences if d.level in ("completed", "started") for lag in d.laggards} \
        if analysis.device_states else set()
    if divergences:
        laggards = {lag for d in divergences for lag in d.laggards}
        for _ in range(4):
            src, dst, labels = build(set(skippers) | stalled)
            components = _terminal_components(n_ranks, src, dst, labels, rank_nodes)
            found: dict[int, str] = {}
            for comp in components:
                if len(comp) < 2:
                    continue
                for rank in sorted((set(comp) & laggards) - analysis.missing - set(skippers))[:64]:
                    verdict = _skipped_by_consensus(analysis, rank, set(comp), divergences) \
                        or _skipped(analysis, rank, divergences)
                    if verdict:
                        found[rank] = verdict
            if not found:
                break
            skippers.update(found)
    dropped = set(skippers) | stalled

    # -- who waits on each component (reverse reachability over the graph without the skippers' out-edges)
    reverse: dict[int, list[int]] = defaultdict(list)
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        reverse[b].append(a)
    roots: list[_Root] = []
    for comp in components:
        root = _Root(sorted(comp), cyclic=len(comp) > 1 and not (set(comp) & dropped))
        seen = {node_of[r] for r in comp}
        stack = list(seen)
        while stack:
            node = stack.pop()
            for prev in reverse.get(node, ()):
                if prev not in seen:
                    seen.add(prev)
                    stack.append(prev)
        root.waiting = {rank_nodes[n] for n in seen if n < n_ranks} - set(comp)
        members = set(comp)
        root.divergences = [d for d in divergences if not members.isdisjoint(d.laggards)]
        roots.append(root)
    # ranks stuck in one collective together (two_in_one_group) are one root, not two
    merged: dict[tuple, _Root] = {}
    for root in roots:
        head = _headline(root)
        key = (head.group, head.seq, head.level) if head is not None and not root.cyclic else ("own", *root.ranks)
        if key in merged:
            other = merged[key]
            other.ranks = sorted(set(other.ranks) | set(root.ranks))
            other.waiting = (other.waiting | root.waiting) - set(other.ranks)
            have = {id(d) for d in other.divergences}
            other.divergences += [d for d in root.divergences if id(d) not in have]
        else:
            merged[key] = root
    roots = list(merged.values())

    # -- mismatches: a root of their own, evidence of a root they belong to, or follow-ons
    culprit_ranks = {r for root in roots for r in root.ranks}
    waiting_all = {w for root in roots for w in root.waiting} - culprit_ranks
    follow_on_mismatches: list[_Mismatch] = []
    first_wait: dict[int, int] = {}  # rank -> when it first waited on anyone (time of that collective)
    if analysis.mismatches:
        for d in divergences:
            for w in d.waiters:
                if d.time < first_wait.get(w, _BIG):
                    first_wait[w] = d.time
    for m in sorted(analysis.mismatches, key=lambda m: (m.time, m.tie)):
        odd = set(m.odd)
        if m.tie:
            involved = set(m.odd) | set(m.majority)
            blamed = involved & culprit_ranks
            if blamed:
                odd = blamed
            elif involved <= waiting_all:
                follow_on_mismatches.append(m)
                continue
            else:
                odd = involved
        owners = [root for root in roots if odd & set(root.ranks)]
        if owners:
            for root in owners:
                root.mismatches.append(m)
            continue
        # a mismatch is a follow-on only where its odd ranks were already waiting on a root when they made it
        # (an error path's extra collective); one made before (a completed all_reduce of another shape) is a root
        waits_since = [first_wait[r] for r in odd if r in first_wait]
        if odd <= waiting_all and waits_since and min(waits_since) < m.time:
            follow_on_mismatches.append(m)
            continue
        roots.append(_Root(sorted(odd), mismatches=[m]))
        culprit_ranks |= odd

    built = [_describe_root(analysis, root, skippers) for root in roots]
    built.sort(key=lambda b: (-len(b[0].waiting_ranks), b[1], b[0].ranks))
    hang_roots = tuple(b[0] for b in built)
    culprits = sorted({r for root in hang_roots for r in root.ranks})
    waiting = sorted({w for root in hang_roots for w in root.waiting_ranks} - set(culprits))
    missing = tuple(sorted(analysis.missing))
    unresolved = any(root.kind == HangVerdict.CYCLE for root in hang_roots)

    if hang_roots:
        head = hang_roots[0]
        summary = [f"root {i + 1} of {len(hang_roots)}: {root.reason}" for i, root in enumerate(hang_roots)] \
            if len(hang_roots) > 1 else [head.reason]
        lines = [*summary]
        for root in hang_roots:
            lines.extend(root.where)
        for root in hang_roots:
            lines.extend(e for e in root.evidence if e not in lines)
        lines.extend(skippers.values())
        own = {id(d) for r in roots for d in r.divergences}
        explained = [d for d in divergences if id(d) not in own]
        lines.extend("follow-on: " + d.detail for d in sorted(explained, key=lambda d: d.time)[:MAX_EVIDENCE])
        lines.extend("follow-on: " + m.detail for m in follow_on_mismatches[:MAX_EVIDENCE])
        kinds = {r: k for root in hang_roots for r, k in root.kinds}
        never = tuple(r for r in culprits if kinds.get(r) in (HangVerdict.NEVER_JOINED.value,
                                                               HangVerdict.STUCK_OUTSIDE.value,
                                                               HangVerdict.SKIPPED.value, HangVerdict.CYCLE.value))
        stalled = tuple(r for r in culprits if kinds.get(r) == HangVerdict.STALLED.value)
        reason = head.reason if len(hang_roots) == 1 else (
            f"{len(hang_roots)} independent roots: " + "; ".join(
                f"rank(s) {_ranks_text(r.ranks)} {r.kind.value}" + (f" in {r.pg_desc or r.pg_name} seq "
                                                                  f"{r.collective_seq_id}" if r.pg_name else "")
                for r in hang_roots))
        if waiting:
            reason += f"; {len(waiting)} other rank(s) wait on them (follow-ons)"
        if unresolved:
            reason += "; the ranks of a cycle wait on each other and nothing could order them"
        return HangReport(
            verdict=_FAMILY.get(head.kind, head.kind), culprit_ranks=tuple(culprits), pg_id=head.pg_id,
            pg_name=head.pg_name, pg_desc=head.pg_desc, collective_seq_id=head.collective_seq_id, op=head.op,
            never_joined=never, stalled=stalled, missing_dumps=missing, reason=reason,
            confidence=round(min(root.confidence for root in hang_roots), 3),
            evidence=tuple(evidence + lines), roots=hang_roots, follow_ons=tuple(waiting),
            unresolved_cycle=unresolved)
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


def _headline(root: _Root) -> _Divergence | None:
    """The divergence that best says what a root did: a collective (not p2p) one, covering most of its ranks,
    earliest."""
    ranks = set(root.ranks)
    return min(root.divergences, key=lambda d: (d.level in ("p2p", "stack"), -len(set(d.laggards) & ranks), d.time,
                                                _LEVEL_RANK[d.level]), default=None)


def _rank_kind(analysis: _Analysis, rank: int, root: _Root, skippers: dict[int, str]) -> HangVerdict:
    if rank in analysis.missing:
        return HangVerdict.MISSING_DUMPS
    if rank in skippers:
        return HangVerdict.SKIPPED
    if root.cyclic:
        return HangVerdict.CYCLE
    levels = {d.level for d in root.divergences if rank in d.laggards}
    if not levels and root.mismatches:
        return root.mismatches[0].kind
    if levels & {"completed", "started"}:
        return HangVerdict.STALLED  # stuck inside a collective its peers completed: that explains the rest
    place = analysis.where.get(rank)
    if place is not None and place.kind.value == "outside_collectives":
        return HangVerdict.STUCK_OUTSIDE
    if place is None and rank in analysis.dumped and rank not in analysis.incomplete:
        return HangVerdict.STUCK_OUTSIDE  # every entry it recorded completed: it is inside no collective
    # a stack was taken and shows no thread of it (the process or thread is gone: crashed), or it is blocked in
    # something the trace does not explain
    return HangVerdict.NEVER_JOINED


def _describe_root(analysis: _Analysis, root: _Root, skippers: dict[int, str]) -> tuple[HangRoot, int]:
    head = _headline(root)
    mismatch = min(root.mismatches, key=lambda m: m.time, default=None)
    kinds = {r: _rank_kind(analysis, r, root, skippers) for r in root.ranks}
    use_mismatch = mismatch is not None and (head is None or mismatch.time <= head.time)
    if use_mismatch:
        kind = mismatch.kind
        kinds = {r: (mismatch.kind if r in mismatch.odd or mismatch.tie else k) for r, k in kinds.items()}
    else:
        kind = Counter(kinds.values()).most_common(1)[0][0]
    where = tuple(analysis.where[r].text(r) for r in root.ranks if r in analysis.where)
    chain = []
    if use_mismatch:
        chain.append(mismatch.detail)
    for d in sorted(root.divergences, key=lambda d: (d is not head, d.time))[:MAX_EVIDENCE]:
        chain.append(d.detail)
    for m in root.mismatches:
        if m is not mismatch or not use_mismatch:
            chain.append("follow-on: " + m.detail)
    # confidence
    if kind == HangVerdict.CYCLE:
        confidence = 0.5
    elif use_mismatch:
        confidence = 0.95 if len(mismatch.majority) >= 2 * len(mismatch.odd) else 0.8
        if mismatch.tie:
            confidence = 0.75 if head is not None or set(root.ranks) != set(mismatch.odd) | set(mismatch.majority) \
                else 0.4
    elif kind == HangVerdict.SKIPPED:
        confidence = 0.8
    else:
        groups = Counter(r for d in root.divergences for r in set(d.laggards) & set(root.ranks))
        located = any(analysis.where.get(r) is not None and analysis.where[r].kind.value == "outside_collectives"
                      for r in root.ranks)
        confidence = 0.95 if (groups and min(groups.values()) >= 2) or located else 0.85
    if use_mismatch:
        group, seq, op, pg_id, t = mismatch.group, mismatch.seq, mismatch.op, mismatch.pg_id, mismatch.time
        what = mismatch.detail
    elif head is not None:
        group, seq, op, pg_id, t = head.group, head.seq, head.op, head.pg_id, head.time
        what = head.detail
    else:
        group, seq, op, pg_id, t, what = -1, None, None, None, _BIG, ""
    phrase = {HangVerdict.STUCK_OUTSIDE: "never joined the collective their peers wait in and are inside no "
                                         "collective (stuck outside)",
              HangVerdict.SKIPPED: "left a collective out and went on (their peers wait in it)",
              HangVerdict.CYCLE: "wait on each other in a cycle nothing could order",
              }.get(kind) or _verdict_phrase(kind)
    reason = f"rank(s) {_ranks_text(root.ranks)} {phrase}: {what}"
    skip_text = [skippers[r] for r in root.ranks if r in skippers]
    if skip_text:
        reason += f" ({skip_text[0]})"
    if where:
        reason += f"; {where[0]}"
    if root.waiting:
        reason += f"; rank(s) {_ranks_text(sorted(root.waiting))} wait on them"
    valid = 0 <= group < len(analysis.group_names)
    return HangRoot(
        kind=kind, ranks=tuple(root.ranks), kinds=tuple((r, k.value) for r, k in sorted(kinds.items())),
        pg_id=pg_id, pg_name=analysis.group_names[group] if valid else None,
        pg_desc=analysis.group_descs.get(group) if valid else None, collective_seq_id=seq, op=op,
        waiting_ranks=tuple(sorted(root.waiting)), where=where, confidence=confidence, reason=reason,
        evidence=tuple(chain)), t


def _role(analysis: _Analysis, group: int) -> tuple:
    """Groups that play the same part in the program (one desc, one size: Megatron's TP groups) are compared by
    sequence id across ranks; a group without a usable desc plays only its own part."""
    desc = analysis.group_descs.get(group)
    if desc and desc not in ("undefined", "default_pg"):
        return ("desc", desc, len(analysis.members.get(group, ())))
    return ("group", group)


def _role_text(analysis: _Analysis, group: int) -> str:
    role = _role(analysis, group)
    return str(role[1]) if role[0] == "desc" else f"group {analysis.group_names[group]!r}"


def _skipped_by_consensus(analysis: _Analysis, rank: int, cycle: set[int],
                          divergences: list[_Divergence]) -> str | None:
    """Did `rank` go past a collective it lags in? Its own cross-group entry order says which collectives it
    entered after its last one of the lagging group; the ranks outside the cycle that entered both (in groups of
    the same part: the other TP groups for a TP collective) say which comes first in the program. No periodic
    history is needed: one step of the others' order is enough."""
    history = analysis.history(rank) if analysis.history else None
    if history is None or analysis.key_rows is None:
        return None
    seqs, groups_in_order, _incomplete = history
    for d in divergences:
        if rank not in d.laggards or d.level != "entered" or d.seq is None:
            continue
        last = max((i for i, g in enumerate(groups_in_order) if g == d.group), default=-1)
        after = [(groups_in_order[i], seqs[i]) for i in range(last + 1, len(seqs))
                 if groups_in_order[i] != d.group][:8]
        if not after:
            continue
        due = (_role(analysis, d.group), d.seq)
        later = [(_role(analysis, g), s, g, s) for g, s in after]
        orders = analysis.key_rows([due[0]], [due[1]], [k[0] for k in later], [k[1] for k in later])
        for role, s, g, s_own in later:
            pro = con = 0
            example = None
            for w, (pos_due, pos_other) in orders.get((role, s), {}).items():
                if w in cycle or w == rank:
                    continue
                if pos_due < pos_other:
                    pro += 1
                    example = example if example is not None else w
                else:
                    con += 1
            if pro and pro > con:
                return (f"rank {rank} skipped {analysis.label(d.group)} seq {d.seq}: {pro} rank(s) outside the cycle "
                        f"(e.g. rank {example}) entered their {_role_text(analysis, d.group)} seq {d.seq} before "
                        f"their {_role_text(analysis, g)} seq {s_own}, which rank {rank} entered without it")
    return None


def _verdict_phrase(verdict: HangVerdict) -> str:
    return {HangVerdict.NEVER_JOINED: "never joined the collective their peers wait in",
            HangVerdict.STALLED: "joined the collective but did not complete it while their peers did",
            HangVerdict.MISSING_DUMPS: "wrote no dump and their peers wait on them",
            HangVerdict.SIZE_MISMATCH: "called a collective with other sizes/dtypes than their peers",
            HangVerdict.OP_MISMATCH: "called another collective than their peers"}.get(verdict, "lag")


def _terminal_components(n_ranks: int, src: np.ndarray, dst: np.ndarray, labels: np.ndarray,
                         rank_nodes: list[int]) -> list[list[int]]:
    """The ranks of each terminal strongly-connected component (nothing it waits on) that someone waits on."""
    if src.shape[0] == 0:
        return []
    crossing = labels[src] != labels[dst]
    has_exit = set(labels[src[crossing]].tolist())
    waited_on = set(dst[dst < n_ranks].tolist())
    members_of: dict[int, list[int]] = defaultdict(list)
    for node in range(n_ranks):
        members_of[int(labels[node])].append(node)
    out = []
    for label, nodes in members_of.items():
        if label in has_exit or not any(node in waited_on for node in nodes):
            continue
        out.append(sorted(rank_nodes[node] for node in nodes))
    return sorted(out)


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
