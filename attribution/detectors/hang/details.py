"""The details pass: cross-group entry order, stack edges, signatures, mismatches, p2p divergences.
"""

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.columns import (
    LazyColumn,
    filled_values,
    int_column,
    row_indices,
    take_rows,
)
from faultlens.attribution.detectors.hang.decode import DecodedSlice, SliceDecoder
from faultlens.attribution.detectors.hang.graph import (
    BIG,
    Analysis,
    Divergence,
    Mismatch,
    ranks_text,
)
from faultlens.attribution.detectors.hang.kernels import combine_signatures, row_signatures
from faultlens.attribution.detectors.hang.lookups import rows_for_keys
from faultlens.attribution.detectors.hang.report import (
    INPUT_AT_ROOT_ONLY,
    OUTPUT_AT_ROOT_ONLY,
    P2P_OP,
    SHAPE_MUST_MATCH,
    SIGNATURE_COLUMNS,
    HangVerdict,
)
from faultlens.attribution.detectors.hang.skips import group_role, groups_by_role
from faultlens.attribution.detectors.hang.small import distinct


def _ops_matching(ops: list[Any], pattern: re.Pattern[str]) -> np.ndarray:
    """Per op code (and -1 last): whether the op's name matches `pattern`."""
    return np.array([bool(pattern.search(str(o))) for o in ops] + [False], bool)


