"""The wait-for graph's parts: divergences, mismatches, the analysis state, strongly connected
components.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from faultlens.attribution.detectors.hang.report import HangVerdict

# --------------------------------------------------------------------------------------------------
# the wait-for graph

# a time after every other (a divergence or root with no time of its own sorts last)
BIG = np.iinfo(np.int64).max


@dataclass
class Divergence:
    group: int  # group code
    # "entered", "completed", "started", "mismatch", "p2p", "stack", "missing", "stopped" (waits.py)
    level: str
    seq: int | None  # first divergent sequence id
    laggards: tuple[int, ...]
    waiters: tuple[int, ...]
    time: int  # time_created of the divergent collective (ns), for ordering
    op: str | None = None
    pg_id: str | None = None
    detail: str = ""
    # a "stopped" wait (ranks inside no collective wait on missing ones: errored on a dead peer, or
    # stuck in their own code) is confirmed by a stack showing the waiter gone, never by the trace
    # alone
    confirmed: bool = True


@dataclass(frozen=True)
class MissingGroup:
    """A group with members that wrote no dump: who is missing, and its present members at its
    latest collective.
    """

    group: int
    missing: tuple[int, ...]
    at_top: tuple[int, ...]


@dataclass
class Mismatch:
    group: int
    seq: int
    kind: HangVerdict
    odd: tuple[int, ...]
    majority: tuple[int, ...]
    tie: bool
    time: int
    detail: str
    op: str | None
    pg_id: str | None
    # every member went past it (entered a later collective of the group, or completed it): it holds
    # nobody, whatever else hangs
    completed: bool = False


@dataclass
class Analysis:
    group_names: list[str]
    group_descs: dict[int, str | None]
    members: dict[int, tuple[int, ...]]
    membership_rebuilt: set[int]
    dumped: set[int]
    expected: set[int]
    missing: set[int]
    divergences: list[Divergence] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    stuck_groups: list[tuple[int, int, tuple[int, ...], int]] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    missing_groups: list[MissingGroup] = field(default_factory=list)
    # groups where members without a dump are not what the others wait on (a member that dumped lags
    # there)
    unexplained_missing: list[str] = field(default_factory=list)
    # missing ranks some rank that dumped waits on
    waited_missing: set[int] = field(default_factory=set)
    # a rank that stopped alone on a missing one, no stack to say why: not an edge, both named
    # (waits.py)
    ambiguous_stops: list[Divergence] = field(default_factory=list)
    history: Any = None  # rank -> (seqs, groups, index of first incomplete) in record order
    # ranks with an entry not completed (inside a collective)
    incomplete: set[int] = field(default_factory=set)
    # rank -> faultlens.collectors.sources.pystack.Whereabouts, from stacks
    where: dict[int, Any] = field(default_factory=dict)
    key_rows: Any = None  # (due key, later keys) -> {key: {rank: (record of due, record of key)}}
    # (ranks, check) -> {rank: check(rank)}, the table read once for them all (lookups.py)
    batch: Any = None
    # entries carry 'started'/'completed' states (NCCL), not only `retired` (gloo)
    device_states: bool = False
    p2p_unrecorded: bool = False  # the dumps' library records no send/recv (gloo): hidden_p2p.py
    # desc-less group -> the part it plays (skips.creation_runs), lazily
    roles: dict[int, tuple] | None = None
    # ranks whose own exit says they timed out waiting in a collective ("Timed out waiting ...")
    timed_out: set[int] = field(default_factory=set)
    # ranks whose dump was refused or contradicts its group (read as missing; seq_consistency.py)
    unreadable: set[int] = field(default_factory=set)
    parts: dict[tuple, list[int]] | None = None  # part -> its groups (skips.groups_by_role), lazily
    # rank -> why: laggards whose stacks are blocked in their peers' op with no one named to wait on
    # (blocked.py)
    blocked_alone: dict[int, str] = field(default_factory=dict)

    def label(self, group: int) -> str:
        if not 0 <= group < len(self.group_names):
            return "p2p"
        name = self.group_names[group]
        desc = self.group_descs.get(group)
        return f"group {name!r}" + (f" ({desc})" if desc and desc != name else "")


@dataclass
class Root:
    """A root of the wait-for graph while the roots are decided: its ranks, the divergences and
    mismatches it explains, whether it is a cycle, and who waits on it."""

    ranks: list[int]
    divergences: list[Divergence] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    cyclic: bool = False
    waiting: set[int] = field(default_factory=set)
    uncertain: str = ""  # why its ranks may not be the cause (an ambiguous stop), else ""


def checked(
    analysis: Analysis, ranks: list[int], check: Callable[[int], str | None]
) -> dict[int, str | None]:
    """check(rank) for each rank, with the table read once for them all where the analysis can batch
    its reads.
    """
    if analysis.batch is not None and ranks:
        return analysis.batch(ranks, check)
    return {rank: check(rank) for rank in ranks}


def ranks_text(ranks: Sequence[int], limit: int = 12) -> str:
    ranks = sorted(ranks)
    if len(ranks) <= limit:
        return ", ".join(map(str, ranks))
    return ", ".join(map(str, ranks[:limit])) + f", ... ({len(ranks)} ranks)"


#: graphs of fewer nodes and edges are split by plain Python (scipy's import costs more there)
PLAIN_SCC_SIZE = 20_000


def strongly_connected(n_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """A label per node, equal for the nodes of one strongly-connected component."""
    if n_nodes + src.shape[0] < PLAIN_SCC_SIZE:
        return _strongly_connected_plain(n_nodes, src.tolist(), dst.tolist())
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    graph = csr_matrix((np.ones(src.shape[0], np.int8), (src, dst)), shape=(n_nodes, n_nodes))
    _, labels = connected_components(graph, directed=True, connection="strong")
    return labels




def _strongly_connected_plain(n_nodes: int, src: list[int], dst: list[int]) -> np.ndarray:
    """Tarjan's algorithm without recursion: the components strongly_connected gives, labelled in
    another order (labels are compared, never ordered)."""
    out_edges: list[list[int]] = [[] for _ in range(n_nodes)]
    for a, b in zip(src, dst, strict=True):
        out_edges[a].append(b)
    index = [-1] * n_nodes
    low = [0] * n_nodes
    on_stack = [False] * n_nodes
    labels = np.full(n_nodes, -1, np.int32)
    stack: list[int] = []
    counter = 0
    label = 0
    for root in range(n_nodes):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            node, at = work.pop()
            if at == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack[node] = True
            edges = out_edges[node]
            while at < len(edges):
                nxt = edges[at]
                at += 1
                if index[nxt] < 0:
                    work.append((node, at))
                    work.append((nxt, 0))
                    break
                if on_stack[nxt]:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    while True:
                        member = stack.pop()
                        on_stack[member] = False
                        labels[member] = label
                        if member == node:
                            break
                    label += 1
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return labels
