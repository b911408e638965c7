"""Laggards whose own stack shows them waiting: a rank that never entered the collective its peers
wait in, by its dump, while its Python stack is blocked inside that very op.

A dump is a snapshot taken a little before or after the stack: the rank may have entered the
collective after its dump was written (its flight recorder lags), or it may be stuck inside an
earlier collective of the group that its peers completed (gloo completes an all_reduce on some
ranks before the last piece reaches the others, when a peer stops half-way). Either way it is
waiting, not the cause: it waits on the divergence's other laggards (those whose stacks do not
show them so blocked), else on the group's members without a dump. Where neither exists, the
dump's word stands at first; once the roots are decided, such a rank is no root of its own: it
waits on the one other root (whose ranks are not blocked so), or, with several, it stands
uncertain (below the failover threshold).
"""

from collections.abc import Callable

from faultlens.attribution.detectors.hang.graph import BIG, Analysis, Divergence, Root, ranks_text


def _blocked_in(analysis: Analysis, rank: int, group: int, op: str | None) -> str | None:
    """Where `rank`'s stack (per the stack classifier, collectors/sources/pystack.py) puts it
    against the collective `op` (the flight recorder's name: 'gloo:all_reduce') of `group` its peers
    wait in: "same" (blocked in that op, and its dump shows it inside no collective of another
    group: there the stack's op is that one, a wait the graph already has), "elsewhere" (blocked in
    another op while its dump shows it inside no collective at all: one its dump has not
    recorded), else None."""
    from faultlens.collectors.sources.pystack import StackPlace

    place = analysis.where.get(rank)
    if place is None or place.kind != StackPlace.IN_COLLECTIVE or not place.op:
        return None
    history = analysis.history(rank) if analysis.history else None
    if history is None or not history[1]:
        return None
    _seqs, groups, incomplete_at = history
    if op is not None and _bare(op) != _bare(place.op):
        return "elsewhere" if incomplete_at is None else None
    return "same" if incomplete_at is None or groups[incomplete_at] == group else None


def _bare(op: str) -> str:
    """'gloo:all_reduce' and torch.distributed's 'all_reduce' alike -> 'allreduce'."""
    return op.rsplit(":", 1)[-1].lstrip("_").replace("_", "").lower()


def settle_blocked_laggards(analysis: Analysis) -> None:
    """Rewrites each 'entered' divergence whose laggards include ranks blocked, by their stacks, in
    the op their peers wait in (see the module docstring). Runs after the stacks are in
    (analysis.where) and before the waits on missing ranks are settled (waits.settle_missing)."""
    if not analysis.where:
        return
    for d in analysis.divergences:
        if d.level != "entered" or not d.laggards:
            continue
        places = {r: _blocked_in(analysis, r, d.group, d.op) for r in d.laggards}
        for r, place in places.items():
            if place == "elsewhere":
                analysis.blocked_alone[r] = (
                    f"rank {r} never entered {analysis.label(d.group)} seq {d.seq} by its dump, "
                    f"which shows it inside no collective, yet its stack is blocked in one "
                    f"({analysis.where[r].text(r)}): it waits in a collective its dump has not "
                    "recorded, on ranks no dump names")
        blocked = tuple(r for r, place in places.items() if place == "same")
        if not blocked:
            continue
        others = tuple(r for r in d.laggards if r not in blocked)
        missing = tuple(r for r in analysis.members.get(d.group, ()) if r in analysis.missing)
        stacks = "; ".join(analysis.where[r].text(r) for r in blocked[:3])
        if not others and not missing:
            for r in blocked:
                analysis.blocked_alone[r] = (
                    f"rank {r} never entered {analysis.label(d.group)} seq {d.seq} by its dump, "
                    f"yet its stack is blocked in that op ({analysis.where[r].text(r)}): it waits "
                    "in a collective its dump has not recorded, on ranks no dump names")
            continue
        on = others or missing
        note = (f"{analysis.label(d.group)} seq {d.seq}: rank(s) {ranks_text(blocked)} never "
                "entered it by their dumps, yet their stacks are blocked in that op "
                f"({stacks}): they wait on rank(s) {ranks_text(on)}"
                + ("" if others else ", which wrote no dump"))
        analysis.evidence.append(note)
        if others:
            d.laggards = others
            d.waiters = tuple(sorted({*d.waiters, *blocked}))
            d.detail = (d.detail + "; " if d.detail else "") + note
            continue
        # every laggard that dumped waits: the members without a dump are what they all wait on
        d.level = "missing"
        d.laggards = missing
        d.waiters = tuple(sorted({*d.waiters, *blocked}))
        d.detail = note


