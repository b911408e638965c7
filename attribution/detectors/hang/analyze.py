"""analyze_collectives: pass 1 (progress per group and rank), pass 2 (details of the keys that need
them).
"""

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from faultlens.attribution.detectors.hang.aggregate import SignatureTable
from faultlens.attribution.detectors.hang.blocked import (
    settle_blocked_laggards,
    settle_inside_previous,
)
from faultlens.attribution.detectors.hang.columns import LazyColumn, filled_values
from faultlens.attribution.detectors.hang.decode import COMPILE_ROWS, SliceDecoder
from faultlens.attribution.detectors.hang.describe import report_empty
from faultlens.attribution.detectors.hang.details import (
    KeyDetails,
    break_ties,
    key_mismatch,
    p2p_divergences,
    stack_edges,
)
from faultlens.attribution.detectors.hang.graph import (
    Analysis,
    Divergence,
    MissingGroup,
    ranks_text,
)
from faultlens.attribution.detectors.hang.lookups import install as install_lookups
from faultlens.attribution.detectors.hang.lookups import rows_for_keys
from faultlens.attribution.detectors.hang.lost_members import complete_with_missing
from faultlens.attribution.detectors.hang.partners import partner_mismatches
from faultlens.attribution.detectors.hang.pass_one import PassOne, run_pass_one
from faultlens.attribution.detectors.hang.report import HangReport
from faultlens.attribution.detectors.hang.roots import decide
from faultlens.attribution.detectors.hang.seq_consistency import release_unreadable_waits
from faultlens.attribution.detectors.hang.stacks import stacks_from_metadata
from faultlens.attribution.detectors.hang.stream import PassOneStream
from faultlens.attribution.detectors.hang.unseen_members import unanimous_membership
from faultlens.attribution.detectors.hang.waits import settle_missing
from faultlens.compiled import compile_above

MAX_MISMATCH_KEYS = 256  # (group, seq) keys of mismatching signatures examined in detail


def analyze_collectives(collectives: pa.Table, expected_ranks: Sequence[int] | None = None,
                        stacks: Mapping[int, Any] | None = None,
                        first_pass: PassOneStream | None = None,
                        timed_out: Collection[int] = (),
                        unreadable: Collection[int] = (),
                        complete_members: bool = True) -> HangReport:
    """Analyse one dump set's `collectives` rows (any number of ranks). See the module docstring.

    stacks: rank -> faultlens.collectors.sources.pystack.ProcessStack (py-spy), where taken;
    default: the table's schema metadata `faultlens.stacks` (attach_stacks), else none. They name
    where a culprit that never joined is, and give the send/recv waits that gloo does not record.

    The table may hold only the columns the analysis reads (COLUMNS) and may keep strings
    dictionary-encoded; it is read in slices of SLICE_ROWS, so the analysis' own memory stays
    bounded on very large sets.

    first_pass: a PassOneStream (stream.py) that ran pass 1 on the table's chunks while they were
    read; used where its chunks are the table's slices, else pass 1 runs here.

    timed_out: ranks whose own exit error says they were waiting on a peer (a collective's timeout,
    "Timed out waiting ...", or the echo of a peer's exit, rules/crash.yaml secondary_patterns):
    where they wrote no dump they are waiters, never culprits by absence; a rank that dumped and
    stopped in its own code is what they waited on (describe.rootless_report).

    unreadable: ranks whose dump was refused (or contradicts its group: seq_consistency.py): no
    rows here, like a missing dump, but they did dump; a wait on one never hides a culprit that the
    other dumps show (seq_consistency.release_unreadable_waits).

    complete_members: where a group only one rank recorded leaves its other members unknown (gloo's
    raw pg_config), try every membership the dumps allow and keep the answer they all give
    (unseen_members.py)."""
    missing_columns = [
        c for c in ("rank", "collective_seq_id") if c not in collectives.column_names
    ]
    if missing_columns:
        raise ValueError(f"collectives table lacks column(s) {', '.join(missing_columns)}")
    table = collectives
    if table.num_rows == 0:
        return report_empty(expected_ranks)
    if stacks is None:
        stacks = stacks_from_metadata(table)
    compile_above(table.num_rows, COMPILE_ROWS)
    decoder = SliceDecoder(table)
    taken = first_pass.take(table) if first_pass is not None else None
    if taken is not None:
        first, decoder = taken
    else:
        first = run_pass_one(table, decoder)
    if not first.dumped:
        return report_empty(expected_ranks)
    agg = first.progress.progress()
    analysis = _membership(first, agg, decoder, expected_ranks)
    analysis.timed_out = {int(r) for r in timed_out}
    analysis.unreadable = {int(r) for r in unreadable} & analysis.missing
    progress = _progress(agg)
    # completion is evidence only where entries carry device states (NCCL's 'started'/'completed');
    # gloo's are always 'scheduled' and `retired` depends on when each rank dumped (a rank that
    # dumped at the end of a run before its last barrier was retired is no stalled rank), so there
    # only entering is compared
    device_states = any(str(v) in ("started", "completed") for v in decoder.states.values)
    # gloo records no send/recv: a rank blocked in one looks stuck in its own code (hidden_p2p.py)
    analysis.p2p_unrecorded = any(str(v).startswith("gloo:") for v in decoder.ops.values)
    pending, stuck_pending = _group_divergences(analysis, progress, device_states)
    bad_keys = first.signatures.differing(MAX_MISMATCH_KEYS)  # (group, seq) whose ranks disagree
    first.signatures = SignatureTable()
    times = _pass_two(analysis, table, decoder, pending, stuck_pending, bad_keys)
    break_ties(analysis, decoder, table)
    partner_mismatches(
        analysis,
        decoder,
        table,
        times,
        {g: max(v[0] for v in by_rank.values()) for g, by_rank in progress.items() if by_rank},
    )
    _mismatch_waits(analysis, progress)
    p2p_all = np.concatenate(first.p2p_rows) if first.p2p_rows else np.empty(0, np.int64)
    p2p_divergences(analysis, table, p2p_all, decoder, times)
    _attach_history(analysis, decoder, progress, device_states)
    if stacks:
        stack_edges(analysis, stacks)
    settle_inside_previous(analysis)
    if stacks:
        settle_blocked_laggards(analysis)
    settle_missing(analysis)
    release_unreadable_waits(analysis)
    report = decide(analysis)
    if not complete_members:
        return report
    return unanimous_membership(table, analysis, report, lambda t: analyze_collectives(
        t, expected_ranks, stacks, None, timed_out, unreadable, complete_members=False))


