"""Laggards whose own stack shows them waiting: a rank that never entered the collective its peers
wait in, by its dump, while its Python stack is blocked inside that very op.

A dump is a snapshot taken a little before or after the stack: the rank may have entered the
collective after its dump was written (its flight recorder lags), or it may be stuck inside an
earlier collective of the group that its peers completed (gloo completes an all_reduce on some
ranks before the last piece reaches the others, when a peer stops half-way). Either way it is
waiting, not the cause: it waits on the divergence's other laggards (those whose stacks do not
show them so blocked), else on the group's members without a dump. Where neither exists, the
dump's word stands (the rank is the laggard the others wait on).
"""

from faultlens.attribution.detectors.hang.graph import Analysis, ranks_text


def _blocked_in(analysis: Analysis, rank: int, group: int, op: str | None) -> bool:
    """Whether `rank`'s stack is inside the collective `op` (the flight recorder's name:
    'gloo:all_reduce') of `group`, per the stack classifier (collectors/sources/pystack.py): the
    op matches, and the rank's dump shows it inside no collective of another group (there the
    stack's op is that one: a wait the graph already has)."""
    from faultlens.collectors.sources.pystack import StackPlace

    place = analysis.where.get(rank)
    if place is None or place.kind != StackPlace.IN_COLLECTIVE or not place.op:
        return False
    if op is not None and _bare(op) != _bare(place.op):
        return False
    history = analysis.history(rank) if analysis.history else None
    if history is None or not history[1]:
        return False
    _seqs, groups, incomplete_at = history
    return incomplete_at is None or groups[incomplete_at] == group


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
        blocked = tuple(r for r in d.laggards if _blocked_in(analysis, r, d.group, d.op))
        if not blocked:
            continue
        others = tuple(r for r in d.laggards if r not in blocked)
        missing = tuple(r for r in analysis.members.get(d.group, ()) if r in analysis.missing)
        if not others and not missing:
            continue
        on = others or missing
        stacks = "; ".join(analysis.where[r].text(r) for r in blocked[:3])
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