def bound_signatures(ops: list[Any], op_codes: np.ndarray, size_sig: np.ndarray,
                     dtype_sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The size and dtype signatures of rows with op codes `op_codes`, each 0 where its ranks need
    not agree on
    it: sizes outside the shape-bound ops (SHAPE_MUST_MATCH), dtypes of an op whose input only the
    root holds (a scatter's other members record no input at all)."""
    return (np.where(_ops_matching(ops, SHAPE_MUST_MATCH)[op_codes], size_sig, np.uint64(0)),
            np.where(_ops_matching(ops, INPUT_AT_ROOT_ONLY)[op_codes], np.uint64(0), dtype_sig))


def stack_edges(analysis: Analysis, stacks: Mapping[int, Any]) -> None:
    """Where each rank's Python stack puts it; a rank blocked in a send/recv (which gloo does not
    record) waits on its peer: an edge of the wait-for graph the trace alone cannot show."""
    from faultlens.collectors.sources.pystack import StackPlace, where

    for rank, stack in stacks.items():
        rank = int(rank)
        if rank not in analysis.dumped and rank not in analysis.missing:
            continue  # (a rank without a dump may still have a stack: alive, and where)
        place = where(stack)
        analysis.where[rank] = place
        if place.kind == StackPlace.UNKNOWN:
            continue
        if place.kind == StackPlace.OUTSIDE:
            # stuck in its own code, it waits on nobody: not even on a member without a dump whose
            # group it last completed
            for d in analysis.divergences:
                if d.level == "missing" and rank in d.waiters:
                    d.waiters = tuple(w for w in d.waiters if w != rank)
        peer = place.peer
        if (
            place.kind != StackPlace.IN_P2P
            or peer is None
            or peer == rank
            or peer not in analysis.expected
        ):
            continue
        shared = [g for g, m in analysis.members.items() if rank in m and peer in m and len(m) == 2]
        group = shared[0] if shared else -1
        analysis.divergences.append(Divergence(
            group, "stack", None, (peer,), (rank,), BIG, place.op, None,
            f"{analysis.label(group)} p2p: {place.text(rank)}: it waits on rank {peer}"))


def signature_columns(table: pa.Table) -> dict[str, Any]:
    """The table's SIGNATURE_COLUMNS (None where it lacks one)."""
    return {c: table.column(c) if c in table.column_names else None for c in SIGNATURE_COLUMNS}


def io_signatures(ops: list[Any], op_codes: np.ndarray, columns: Mapping[str, Any],
                  rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The size and dtype signatures of rows (bound_signatures) over inputs and outputs alike:
    output sizes where the shapes must agree, output dtypes but for an op whose output only the
    root holds. `columns`: SIGNATURE_COLUMNS -> column or None."""
    in_size, in_dtype = bound_signatures(ops, op_codes, *row_signatures(
        columns.get("input_sizes"), columns.get("input_dtypes"), rows))
    out_size, out_dtype = row_signatures(
        columns.get("output_sizes"), columns.get("output_dtypes"), rows)
    out_size = np.where(_ops_matching(ops, SHAPE_MUST_MATCH)[op_codes], out_size, np.uint64(0))
    out_dtype = np.where(_ops_matching(ops, OUTPUT_AT_ROOT_ONLY)[op_codes], np.uint64(0), out_dtype)
    zero = np.zeros(rows.shape[0], np.uint64)
    return (
        combine_signatures(in_size, out_size, zero),
        combine_signatures(in_dtype, out_dtype, zero),
    )


def slice_signatures(part: DecodedSlice, rows: np.ndarray, columns: Mapping[str, Any],
                     ops: list[Any], at: int) -> np.ndarray:
    """The signature (op + sizes (for shape-bound ops) + dtypes, inputs and outputs) of each of a
    slice's collective rows `rows`; the slice's rows start at row `at` of `columns`
    (SIGNATURE_COLUMNS -> column or None)."""
    c_ops = part.op[rows]
    length = len(part.rank)
    sliced = {c: v.slice(at, length) if v is not None else None for c, v in columns.items()}
    size_sig, dtype_sig = io_signatures(ops, c_ops, sliced, rows)
    return combine_signatures(c_ops.astype(np.uint64), size_sig, dtype_sig)


class KeyDetails:
    """Per (group, seq): the ranks, times, ops and local pg ids of its rows."""

    def __init__(
        self,
        table: pa.Table,
        rows_of: dict[tuple[int, int], np.ndarray],
        times: LazyColumn,
        decoder: SliceDecoder,
    ) -> None:
        self.rows_of = rows_of
        all_rows = np.concatenate(list(rows_of.values())) if rows_of else np.empty(0, np.int64)
        index = {int(r): i for i, r in enumerate(all_rows.tolist())}
        self.index = index
        needed = [
            c
            for c in ("rank", "op", "pg_id", *SIGNATURE_COLUMNS)
            if c in table.column_names
        ]
        small = table.select(needed)
        taken = take_rows(small, all_rows) if all_rows.shape[0] else small.slice(0, 0)
        self.rank = filled_values(taken.column("rank"), -1).astype(np.int64)
        self.time, self.time_valid = times.at(all_rows)
        n = taken.num_rows
        self.op = decoder.ops.codes(taken.column("op") if "op" in taken.column_names else None, n)
        self.pg_id = decoder.ids.codes(
            taken.column("pg_id") if "pg_id" in taken.column_names else None, n
        )
        self.decoder = decoder
        self.taken = taken

    def positions(self, g: int, s: int) -> np.ndarray:
        rows = self.rows_of.get((g, s))
        if rows is None:
            return np.empty(0, np.int64)
        return np.array([self.index[int(r)] for r in rows.tolist()], np.int64)

    def time_op(
        self, g: int, s: int, among: Sequence[int] | None
    ) -> tuple[int, str | None, str | None]:
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


def key_mismatch(analysis: Analysis, details: KeyDetails, g: int, s: int) -> Mismatch | None:
    """The mismatch at (group g, seq s): the ranks whose op, sizes or dtypes differ from the
    majority's (a tie named as one), or None where every rank's entry agrees."""
    pos = details.positions(g, s)
    if pos.shape[0] == 0:
        return None
    taken = details.taken.take(row_indices(pos))
    ops = details.decoder.ops.values
    op_codes = details.op[pos]
    local = np.arange(taken.num_rows, dtype=np.int64)
    size_sig, dtype_sig = io_signatures(ops, op_codes, signature_columns(taken), local)
    ranks = details.rank[pos]
    signature: dict[int, tuple[int, int, int]] = {}
    for i in range(len(pos)):
        signature.setdefault(int(ranks[i]), (int(op_codes[i]), int(size_sig[i]), int(dtype_sig[i])))
    ranked = Counter(signature.values()).most_common()
    if len(ranked) < 2:
        return None
    top = ranked[0][1]
    tie = ranked[1][1] == top
    majority_sig = (
        ranked[0][0]
        if not tie
        else min(
            (sig for sig, c in ranked if c == top),
            key=lambda sig: min(r for r, v in signature.items() if v == sig),
        )
    )
    odd = tuple(sorted(r for r, v in signature.items() if v != majority_sig))
    majority = tuple(sorted(r for r, v in signature.items() if v == majority_sig))
    kind = (
        HangVerdict.OP_MISMATCH
        if len({v[0] for v in signature.values()}) > 1
        else HangVerdict.SIZE_MISMATCH
    )
    valid = details.time_valid[pos]
    t = int(details.time[pos][valid].min()) if valid.any() else np.iinfo(np.int64).max
    describe = _describe_entries(taken, ranks, [ops[c] if c >= 0 else None for c in op_codes])
    op = ops[majority_sig[0]] if 0 <= majority_sig[0] < len(ops) else None
    pid = Counter(int(c) for c in details.pg_id[pos[:64]]).most_common(1)[0][0]
    what = "op" if kind == HangVerdict.OP_MISMATCH else "size/dtype"
    detail = (f"{analysis.label(g)} seq {s}: {what} mismatch, rank(s) {ranks_text(odd)} differ "
              "from "
              f"rank(s) {ranks_text(majority)}{' (a tie)' if tie else ''}: {describe}")
    return Mismatch(g, s, kind, odd, majority, tie, t, detail, op,
                     str(details.decoder.ids.values[pid]) if pid >= 0 else None)


# (op code, size signature (0 where shapes need not agree), dtype signature)
Signature = tuple[int, int, int]


def signatures_of_keys(decoder: SliceDecoder, table: pa.Table,
                       wanted: set[tuple[int, int]]) -> dict[tuple[int, int], dict[int, Signature]]:
    """(group, seq) -> rank -> its entry's signature, for the keys that have rows."""
    rows_of = rows_for_keys(decoder, wanted)
    if not rows_of:
        return {}
    keys = list(rows_of)
    all_rows = np.concatenate([rows_of[k] for k in keys])
    needed = [c for c in ("rank", "op", *SIGNATURE_COLUMNS) if c in table.column_names]
    taken = take_rows(table.select(needed), all_rows)
    n = taken.num_rows
    ops = decoder.ops.codes(taken.column("op") if "op" in needed else None, n)
    size_sig, dtype_sig = io_signatures(
        decoder.ops.values, ops, signature_columns(taken), np.arange(n, dtype=np.int64)
    )
    ranks = filled_values(taken.column("rank"), -1).astype(np.int64)
    by_key: dict[tuple[int, int], dict[int, Signature]] = {}
    i = 0
    for key in keys:
        sigs: dict[int, Signature] = {}
        for j in range(i, i + len(rows_of[key])):
            sigs.setdefault(int(ranks[j]), (int(ops[j]), int(size_sig[j]), int(dtype_sig[j])))
        by_key[key] = sigs
        i += len(rows_of[key])
    return by_key


def break_ties(analysis: Analysis, decoder: SliceDecoder, table: pa.Table) -> None:
    """A mismatch between equally many ranks (a group of two: its members disagree, one against one)
    says nobody's side by count. The same collective elsewhere does: first the same sequence id in
    the other groups playing the same part (the other DP groups' DP all_reduce of that step), then
    the group's own neighbouring collectives. Where exactly one side's op, sizes and dtypes are
    those the others agree on, that side is the majority and the other the odd ranks; else the tie
    stands."""
    ties = [m for m in analysis.mismatches if m.tie]
    if not ties:
        return
    by_role = groups_by_role(analysis)
    references: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = []
    wanted: set[tuple[int, int]] = set()
    for m in ties:
        same = [(g, m.seq) for g in by_role.get(group_role(analysis, m.group), ()) if g != m.group][
            :64
        ]
        own = [(m.group, m.seq + d) for d in (-3, -2, -1, 1, 2, 3) if m.seq + d >= 0]
        references.append((same, own))
        wanted |= {(m.group, m.seq), *same, *own}
    by_key = signatures_of_keys(decoder, table, wanted)
    if not by_key:
        return
    for m, (same, own) in zip(ties, references, strict=True):
        sides: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        for rank, sig in by_key.get((m.group, m.seq), {}).items():
            sides[sig].append(rank)
        for refs, how in ((same, "the same collective of the other groups playing its part"),
                          (own, "the group's own neighbouring collectives")):
            agreed = {next(iter(set(by_key[k].values()))) for k in refs
                      if k in by_key and len(set(by_key[k].values())) == 1}
            matching = [sig for sig in sides if sig in agreed]
            if len(matching) == 1 and len(sides) >= 2:
                majority = tuple(sorted(sides[matching[0]]))
                odd = tuple(
                    sorted(r for sig, who in sides.items() if sig != matching[0] for r in who)
                )
                before = (f"rank(s) {ranks_text(m.odd)} differ from rank(s) "
                          f"{ranks_text(m.majority)} (a tie)")
                m.detail = (m.detail.replace(before, f"rank(s) {ranks_text(odd)} differ from "
                                                     "rank(s) "
                                                     f"{ranks_text(majority)}")
                            + f"; the tie is broken by {how}: rank(s) {ranks_text(majority)} match "
                              "them, rank(s) "
                              f"{ranks_text(odd)} do not")
                m.odd, m.majority, m.tie = odd, majority, False
                break


def p2p_divergences(analysis: Analysis, table: pa.Table, rows: np.ndarray, decoder: SliceDecoder,
                    times: LazyColumn) -> None:
    """The p2p divergences of the p2p `rows`, per pair of peers by p2p_seq_id: a rank whose send or
    recv waits on a peer behind it, or on one without a dump, adds an edge of the wait-for graph."""
    if "p2p_seq_id" not in table.column_names or rows.shape[0] == 0:
        return
    taken = take_rows(table, rows)
    part = SliceDecoder.decode(_replace_table(decoder, taken), 0, taken.num_rows)
    p2p_seq, p2p_valid = int_column(taken.column("p2p_seq_id"))
    created, created_valid = times.at(rows)
    ops = decoder.ops.values
    parsed: dict[int, tuple[int, int] | None] = {}
    for code in distinct(part.op):
        match = P2P_OP.search(str(ops[code])) if code >= 0 else None
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
        value = (
            int(p2p_seq[i]),
            bool(part.complete[i]),
            int(created[i]) if created_valid[i] else 0,
        )
        if key not in best or value[0] > best[key][0]:
            best[key] = (value[0], value[1] and best.get(key, (0, True, 0))[1], value[2])
        elif not value[1]:
            best[key] = (best[key][0], False, best[key][2])
    for (g, a, b), (seq_a, done_a, t_a) in best.items():
        if len(peers[(g, a)]) != 1:
            continue
        if b in analysis.missing:
            if not done_a:
                analysis.divergences.append(Divergence(
                    g, "missing", seq_a, (b,), (a,), t_a, None, None,
                    f"{analysis.label(g)} p2p: rank {a} waits on rank {b}, which wrote no dump"))
            continue
        if b not in analysis.dumped or len(peers.get((g, b), ())) > 1:
            continue
        seq_b = best.get((g, b, a), (-1, True, 0))[0]
        if seq_a > seq_b and not done_a:
            analysis.divergences.append(Divergence(
                g, "p2p", seq_b + 1, (b,), (a,), t_a, None, None,
                f"{analysis.label(g)} p2p: rank {a} posted p2p op {seq_a} with rank {b}, which is "
                f"at {seq_b}"))


def _replace_table(decoder: SliceDecoder, table: pa.Table) -> SliceDecoder:
    """The decoder's code spaces over another table (the taken p2p rows)."""
    clone = SliceDecoder.__new__(SliceDecoder)
    clone.__dict__.update(decoder.__dict__)
    clone.table = table
    # what the original's slices hold and their index are not this table's
    clone.holds, clone.index = {}, {}
    return clone


def _describe_entries(taken: pa.Table, ranks: np.ndarray, ops: list[Any]) -> str:
    parts = []
    shown: dict[tuple[Any, Any], list[int]] = defaultdict(list)

    def values(column: str) -> list[Any]:
        if column in taken.column_names:
            return taken.column(column).to_pylist()
        return [None] * len(ranks)

    sizes, dtypes = values("input_sizes"), values("input_dtypes")
    out_sizes, out_dtypes = values("output_sizes"), values("output_dtypes")
    # the outputs are shown where they are not the inputs (an uneven broadcast, an all_gather)
    differ = any((out_sizes[i], out_dtypes[i]) != (sizes[i], dtypes[i])
                 for i in range(len(ranks)) if out_sizes[i] is not None)
    for i in range(len(ranks)):
        what = repr(sizes[i]) + " " + repr(dtypes[i])
        if differ:
            what += f" -> {out_sizes[i]!r} {out_dtypes[i]!r}"
        shown[(ops[i], what)].append(int(ranks[i]))
    for (op, what), who in list(shown.items())[:4]:
        parts.append(f"{op} {what} on rank(s) {ranks_text(sorted(set(who)), 6)}")
    return "; ".join(parts)


