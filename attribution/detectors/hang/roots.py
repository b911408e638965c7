"""Deciding: the independent roots of the wait-for graph (its terminal strongly connected
components, cycles broken by the skippers skips.py finds), merged where ranks are stuck together,
with the mismatches placed; each root described (describe.py)."""

from collections import defaultdict

import numpy as np

from faultlens.attribution.detectors.hang.blocked import settle_blocked_roots
from faultlens.attribution.detectors.hang.describe import (
    describe_root,
    headline,
    rooted_report,
    rootless_report,
)
from faultlens.attribution.detectors.hang.graph import (
    BIG,
    Analysis,
    Mismatch,
    Root,
    checked,
    strongly_connected,
)
from faultlens.attribution.detectors.hang.hidden_p2p import (
    mark_hidden_p2p_waits,
    mark_unseen_member_waits,
)
from faultlens.attribution.detectors.hang.missing_roots import (
    settle_missing_roots,
    skips_beside_missing,
)
from faultlens.attribution.detectors.hang.report import HangReport
from faultlens.attribution.detectors.hang.skips import (
    skipped,
    skipped_by_blocking,
    skipped_by_consensus,
)


class _WaitGraph:
    """Ranks and divergences as a wait-for graph: waiter -> divergence hub -> laggard."""

    def __init__(self, analysis: Analysis) -> None:
        self.divergences = analysis.divergences
        self.rank_nodes = sorted(analysis.dumped | analysis.missing)
        self.node_of = {r: i for i, r in enumerate(self.rank_nodes)}
        self.n_ranks = len(self.rank_nodes)

    def build(self, dropped: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Edges (src, dst) without the out-edges of `dropped` ranks, and strongly connected
        component labels.
        """
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
        labels = strongly_connected(self.n_ranks + len(self.divergences), src_a, dst_a)
        return src_a, dst_a, labels


def decide(analysis: Analysis) -> HangReport:
    """The wait-for graph's independent roots (see the module docstring), each with its own kind and
    chain.
    """
    graph = _WaitGraph(analysis)
    # a rank that joined a collective its own group's peers completed is stuck inside it, whatever
    # it (or its enqueued later work) waits on elsewhere: a culprit in its own right (only where the
    # dumps carry device states, as NCCL's do: gloo's entries are always 'scheduled' and `retired`
    # depends on when each rank dumped, so there a last unretired entry is no evidence of a stall)
    stalled = (
        {
            lag
            for d in analysis.divergences
            if d.level in ("completed", "started")
            for lag in d.laggards
        }
        if analysis.device_states
        else set()
    )
    skippers, components, src, dst = _break_cycles(analysis, graph, stalled)
    dropped = set(skippers) | stalled

    def rebuilt() -> list[Root]:
        src, dst, labels = graph.build(dropped)
        components = _terminal_components(graph.n_ranks, src, dst, labels, graph.rank_nodes)
        return _merge_roots(_component_roots(analysis, graph, components, src, dst, dropped))

    roots = settle_missing_roots(
        analysis,
        _merge_roots(_component_roots(analysis, graph, components, src, dst, dropped)),
        rebuilt,
    )
    roots = settle_blocked_roots(analysis, roots, rebuilt)
    mark_hidden_p2p_waits(analysis, roots, skippers)
    mark_unseen_member_waits(analysis, roots)
    follow_on_mismatches = _place_mismatches(analysis, roots)
    built = [describe_root(analysis, root, skippers) for root in roots]
    built.sort(key=lambda b: (-len(b[0].waiting_ranks), b[1], b[0].ranks))
    hang_roots = tuple(b[0] for b in built)
    if hang_roots:
        return rooted_report(analysis, roots, hang_roots, skippers, follow_on_mismatches)
    return rootless_report(analysis)


def _break_cycles(analysis: Analysis, graph: _WaitGraph, stalled: set[int]
                  ) -> tuple[dict[int, str], list[list[int]], np.ndarray, np.ndarray]:
    """Terminal components; cycles broken by each rank's own order (consensus of the others), then
    history. Returns the skippers (rank -> why), the terminal components and the final graph's
    edges."""
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
        # a cycle is an order inversion (one member went past a collective another waits in)
        # wherever it lies: one that also waits on a root elsewhere (a rank the trace shows silent)
        # still has its skipper
        for comp in [
            *components,
            *_cycles_with_exit(graph.n_ranks, src, dst, labels, graph.rank_nodes),
        ]:
            if len(comp) < 2:
                continue
            members = set(comp)
            candidates = sorted((members & laggards) - analysis.missing - set(skippers))[:64]
            verdicts = checked(
                analysis,
                candidates,
                lambda rank, members=members: (
                    skipped_by_consensus(analysis, rank, members, divergences)
                    or skipped(analysis, rank, divergences)
                ),
            )
            if not any(verdicts.values()) and not members & set(skippers):
                found.update(skipped_by_blocking(analysis, members, divergences))
            found.update((rank, verdict) for rank, verdict in verdicts.items() if verdict)
        if not found:
            break
        skippers.update(found)
    # a skip need not close a cycle: with no later collective that needs its waiting peers, the
    # skipper goes on (its later collectives of the group pair with its peers' earlier ones) until
    # it is done or blocked elsewhere, a terminal rank alone; its own entry order against the
    # others' still shows it went past
    alone = [comp[0] for comp in components if len(comp) == 1]
    candidates = [
        r for r in alone if r in laggards and r not in set(skippers) | analysis.missing | stalled
    ][:64]
    verdicts = checked(
        analysis,
        candidates,
        lambda rank: skipped_by_consensus(analysis, rank, {rank}, divergences, look_back=True),
    )
    skippers.update((rank, verdict) for rank, verdict in verdicts.items() if verdict)
    if skips_beside_missing(analysis, components, skippers, stalled):
        src, dst, labels = graph.build(set(skippers) | stalled)
        components = _terminal_components(graph.n_ranks, src, dst, labels, graph.rank_nodes)
    return skippers, components, src, dst


def _component_roots(
    analysis: Analysis,
    graph: _WaitGraph,
    components: list[list[int]],
    src: np.ndarray,
    dst: np.ndarray,
    dropped: set[int],
) -> list[Root]:
    """One root per terminal component, with who waits on it (reverse reachability over the graph
    without the skippers' out-edges) and its own divergences."""
    reverse: dict[int, list[int]] = defaultdict(list)
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        reverse[b].append(a)
    roots: list[Root] = []
    for comp in components:
        root = Root(sorted(comp), cyclic=len(comp) > 1 and not (set(comp) & dropped))
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


def _merge_roots(roots: list[Root]) -> list[Root]:
    """Ranks stuck in one collective together (two_in_one_group) are one root, not two."""
    merged: dict[tuple, Root] = {}
    for root in roots:
        head = headline(root)
        # one collective (not a stack)
        together = head is not None and not root.cyclic and head.seq is not None
        key = (head.group, head.seq, head.level) if together else ("own", *root.ranks)
        if key in merged:
            other = merged[key]
            other.ranks = sorted(set(other.ranks) | set(root.ranks))
            other.waiting = (other.waiting | root.waiting) - set(other.ranks)
            have = {id(d) for d in other.divergences}
            other.divergences += [d for d in root.divergences if id(d) not in have]
        else:
            merged[key] = root
    return list(merged.values())


def _place_mismatches(analysis: Analysis, roots: list[Root]) -> list[Mismatch]:
    """Each mismatch becomes a root of its own, evidence of a root it belongs to (appended to
    `roots` in place), or a follow-on (returned)."""
    culprit_ranks = {r for root in roots for r in root.ranks}
    waiting_all = {w for root in roots for w in root.waiting} - culprit_ranks
    follow_on_mismatches: list[Mismatch] = []
    # rank -> when it first waited on anyone (time of that collective)
    first_wait: dict[int, int] = {}
    if analysis.mismatches:
        for d in analysis.divergences:
            for w in d.waiters:
                if d.time < first_wait.get(w, BIG):
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
        # a mismatch is a follow-on only where its odd ranks were already waiting on a root when
        # they made it (an error path's extra collective); one made before (a completed all_reduce
        # of another shape) is a root
        waits_since = [first_wait[r] for r in odd if r in first_wait]
        if odd <= waiting_all and waits_since and min(waits_since) < m.time:
            follow_on_mismatches.append(m)
            continue
        roots.append(Root(sorted(odd), mismatches=[m]))
        culprit_ranks |= odd
    return follow_on_mismatches


def _components(n_ranks: int, src: np.ndarray, dst: np.ndarray, labels: np.ndarray
                ) -> tuple[dict[int, list[int]], set[int]]:
    """The rank nodes of each strongly-connected component (by label), and the labels of those that
    wait on something outside themselves."""
    crossing = labels[src] != labels[dst]
    has_exit = set(labels[src[crossing]].tolist())
    members_of: dict[int, list[int]] = defaultdict(list)
    for node in range(n_ranks):
        members_of[int(labels[node])].append(node)
    return members_of, has_exit


def _cycles_with_exit(n_ranks: int, src: np.ndarray, dst: np.ndarray, labels: np.ndarray,
                      rank_nodes: list[int]) -> list[list[int]]:
    """The ranks of each strongly-connected component of two ranks or more that waits on something
    outside it.
    """
    if src.shape[0] == 0:
        return []
    members_of, has_exit = _components(n_ranks, src, dst, labels)
    return sorted(sorted(rank_nodes[node] for node in nodes) for label, nodes in members_of.items()
                  if label in has_exit and len(nodes) >= 2)


def _terminal_components(n_ranks: int, src: np.ndarray, dst: np.ndarray, labels: np.ndarray,
                         rank_nodes: list[int]) -> list[list[int]]:
    """The ranks of each terminal strongly-connected component (nothing it waits on) that someone
    waits on.
    """
    if src.shape[0] == 0:
        return []
    members_of, has_exit = _components(n_ranks, src, dst, labels)
    waited_on = set(dst[dst < n_ranks].tolist())
    out = []
    for label, nodes in members_of.items():
        if label in has_exit or not any(node in waited_on for node in nodes):
            continue
        out.append(sorted(rank_nodes[node] for node in nodes))
    return sorted(out)