def rows_by_value(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, its rows in ascending order) for each distinct value, ascending: one sort (a mask per
    value was values x rows: ~0.3 s for the groups of 16,384 ranks)."""
    if values.shape[0] == 0:
        return []
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], ordered.shape[0]]
    return [
        (value, order[start:end])
        for value, start, end in zip(
            ordered[starts].tolist(), starts.tolist(), ends.tolist(), strict=True
        )
    ]


def _membership(first: PassOne, agg: pa.Table, decoder: SliceDecoder,
                expected_ranks: Sequence[int] | None) -> Analysis:
    """Each group's members (its config where sound, else the ranks seen in it), the expected and
    missing ranks.
    """
    seen_table = first.progress.seen()
    group_descs: dict[int, str | None] = {}
    seen: dict[int, set[int]] = defaultdict(set)
    for keys in (seen_table, agg):
        groups_col, ranks_col = filled_values(keys.column("g")), filled_values(keys.column("r"))
        descs_col = filled_values(keys.column("d_min_min"), -1)
        for g, mine in rows_by_value(groups_col):
            seen[int(g)].update(ranks_col[mine].tolist())
            d = descs_col[mine].max()
            if d >= 0 and int(g) not in group_descs:
                group_descs[int(g)] = decoder.descs.values[int(d)]
    dumped, configured = first.dumped, first.configured
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
    hidden = complete_with_missing(members, group_descs, rebuilt, expected, missing)
    for g, extra in hidden.items():
        members[g] = tuple(sorted({*members[g], *extra}))
    analysis = Analysis(decoder.labels(), group_descs, members, rebuilt, dumped, expected, missing)
    if rebuilt:
        shown = [analysis.label(g) + f": [{ranks_text(members[g])}]" for g in sorted(rebuilt)][:6]
        analysis.evidence.append("pg_config unusable for " + ", ".join(shown)
                                 + " - membership rebuilt from the entries")
    if hidden:
        shown = [f"{analysis.label(g)} + rank(s) {ranks_text(extra)}"
                 for g, extra in sorted(hidden.items())][:6]
        analysis.evidence.append("members without a dump placed by the groups of their part ("
                                 "lost_members.py): " + ", ".join(shown))
    if missing:
        analysis.evidence.append(f"no dump from rank(s) {ranks_text(sorted(missing))} (expected "
                                 f"{len(expected)} ranks, read {len(dumped)})")
    return analysis


_Progress = dict[int, dict[int, tuple[int, int, int, bool]]]


def _progress(agg: pa.Table) -> _Progress:
    """group -> rank -> (last entered, last completed, last started, has an incomplete entry)."""
    big = np.iinfo(np.int64).max
    e_arr = filled_values(agg.column("s_max_max"))
    first_inc = filled_values(agg.column("s_incomplete_min_min"), big)
    last_inc = filled_values(agg.column("s_incomplete_max_max"), -1)
    last_done = filled_values(agg.column("s_complete_max_max"), -1)
    # collectives of one group complete in order: a completed entry means every earlier one
    # completed too (gloo leaves some entries unretired that did complete, e.g. an async all_reduce
    # right after a send)
    c_arr = np.maximum(np.where(first_inc == big, e_arr, first_inc - 1), last_done)
    has_inc = last_inc > last_done
    s_arr = np.maximum(filled_values(agg.column("s_started_max_max"), -1), last_done)
    progress: _Progress = defaultdict(dict)
    for g, r, e, c, st, inc in zip(
        agg.column("g").to_pylist(),
        agg.column("r").to_pylist(),
        e_arr.tolist(),
        c_arr.tolist(),
        s_arr.tolist(),
        has_inc.tolist(),
        strict=True,
    ):
        progress[g][r] = (e, c, st, inc)
    return progress


_Pending = list[tuple[Divergence, tuple[int, ...] | None, str]]
_StuckPending = list[tuple[int, int, tuple[int, ...]]]


def _group_divergences(analysis: Analysis, progress: _Progress,
                       device_states: bool) -> tuple[_Pending, _StuckPending]:
    """Divergences per group (times and ops are filled in by pass 2), and groups where every member
    is stuck.
    """
    pending: _Pending = []
    stuck_pending: _StuckPending = []
    for g, by_rank in progress.items():
        group_members = analysis.members.get(g, tuple(by_rank))
        present = [r for r in group_members if r in by_rank]
        absent_dumped = [r for r in group_members if r not in by_rank and r in analysis.dumped]
        absent_missing = tuple(r for r in group_members if r in analysis.missing)
        if not present:
            continue
        _entry_divergence(g, by_rank, present, absent_dumped, device_states, pending, stuck_pending,
                          bool(absent_missing))
        if absent_missing:
            _missing_divergence(analysis, g, by_rank, present, absent_missing, pending)
    return pending, stuck_pending


def _missing_divergence(
    analysis: Analysis,
    g: int,
    by_rank: dict[int, tuple[int, int, int, bool]],
    present: list[int],
    absent_missing: tuple[int, ...],
    pending: _Pending,
) -> None:
    """Members of group g without a dump: the present members inside one of its collectives (an
    entry not completed) wait on them (unless a member that did dump explains that wait:
    waits.settle_missing). The members at the group's latest collective are kept for the waits of
    ranks that stopped early."""
    top = max(by_rank[r][0] for r in present)
    analysis.missing_groups.append(
        MissingGroup(g, absent_missing, tuple(r for r in present if by_rank[r][0] == top))
    )
    waiting = tuple(sorted(r for r in present if by_rank[r][3]))
    if waiting:
        seq = min(by_rank[r][1] for r in waiting) + 1
        pending.append((Divergence(g, "missing", seq, absent_missing, waiting, 0), waiting,
                        f"rank(s) {ranks_text(waiting)} wait in it; it needs rank(s) "
                        f"{ranks_text(absent_missing)}, which wrote no dump"))


def _entry_divergence(g: int, by_rank: dict[int, tuple[int, int, int, bool]], present: list[int],
                      absent_dumped: list[int], device_states: bool, pending: _Pending,
                      stuck_pending: _StuckPending, any_missing: bool) -> None:
    """One group's members compared: who never entered, entered but never completed, or never
    started; else whether the whole group is stuck."""
    e_values = {r: by_rank[r][0] for r in present}
    below = min(e_values.values()) - 1
    for r in absent_dumped:
        # a dumped member with no entry of this group: it has not entered anything the dump still
        # holds
        e_values[r] = below
    e_min, e_max = min(e_values.values()), max(e_values.values())
    if e_min < e_max:
        laggards = tuple(sorted(r for r, e in e_values.items() if e == e_min))
        waiters = tuple(sorted(r for r, e in e_values.items() if e > e_min))
        pending.append((Divergence(g, "entered", e_min + 1, laggards, waiters, 0), waiters,
                        f"rank(s) {ranks_text(waiters)} entered it, rank(s) {ranks_text(laggards)} "
                        "never did "
                        f"(last entered: {e_min})"))
        return
    c_values = {r: by_rank[r][1] for r in present}
    c_min, c_max = min(c_values.values()), max(c_values.values())
    s_values = {r: by_rank[r][2] for r in present}
    s_min, s_max = min(s_values.values()), max(s_values.values())
    if c_min < c_max and device_states:
        laggards = tuple(sorted(r for r, c in c_values.items() if c == c_min))
        waiters = tuple(sorted(r for r, c in c_values.items() if c > c_min))
        pending.append((Divergence(g, "completed", c_min + 1, laggards, waiters, 0), None,
                        f"rank(s) {ranks_text(laggards)} entered it but never completed it; "
                        "rank(s) "
                        f"{ranks_text(waiters)} did"))
    elif s_min < s_max and s_min < e_max and device_states:
        laggards = tuple(sorted(r for r, st in s_values.items() if st == s_min))
        waiters = tuple(sorted(r for r, st in s_values.items() if st > s_min))
        pending.append((Divergence(g, "started", s_min + 1, laggards, waiters, 0), None,
                        f"started on rank(s) {ranks_text(waiters)}, not on rank(s) "
                        f"{ranks_text(laggards)}"))
    elif (any if device_states else all)(by_rank[r][3] for r in present) and not any_missing:
        stuck_pending.append((g, c_min + 1, tuple(sorted(r for r in present if by_rank[r][3]))))


def _pass_two(analysis: Analysis, table: pa.Table, decoder: SliceDecoder, pending: _Pending,
              stuck_pending: _StuckPending, bad_keys: list[tuple[int, int]]) -> LazyColumn:
    """Pass 2: the rows of the keys that need detail (divergent collectives, mismatches); returns
    the lazy time column the p2p pass reuses."""
    wanted = (
        {(d.group, d.seq) for d, _, _ in pending}
        | {(g, s) for g, s, _ in stuck_pending}
        | set(bad_keys)
    )
    rows_of = rows_for_keys(decoder, wanted)
    times = LazyColumn(table, "time_created")
    details = KeyDetails(table, rows_of, times, decoder)
    for d, among, text in pending:
        d.time, d.op, d.pg_id = details.time_op(d.group, d.seq, among)
        d.detail = f"{analysis.label(d.group)} seq {d.seq} {d.op or ''}: {text}"
        analysis.divergences.append(d)
    for g, seq, stuck in stuck_pending:
        analysis.stuck_groups.append((g, seq, stuck, details.time_op(g, seq, None)[0]))
    for g, s in bad_keys:
        mismatch = key_mismatch(analysis, details, g, s)
        if mismatch is not None:
            analysis.mismatches.append(mismatch)
    return times


def _mismatch_waits(analysis: Analysis, progress: _Progress) -> None:
    """A mismatched collective its group is stuck in (every member entered it, none went past it: an
    all_gather against an all_reduce) holds the majority because of the odd ranks: the majority
    members that have not completed it wait on them (a divergence "mismatch"), so the odd ranks are
    the root and the majority, and everyone waiting on the majority, follow-ons. A mismatch the
    group went past (gloo completes an all_reduce of another shape) holds nobody; a tie says
    nobody's side."""
    for m in analysis.mismatches:
        by_rank = progress.get(m.group, {})
        involved = set(m.odd) | set(m.majority)
        m.completed = bool(involved) and all(
            r in by_rank and (by_rank[r][0] > m.seq or by_rank[r][1] >= m.seq) for r in involved
        )
        if m.tie:
            continue
        if not involved or any(r not in by_rank or by_rank[r][0] != m.seq for r in involved):
            continue
        waiters = tuple(sorted(r for r in m.majority if by_rank[r][1] < m.seq))
        if waiters:
            analysis.divergences.append(Divergence(
                m.group, "mismatch", m.seq, tuple(m.odd), waiters, m.time, m.op, m.pg_id,
                f"{m.detail}; rank(s) {ranks_text(waiters)} wait in it for rank(s) "
                f"{ranks_text(m.odd)}"))


def _attach_history(
    analysis: Analysis, decoder: SliceDecoder, progress: _Progress, device_states: bool
) -> None:
    """What the root decision reads lazily: each rank's own entry order across groups, and the key
    orders (lookups.py: cached, and batched for many ranks)."""
    install_lookups(analysis, decoder)
    analysis.device_states = device_states
    analysis.incomplete = {r for by_rank in progress.values() for r, v in by_rank.items() if v[3]}
