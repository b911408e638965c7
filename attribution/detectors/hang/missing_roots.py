"""Roots made of ranks that wrote no dump, after the wait-for graph is decided: which stand.

A rank without a dump is a root where ranks that dumped wait on it and nothing else explains the
wait (waits.py decides the waits). The graph alone would still name it where:
- a rank that waits on it skipped a collective of a group they share (the missing rank's own dump
  would show it waiting there; skips_beside_missing puts that hypothesis to the same consensus as
  any skip);
- it may itself wait on another root: it shares a group with that root's ranks or the ranks waiting
  on them, and that root does not wait on it (its dump lost or late: a follow-on, far more common
  than a second, independent death), or its stack shows it alive and blocked in a collective or
  send/recv;
- a rank that dumped is seen stuck in its own code beside it and waits on nobody: the missing rank
  may wait on it.
Such missing ranks are noted, not named. Where the dumps cannot tell (a rank that stopped, no stack
to say why, beside a missing peer), both are named, below any failover.
"""

from collections import defaultdict
from collections.abc import Callable

from faultlens.attribution.detectors.hang.graph import (
    Analysis,
    Divergence,
    Root,
    checked,
    ranks_text,
)
from faultlens.attribution.detectors.hang.skips import skipped_beside_missing, skipped_by_consensus


def settle_missing_roots(
    analysis: Analysis, roots: list[Root], rebuilt: Callable[[], list[Root]]
) -> list[Root]:
    """The roots without the missing ranks that may be follow-ons; the ranks that stopped on those
    decided again (rebuilt: the roots of the graph as it now stands)."""
    extra = _ambiguous_stop_roots(analysis, roots)
    extra += _stuck_beside_missing(analysis, roots + extra)
    roots = roots + extra
    analysis.waited_missing = {
        lag
        for d in (*analysis.divergences, *analysis.ambiguous_stops)
        if d.waiters
        for lag in d.laggards
        if lag in analysis.missing
    }
    follow_ons = _possible_follow_ons(analysis, roots)
    if not follow_ons:
        return roots
    # not dead after all, then: the ranks that stopped on them stopped on their own (stuck, or
    # crashed)
    kept = [
        d
        for d in analysis.divergences
        if not (d.level == "stopped" and set(d.laggards) <= follow_ons)
    ]
    if len(kept) < len(analysis.divergences):
        analysis.divergences[:] = kept
        roots = rebuilt()
        named = {r for root in roots for r in root.ranks}
        roots += [root for root in extra if named.isdisjoint(root.ranks)]
    return [root for root in roots if not set(root.ranks) <= follow_ons]


def skips_beside_missing(analysis: Analysis, components: list[list[int]], skippers: dict[int, str],
                          stalled: set[int]) -> bool:
    """A root of ranks without a dump whose waiters may have skipped a collective they share with
    them (the missing ranks' own dumps would show them waiting in it): each skip found becomes a
    wait of the missing ranks on the skipper, and the skipper a root. Returns whether any was found.
    """
    missing = {r for comp in components if set(comp) <= analysis.missing for r in comp}
    if not missing:
        return False
    # the ranks nearest to them, all roots of missing ranks together (a job of thousands without a
    # dump: one pass)
    waiters = [
        w for w in _nearest_waiters(analysis, missing, 64) if w not in skippers and w not in stalled
    ]
    verdicts = checked(analysis, waiters, lambda rank: _skip_near_missing(analysis, rank, missing))
    found = False
    for rank, verdict in verdicts.items():
        if verdict is not None:
            hypothesis, skippers[rank] = verdict
            if hypothesis is not None:
                analysis.divergences.append(hypothesis)
            found = True
    return found


def _skip_near_missing(
    analysis: Analysis, rank: int, missing: set[int]
) -> tuple[Divergence | None, str] | None:
    """A skip of `rank` in a group it shares with `missing` ranks (the wait they would show), or in
    a group whose peers dumped (the same consensus as a terminal rank's: its wait on the missing
    ranks was no reason to stop)."""
    beside = skipped_beside_missing(analysis, rank, missing)
    if beside is not None:
        return beside
    own = skipped_by_consensus(analysis, rank, {rank}, analysis.divergences, look_back=True)
    return (None, own) if own else None


def _nearest_waiters(analysis: Analysis, ranks: set[int], limit: int) -> list[int]:
    """Up to `limit` dumped ranks that wait on `ranks`, directly first, then through other ranks."""
    waits_on: dict[int, set[int]] = defaultdict(set)
    for d in analysis.divergences:
        for lag in d.laggards:
            waits_on[lag].update(d.waiters)
    seen = set(ranks)
    order: list[int] = []
    frontier = sorted(ranks)
    while frontier and len(order) < limit:
        nearer = sorted({w for r in frontier for w in waits_on.get(r, ())} - seen)
        seen.update(nearer)
        order.extend(w for w in nearer if w not in analysis.missing)
        frontier = nearer
    return order[:limit]


