"""Roots the trace alone cannot tell from a pipeline wait.

gloo records no send/recv (nor batch_isend_irecv; flight-recorder facts in the design notes), so in
a gloo dump a rank blocked in one looks like a rank stuck in its own code: every entry it recorded
is done and it never joined the collective its peers wait in. A stack tells the two apart (py-spy
shows `recv`, or the data loader). Where none was taken and several ranks stopped that way, each may
be waiting on another through a send/recv the dumps cannot show, or be stuck itself: they stand as
roots, uncertain (below the policy's failover threshold), rather than as several independent
culprits named with confidence. One such rank alone is what the others wait on, as before."""

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
