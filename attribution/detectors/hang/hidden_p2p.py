"""Roots the trace alone cannot tell from a pipeline wait.

gloo records no send/recv (nor batch_isend_irecv; flight-recorder facts in the design notes), so in
a gloo dump a rank blocked in one looks like a rank stuck in its own code: every entry it recorded
is done and it never joined the collective its peers wait in. A stack tells the two apart (py-spy
shows `recv`, or the data loader). Where none was taken and several ranks stopped that way, each may
be waiting on another through a send/recv the dumps cannot show, or be stuck itself: they stand as
roots, uncertain (below the policy's failover threshold), rather than as several independent
culprits named with confidence. One such rank alone is what the others wait on, as before, unless
its own exit says it timed out waiting (the ranks' exits, `timed_out`): inside no collective the
dumps recorded, it waited in a send/recv on a rank no dump names (a peer that left its side out and
went on): it stands uncertain too, never a cause at the failover threshold."""

from __future__ import annotations

from collections.abc import Mapping

from faultlens.attribution.detectors.hang.graph import Analysis, Root, ranks_text


def silent_by_trace(analysis: Analysis, rank: int) -> bool:
    """A rank that dumped, whose recorded entries are all done, and that no stack locates
    (describe.py's `stuck_outside` by the trace alone)."""
    return (
        rank in analysis.dumped
        and rank not in analysis.incomplete
        and analysis.where.get(rank) is None
    )


def mark_hidden_p2p_waits(
    analysis: Analysis, roots: list[Root], skippers: Mapping[int, str]
) -> None:
    """Where the dumps' library records no point-to-point ops, roots made only of ranks silent by
    the trace are uncertain when two or more such ranks stand (in one root or several): each may
    wait on another through a send/recv."""
    if not analysis.p2p_unrecorded:
        return
    for root in roots:
        waited = [r for r in root.ranks if _waited_unrecorded(analysis, r, skippers)]
        if root.ranks and not root.uncertain and len(waited) == len(root.ranks):
            root.uncertain = (f"rank(s) {ranks_text(waited)} stopped outside any recorded "
                              "collective, yet their own exit says they timed out waiting: in a "
                              "send/recv, which gloo does not record, on a rank no dump names")
    silent_roots = [root for root in roots if root.ranks and not root.uncertain
                    and all(silent_by_trace(analysis, r) and r not in skippers for r in root.ranks)]
    silent = sorted({r for root in silent_roots for r in root.ranks})
    if len(silent) < 2:
        return
    for root in silent_roots:
        root.uncertain = (f"gloo records no send/recv, and rank(s) {ranks_text(silent)} all "
                          "stopped outside any "
                          "recorded collective: any of them may be waiting on another in one (no "
                          "stack says where "
                          "they are)")


def _waited_unrecorded(analysis: Analysis, rank: int, skippers: Mapping[int, str]) -> bool:
    """A rank that dumped, whose own exit says it timed out waiting, though the dumps show it
    waiting in no collective and no stack puts it in its own code."""
    place = analysis.where.get(rank)
    return (
        rank in analysis.timed_out
        and rank in analysis.dumped
        and rank not in skippers
        and (place is None or place.kind.value == "in_p2p")
        and not any(rank in d.waiters for d in analysis.divergences)
    )


def mark_unseen_member_waits(analysis: Analysis, roots: list[Root]) -> None:
    """A gloo root's rank whose last collective is the first one of a group only it recorded (one
    member by the entries: gloo's raw pg_config names none, and the reader sees no other): its peers
    in that group never entered it (a skip before any history of the group), so it waits there on
    members no dump shows, not on nobody. Such a root stands uncertain, below the failover
    threshold. (A group of one rank used before, as a DP group of size one is, shows earlier
    entries of it.)"""
    if analysis.history is None or not analysis.p2p_unrecorded:
        return
    for root in roots:
        if not root.ranks or root.uncertain or set(root.ranks) & analysis.missing:
            continue
        waiting_in = []
        for rank in root.ranks:
            history = analysis.history(rank)
            if history is None or not history[1]:
                break
            seqs, groups_in_order, _incomplete = history
            last = groups_in_order[-1]
            if analysis.members.get(last) != (rank,) or groups_in_order.count(last) != 1:
                break
            waiting_in.append(f"rank {rank} in {analysis.label(last)} seq {seqs[-1]}")
        else:
            root.uncertain = (f"the last collective of {', '.join(waiting_in)} is the first of a "
                              "group no other rank recorded (the dumps name no other member): it "
                              "waits there on peers that never entered it, which no dump shows")