def _inside_previous(analysis: Analysis, rank: int, group: int, seq: int | None,
                     op: str | None) -> bool:
    """Whether `rank`'s own dump shows it inside seq - 1 of `group` (its first entry not
    completed is that one) and its stack, where taken, is blocked in that collective's `op`: it
    never entered seq because it is still waiting in the one before, which its peers went past."""
    from faultlens.collectors.sources.pystack import StackPlace

    place = analysis.where.get(rank)
    if seq is None or (place is not None and (
            place.kind != StackPlace.IN_COLLECTIVE or not place.op or op is None
            or _bare(op) != _bare(place.op))):
        return False
    history = analysis.history(rank) if analysis.history else None
    if history is None or not history[1]:
        return False
    seqs, groups, incomplete_at = history
    return incomplete_at is not None and groups[incomplete_at] == group \
        and seqs[incomplete_at] == seq - 1


def settle_inside_previous(analysis: Analysis) -> None:
    """Rewrites each 'entered' divergence whose laggards are still inside the group's collective
    before it, where the group has members without a dump (_inside_previous_on_missing). Runs
    after the stacks are in (analysis.where, where taken) and before the waits on missing ranks are
    settled (waits.settle_missing)."""
    if not analysis.missing:
        return
    for d in list(analysis.divergences):
        if d.level == "entered" and d.laggards:
            _inside_previous_on_missing(analysis, d)


def _inside_previous_on_missing(analysis: Analysis, d: Divergence) -> bool:
    """Laggards of `d` still inside the group's collective before it (_inside_previous), in a group
    with members that wrote no dump: every member that dumped entered that collective, so what
    keeps them there is a member without a dump (a gather's or broadcast's root waits for a sender
    that never came; the senders went on). They wait on those members, not the reverse: `d`'s
    other laggards stay; where none is left, its waiters wait on the members without a dump too.
    Returns whether `d` was rewritten."""
    missing = tuple(r for r in analysis.members.get(d.group, ()) if r in analysis.missing)
    if not missing or d.seq is None:
        return False
    # the op of that collective: the wait in it on the missing members (analyze.py) carries it
    op = next((m.op for m in analysis.divergences
               if m.level == "missing" and m.group == d.group and m.seq == d.seq - 1), None)
    inside = tuple(r for r in d.laggards if _inside_previous(analysis, r, d.group, d.seq, op))
    if not inside:
        return False
    stacks = "; ".join(analysis.where[r].text(r) for r in inside[:3] if r in analysis.where)
    note = (f"{analysis.label(d.group)} seq {d.seq - 1}: rank(s) {ranks_text(inside)} are still "
            "inside it by their dumps" + (f" and stacks ({stacks})" if stacks else "")
            + ", and every other member that dumped went past it: they wait on rank(s) "
            f"{ranks_text(missing)}, which wrote no dump")
    analysis.evidence.append(note)
    others = tuple(r for r in d.laggards if r not in inside)
    if others:
        d.laggards = others
        analysis.divergences.append(Divergence(
            d.group, "missing", d.seq - 1, missing, inside, d.time, None, d.pg_id, note))
        return True
    d.level = "missing"
    d.laggards = missing
    d.waiters = tuple(sorted({*d.waiters, *inside}))
    d.detail = (d.detail + "; " if d.detail else "") + note
    return True


def settle_blocked_roots(
    analysis: Analysis, roots: list[Root], rebuilt: Callable[[], list[Root]]
) -> list[Root]:
    """Roots made only of ranks blocked alone (settle_blocked_laggards): each waits on the one
    other root where exactly one stands, sure, and no rank is without a dump (an edge to it, and
    the roots decided again); else they stand uncertain."""
    alone = analysis.blocked_alone
    blocked = [root for root in roots if root.ranks and set(root.ranks) <= set(alone)]
    if not blocked:
        return roots
    others = [root for root in roots if root not in blocked]
    if len(others) == 1 and not others[0].uncertain and not analysis.missing:
        target = tuple(sorted(others[0].ranks))
        for root in blocked:
            for rank in root.ranks:
                place = analysis.where[rank]
                analysis.divergences.append(Divergence(
                    -1, "stack", None, target, (rank,), BIG, place.op, None,
                    f"{alone[rank]}; the one other root, rank(s) {ranks_text(target)}, is what "
                    "it waits on"))
        return rebuilt()
    for root in blocked:
        root.uncertain = "; ".join(alone[r] for r in root.ranks[:3])
    return roots
