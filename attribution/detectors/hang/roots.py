"""Deciding: independent roots of the wait-for graph, cycle breaking, kinds, evidence, confidence."""

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from faultlens.attribution.detectors.hang.graph import (
    _Analysis,
    _Divergence,
    _Mismatch,
    _ranks_text,
    _strongly_connected,
)
from faultlens.attribution.detectors.hang.report import _FAMILY, MAX_EVIDENCE, HangReport, HangRoot, HangVerdict

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


class _WaitGraph:
    """Ranks and divergences as a wait-for graph: waiter -> divergence hub -> laggard."""

    def __init__(self, analysis: _Analysis) -> None:
        self.divergences = analysis.divergences
        self.rank_nodes = sorted(analysis.dumped | analysis.missing)
        self.node_of = {r: i for i, r in enumerate(self.rank_nodes)}
        self.n_ranks = len(self.rank_nodes)

    def build(self, dropped: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Edges (src, dst) without the out-edges of `dropped` ranks, and strongly connected component labels."""
        src: list[int] = []
        dst: list[int] = []
        node_of = self.node_of
        for i, d in enumerate(self.divergences):
            hub = self.n_ranks + i
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
        labels = _strongly_connected(self.n_ranks + len(self.divergences), src_a, dst_a)
        return src_a, dst_a, labels


def _decide(analysis: _Analysis) -> HangReport:
    """The wait-for graph's independent roots (see the module docstring), each with its own kind and chain."""
    graph = _WaitGraph(analysis)
    # a rank that joined a collective its own group's peers completed is stuck inside it, whatever it (or its
    # enqueued later work) waits on elsewhere: a culprit in its own right
    # (only where the dumps carry device states, as NCCL's do: gloo's entries are always 'scheduled' and
    # `retired` depends on when each rank dumped, so there a last unretired entry is no evidence of a stall)
    stalled = {lag for d in analysis.divergences if d.level in ("completed", "started") for lag in d.laggards} \
        if analysis.device_states else set()
    skippers, components, src, dst = _break_cycles(analysis, graph, stalled)
    roots = _merge_roots(_component_roots(analysis, graph, components, src, dst, set(skippers) | stalled))
    follow_on_mismatches = _place_mismatches(analysis, roots)
    built = [_describe_root(analysis, root, skippers) for root in roots]
    built.sort(key=lambda b: (-len(b[0].waiting_ranks), b[1], b[0].ranks))
    hang_roots = tuple(b[0] for b in built)
    if hang_roots:
        return _rooted_report(analysis, roots, hang_roots, skippers, follow_on_mismatches)
    return _rootless_report(analysis)


def _break_cycles(analysis: _Analysis, graph: _WaitGraph, stalled: set[int]
                  ) -> tuple[dict[int, str], list[list[int]], np.ndarray, np.ndarray]:
    """Terminal components; cycles broken by each rank's own order (consensus of the others), then history.
    Returns the skippers (rank -> why), the terminal components and the final graph's edges."""
    divergences = analysis.divergences
    skippers: dict[int, str] = {}
    components: list[list[int]] = []
    src = dst = np.empty(0, np.int64)
    if not divergences:
        return skippers, components, src, dst
    laggards = {lag for d in divergences for lag in d.laggards}
    for _ in range(4):
        src, dst, labels = graph.build(set(skippers) | stalled)
        components = _terminal_components(graph.n_ranks, src, dst, labels, graph.rank_nodes)
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
    return skippers, components, src, dst


def _component_roots(analysis: _Analysis, graph: _WaitGraph, components: list[list[int]], src: np.ndarray,
                     dst: np.ndarray, dropped: set[int]) -> list[_Root]:
    """One root per terminal component, with who waits on it (reverse reachability over the graph without the
    skippers' out-edges) and its own divergences."""
    reverse: dict[int, list[int]] = defaultdict(list)
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        reverse[b].append(a)
    roots: list[_Root] = []
    for comp in components:
        root = _Root(sorted(comp), cyclic=len(comp) > 1 and not (set(comp) & dropped))
        seen = {graph.node_of[r] for r in comp}
        stack = list(seen)
        while stack:
            node = stack.pop()
            for prev in reverse.get(node, ()):
                if prev not in seen:
                    seen.add(prev)
                    stack.append(prev)
        root.waiting = {graph.rank_nodes[n] for n in seen if n < graph.n_ranks} - set(comp)
        members = set(comp)
        root.divergences = [d for d in analysis.divergences if not members.isdisjoint(d.laggards)]
        roots.append(root)
    return roots


def _merge_roots(roots: list[_Root]) -> list[_Root]:
    """Ranks stuck in one collective together (two_in_one_group) are one root, not two."""
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
    return list(merged.values())


def _place_mismatches(analysis: _Analysis, roots: list[_Root]) -> list[_Mismatch]:
    """Each mismatch becomes a root of its own, evidence of a root it belongs to (appended to `roots` in place),
    or a follow-on (returned)."""
    culprit_ranks = {r for root in roots for r in root.ranks}
    waiting_all = {w for root in roots for w in root.waiting} - culprit_ranks
    follow_on_mismatches: list[_Mismatch] = []
    first_wait: dict[int, int] = {}  # rank -> when it first waited on anyone (time of that collective)
    if analysis.mismatches:
        for d in analysis.divergences:
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
    return follow_on_mismatches


def _rooted_report(analysis: _Analysis, roots: list[_Root], hang_roots: tuple[HangRoot, ...],
                   skippers: dict[int, str], follow_on_mismatches: list[_Mismatch]) -> HangReport:
    """The report of a hang with at least one root: the first root heads it, every root is listed."""
    culprits = sorted({r for root in hang_roots for r in root.ranks})
    waiting = sorted({w for root in hang_roots for w in root.waiting_ranks} - set(culprits))
    unresolved = any(root.kind == HangVerdict.CYCLE for root in hang_roots)
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
    explained = [d for d in analysis.divergences if id(d) not in own]
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
        never_joined=never, stalled=stalled, missing_dumps=tuple(sorted(analysis.missing)), reason=reason,
        confidence=round(min(root.confidence for root in hang_roots), 3),
        evidence=tuple(list(analysis.evidence) + lines), roots=hang_roots, follow_ons=tuple(waiting),
        unresolved_cycle=unresolved)


def _rootless_report(analysis: _Analysis) -> HangReport:
    """No root: missing dumps, a group stuck as a whole, or no hang."""
    evidence = list(analysis.evidence)
    missing = tuple(sorted(analysis.missing))
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
