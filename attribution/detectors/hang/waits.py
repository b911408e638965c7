"""Waits on ranks that wrote no dump: which stand, which a rank that did dump explains.

A rank without a dump (killed, or its dump lost or late) is a node of the wait-for graph; the ranks
that wait on it are:
- the present members of its groups inside one of the group's collectives (an entry not completed;
  analyze.py);
- members that stopped early: others wait on them (a laggard of some divergence), yet they are
  inside no collective. Where such a member's last collective of a group was the group's latest and
  the group has members without a dump, it may have left that collective with an error when a
  missing peer died (gloo retires the entry the error broke and the process exits), or it may be
  stuck in its own code. Its stack tells: gone (no training thread left) confirms the wait; in its
  own code, or blocked in a collective or send/recv, it waits on nothing here. With no stack the
  wait stands unconfirmed, and a root only such waits name has a confidence below any failover
  (describe.py).
A wait in a group where a member that did dump lags too (it never entered, never completed, or
called another collective there) is explained by that member (every waiting member waits on it, or
is it): a lost or late dump of a healthy rank is no culprit. The missing ranks are then only noted
(analysis.unexplained_missing).
"""

from faultlens.attribution.detectors.hang.graph import BIG, Analysis, Divergence, ranks_text


def settle_missing(analysis: Analysis) -> None:
    """Adds the waits of ranks that stopped early, then drops the waits on missing ranks that a
    member that did dump explains. Runs after every other divergence and the stacks (analysis.where)
    are in."""
    if not analysis.missing_groups:
        return
    _stopped_early_waits(analysis)
    explained: dict[int, set[int]] = {}
    for d in analysis.divergences:
        if (
            d.level not in ("missing", "stopped")
            and d.group >= 0
            and not set(d.laggards) & analysis.missing
        ):
            explained.setdefault(d.group, set()).update(d.waiters, d.laggards)
    # members that called another collective explain the group's wait too
    for m in analysis.mismatches:
        explained.setdefault(m.group, set()).update(m.odd, m.majority)
    kept = []
    for d in analysis.divergences:
        if (
            d.level in ("missing", "stopped")
            and d.group in explained
            and set(d.waiters) <= explained[d.group]
        ):
            analysis.unexplained_missing.append(
                f"{analysis.label(d.group)}: rank(s) {ranks_text(d.waiters)} wait in it, and "
                "rank(s) "
                f"{ranks_text(d.laggards)} wrote no dump; a member that dumped lags there and "
                "explains the wait")
            continue
        kept.append(d)
    analysis.divergences = kept


def _stopped_early_waits(analysis: Analysis) -> None:
    from faultlens.collectors.sources.pystack import StackPlace

    needed = {lag for d in analysis.divergences for lag in d.laggards}
    where = analysis.where
    stopped = {r for r in needed - analysis.incomplete - analysis.missing
               if r not in where or where[r].kind == StackPlace.UNKNOWN}
    if not stopped:
        return
    # the group of its last entry is where it stopped (the collective an error broke, or the last it
    # completed); a member at the group's latest collective that went on to another group's saw that
    # collective complete: every member, the missing ones too, was in it, and no error broke it
    candidates = [g for g in analysis.missing_groups if not stopped.isdisjoint(g.at_top)]
    # (of a big group, the stopped members and a few others: one that went on is enough)
    looked_at = {
        g.group: [r for r in g.at_top if r in stopped][:256]
        + [r for r in g.at_top if r not in stopped][:64]
        for g in candidates
    }
    last = _last_groups(analysis, sorted({r for ranks in looked_at.values() for r in ranks}))
    stops = []
    for group in candidates:
        if any(last.get(r) not in (group.group, None) for r in looked_at[group.group]):
            continue
        waiting = tuple(r for r in group.at_top if r in stopped)
        gone = [r for r in waiting if r in where and not where[r].frame]
        why = (
            f"gone: rank(s) {ranks_text(gone)} have no training thread left"
            if gone
            else "no stack shows why"
        )
        stops.append(Divergence(
            group.group, "stopped", None, group.missing, waiting, BIG, confirmed=bool(gone),
            detail=f"{analysis.label(group.group)}: rank(s) {ranks_text(waiting)} stopped after "
                   "its latest "
                   f"collective ({why}); it needs rank(s) {ranks_text(group.missing)}, which wrote "
                   "no dump"))
    # one unconfirmed stop alone on a missing rank is a coin toss (it stopped on the death, or in
    # its own code beside a lost dump): both are named, below any failover (roots.py); several ranks
    # that stopped on the same missing rank are one cause
    stopped_on: dict[int, set[int]] = {}
    for d in stops:
        for lag in d.laggards:
            stopped_on.setdefault(lag, set()).update(d.waiters)
    for d in stops:
        if (
            not d.confirmed
            and len(set(d.waiters)) == 1
            and all(len(stopped_on[m]) == 1 for m in d.laggards)
        ):
            analysis.ambiguous_stops.append(d)
        else:
            analysis.divergences.append(d)


def _last_groups(analysis: Analysis, ranks: list[int]) -> dict[int, int | None]:
    """rank -> the group of its last recorded collective (None: its history cannot be read)."""
    def last(rank: int) -> int | None:
        history = analysis.history(rank) if analysis.history else None
        return history[1][-1] if history and history[1] else None

    if analysis.batch is not None:
        return analysis.batch(ranks, last)
    return {rank: last(rank) for rank in ranks}