def _ambiguous_stop_roots(analysis: Analysis, roots: list[Root]) -> list[Root]:
    """A root that only stopped (no stack) where a rank without a dump was its peer: it stopped in
    its own code, or on that rank's death. Both stand, uncertain; the missing rank as a root of its
    own. A rank that stopped as a follow-on of something else is explained already."""
    added: list[Root] = []
    named = {r for root in roots for r in root.ranks}
    for d in analysis.ambiguous_stops:
        owners = [root for root in roots if not set(root.ranks).isdisjoint(d.waiters)]
        if not owners:
            continue
        why = (f"or it stopped on the death of rank(s) {ranks_text(d.laggards)} (no dump): "
               f"{d.detail}")
        for root in owners:
            root.uncertain = why
        missing = sorted(set(d.laggards) - named)
        if missing:
            added.append(Root(missing, divergences=[d], waiting=set(d.waiters),
                              uncertain=f"or rank(s) {ranks_text(d.waiters)} stopped in their own "
                                        "code, and the "
                                        "missing dump is lost or late"))
            named.update(missing)
    return added


def _stuck_beside_missing(analysis: Analysis, roots: list[Root]) -> list[Root]:
    """A rank whose stack shows it in its own code, outside any collective, that waits on nobody and
    nobody that dumped waits on, beside a root of ranks without a dump (one group holds both): the
    missing ranks may wait on it (their dumps, lost, would show it), and it is the only rank seen
    stuck. It is named, uncertain; the missing ranks are then possible follow-ons
    (_possible_follow_ons)."""
    missing_roots = [
        set(root.ranks)
        for root in roots
        if set(root.ranks) <= analysis.missing and not root.uncertain
    ]
    if not missing_roots:
        return []
    involved = {r for root in roots for r in (*root.ranks, *root.waiting)} | \
        {r for d in analysis.divergences for r in (*d.waiters, *d.laggards)}
    stuck = [
        r
        for r, place in analysis.where.items()
        if place.kind.value == "outside_collectives" and r in analysis.dumped and r not in involved
    ]
    added = []
    for rank in sorted(stuck):
        beside = [
            m
            for m in missing_roots
            if any(
                rank in members and not m.isdisjoint(members)
                for members in analysis.members.values()
            )
        ]
        if beside:
            added.append(
                Root(
                    [rank],
                    uncertain=f"nothing that dumped waits on it; rank(s) "
                    f"{ranks_text(sorted(set().union(*beside)))}, "
                    "which share a group "
                    "with it, wrote no dump and may be what waits on it",
                )
            )
    return added


def _possible_follow_ons(analysis: Analysis, roots: list[Root]) -> set[int]:
    """The ranks of roots made only of ranks that wrote no dump, in a job where a root that did dump
    has made others wait, sharing a group with that root's ranks or their waiters: such a missing
    rank may itself be waiting there (its dump lost or late: a follow-on) as well as dead. Nothing
    in the dumps tells the two apart, and a lost dump is far more common than a second, independent
    death: they are noted, not named (the dumped root stands on its own)."""
    dumped_roots = [root for root in roots if not set(root.ranks) <= analysis.missing]
    if not dumped_roots or len(dumped_roots) == len(roots):
        return set()
    # every wait, also those a stall or skip made moot
    waits_on: dict[int, set[int]] = defaultdict(set)
    for d in (*analysis.divergences, *analysis.ambiguous_stops):
        for w in d.waiters:
            waits_on[w].update(d.laggards)
    reach = {id(other): _reached(waits_on, set(other.ranks)) for other in dumped_roots}
    follow_ons: set[int] = set()
    for root in roots:
        if not set(root.ranks) <= analysis.missing or root.uncertain:
            continue
        # the roots that do not wait on these ranks themselves (a stalled rank may, through a wait
        # it dropped)
        independent = [other for other in dumped_roots if reach[id(other)].isdisjoint(root.ranks)]
        affected = {r for other in independent for r in (*other.ranks, *other.waiting)}
        if independent and all(_blocked(analysis, r) for r in root.ranks):
            follow_ons.update(root.ranks)
            analysis.unexplained_missing.append(
                f"rank(s) {ranks_text(root.ranks)} wrote no dump, but their stacks show them alive "
                "and blocked in "
                "a collective or send/recv: waiting, not dead (their dump lost or late)")
            continue
        shared = [g for g, members in analysis.members.items()
                  if not set(root.ranks).isdisjoint(members) and not affected.isdisjoint(members)]
        if shared:
            follow_ons.update(root.ranks)
            analysis.unexplained_missing.append(
                f"rank(s) {ranks_text(root.ranks)} wrote no dump; rank(s) "
                f"{ranks_text(sorted(root.waiting))} wait "
                f"on them, but they share {analysis.label(shared[0])} with ranks held by another "
                "root: they may "
                "wait there themselves (a follow-on whose dump is lost or late)")
    return follow_ons


def _reached(waits_on: dict[int, set[int]], ranks: set[int]) -> set[int]:
    seen = set(ranks)
    frontier = list(ranks)
    while frontier:
        nxt = [b for a in frontier for b in waits_on.get(a, ()) if b not in seen]
        seen.update(nxt)
        frontier = nxt
    return seen


def _blocked(analysis: Analysis, rank: int) -> bool:
    place = analysis.where.get(rank)
    return place is not None and place.kind.value in ("in_collective", "in_p2p")


