"""Breaking cycles: did a rank skip a collective it lags in? By the order the ranks outside the
cycle entered the same collectives (in groups playing the same part), or else by the rank's own
periodic history."""

from collections import defaultdict
from itertools import pairwise

from faultlens.attribution.detectors.hang.graph import Analysis, Divergence


def group_role(analysis: Analysis, group: int) -> tuple:
    """Groups that play the same part in the program (one desc, one size: Megatron's TP groups) are
    compared by sequence id across ranks. Groups without a usable desc (new_group / new_subgroups
    without group_desc: 'undefined') play the part of their creation run (creation_runs); a group in
    no run plays only its own."""
    desc = analysis.group_descs.get(group)
    if desc and desc not in ("undefined", "default_pg"):
        return ("desc", desc, len(analysis.members.get(group, ())))
    if analysis.roles is None:
        analysis.roles = creation_runs(analysis)
    return analysis.roles.get(group, ("group", group))


def groups_by_role(analysis: Analysis) -> dict[tuple, list[int]]:
    """Every group under the part it plays (group_role), in group order (computed once: membership
    is settled before any part is asked for)."""
    if analysis.parts is None:
        by_role: dict[tuple, list[int]] = defaultdict(list)
        for g in analysis.members:
            by_role[group_role(analysis, g)].append(g)
        analysis.parts = dict(by_role)
    return analysis.parts


def creation_runs(analysis: Analysis) -> dict[int, tuple]:
    """The parts desc-less groups play, from how jobs create groups: one part's groups in a loop,
    one after another (torch names groups by a counter: '7', '8', ...), of one size, disjoint (each
    rank in one of them). A run of such groups with consecutive names ends at a gap, another size,
    or a group that shares a rank with the run (the next part's first group: a TP group after the PP
    groups that cover every rank). Only runs of two or more groups are parts; names that are no
    counter (hashed names) give none."""
    numbered = sorted((int(name), g) for g, name in enumerate(analysis.group_names)
                      if g in analysis.members and str(name).isdigit()
                      and analysis.group_descs.get(g) in (None, "undefined"))
    # a name no dump recorded (every member that would have recorded it wrote no dump, or skipped
    # it) is no gap: at most one such group per rank without a dump
    seen_names = {int(name) for name in analysis.group_names if str(name).isdigit()}
    unseen_allowed = len(analysis.missing)
    roles: dict[int, tuple] = {}
    run: list[int] = []
    covered: set[int] = set()
    last = None

    def consecutive(number: int) -> bool:
        gap = set(range(last + 1, number))
        return not gap & seen_names and len(gap) <= unseen_allowed

    def close() -> None:
        if len(run) >= 2:
            role = ("run", analysis.group_names[run[0]], len(analysis.members[run[0]]))
            roles.update((g, role) for g in run)

    for number, g in numbered:
        ranks = set(analysis.members[g])
        if run and (
            not consecutive(number)
            or len(ranks) != len(analysis.members[run[0]])
            or ranks & covered
        ):
            close()
            run, covered = [], set()
        run.append(g)
        covered |= ranks
        last = number
    close()
    return roles


def _role_text(analysis: Analysis, group: int) -> str:
    role = group_role(analysis, group)
    if role[0] == "run":
        return f"group {analysis.group_names[group]!r} (or a group created beside it)"
    return str(role[1]) if role[0] == "desc" else f"group {analysis.group_names[group]!r}"


def skipped_by_consensus(
    analysis: Analysis,
    rank: int,
    cycle: set[int],
    divergences: list[Divergence],
    look_back: bool = False,
) -> str | None:
    """Did `rank` go past a collective it lags in? Its own cross-group entry order says which
    collectives it entered after its last one of the lagging group; the ranks outside the cycle that
    entered both (in groups of the same part: the other TP groups for a TP collective) say which
    comes first in the program. No periodic history is needed: one step of the others' order is
    enough.

    look_back (a terminal rank alone): where it entered nothing after its last collective of the
    lagging group (the group's collective ends each step, and the rank has finished), the
    collectives it entered just before that one: if the others entered their same-numbered
    collective of the group first, the rank runs one behind in the group since it left one out (its
    later ones paired with its peers' earlier ones)."""
    history = analysis.history(rank) if analysis.history else None
    if history is None or analysis.key_rows is None:
        return None
    seqs, groups_in_order, _incomplete = history
    for d in divergences:
        if rank not in d.laggards or d.level != "entered" or d.seq is None:
            continue
        mine = [i for i, g in enumerate(groups_in_order) if g == d.group]
        last = max(mine, default=-1)
        after = [(groups_in_order[i], seqs[i]) for i in range(last + 1, len(seqs))
                 if groups_in_order[i] != d.group][:8]
        if after:
            found = _went_past(
                analysis, rank, cycle, d, (group_role(analysis, d.group), d.seq), after, True
            )
            if found:
                return found
        if look_back and last >= 0:
            previous = mine[-2] if len(mine) > 1 else -1
            before = [(groups_in_order[i], seqs[i]) for i in range(last - 1, previous, -1)
                      if groups_in_order[i] != d.group][:8]
            if before:
                found = _went_past(
                    analysis,
                    rank,
                    cycle,
                    d,
                    (group_role(analysis, d.group), seqs[last]),
                    before,
                    False,
                )
                if found:
                    return found
    return None


def skipped_beside_missing(
    analysis: Analysis, rank: int, missing: set[int]
) -> tuple[Divergence, str] | None:
    """Did `rank`, which waits on ranks without a dump, skip a collective of a group it shares with
    them? Their dumps would show them waiting in it (the skip's only trace); without them, the
    hypothesis "they entered the group's next collective" is put to the same consensus: where the
    others entered their same-part collective before the ones `rank` went on to, it skipped it. A
    group only the missing ranks and `rank` recorded nothing of is invisible: a part whose groups
    hold every other rank but `rank` and missing ones stands for it (its first collective). Returns
    that wait (missing ranks -> rank) as a divergence, and the evidence."""
    history = analysis.history(rank) if analysis.history else None
    if history is None or analysis.key_rows is None:
        return None
    seqs, groups_in_order, _incomplete = history
    for g, due, partners, visible in _shared_with_missing(
        analysis, rank, missing, seqs, groups_in_order
    ):
        hypothesis = Divergence(g, "entered", due, (rank,), partners, 0)
        found = skipped_by_consensus(analysis, rank, {rank}, [hypothesis])
        if found:
            where = analysis.label(g) if visible else \
                f"its own {_role_text(analysis, g)} group (no rank that dumped recorded it)"
            found = found.replace(analysis.label(g), where, 1)
            hypothesis.detail = (f"{where} seq {due}: rank {rank} never entered it; rank(s) "
                                 f"{', '.join(map(str, partners))}, which wrote no dump, would "
                                 "wait in it")
            return hypothesis, found
    return None


def _shared_with_missing(
    analysis: Analysis, rank: int, missing: set[int], seqs: list[int], groups_in_order: list[int]
) -> list[tuple[int, int, tuple[int, ...], bool]]:
    """(group, its next collective for `rank`, the missing members, True) for each group `rank`
    shares with missing ranks; for each part none of whose groups holds `rank`, while they hold
    every other rank but missing ones, (a group of the part, 1, the missing ranks the part leaves
    out, False)."""
    world = len(analysis.expected)
    shared = []
    for g, members in analysis.members.items():
        partners = tuple(sorted(missing.intersection(members)))
        if partners and rank in members and len(members) < world:
            entered = [seqs[i] for i, group in enumerate(groups_in_order) if group == g]
            shared.append((g, max(entered, default=0) + 1, partners, True))
    for groups in groups_by_role(analysis).values():
        covered = {r for g in groups for r in analysis.members[g]}
        size = len(analysis.members[groups[0]])
        left_out = analysis.expected - covered
        if (
            len(groups) < 2
            or rank not in left_out
            or not size < world
            or not left_out - {rank} <= analysis.missing
        ):
            continue
        partners = tuple(sorted(missing & left_out))
        if partners:
            shared.append((groups[0], 1, partners, False))
    return shared


def _went_past(
    analysis: Analysis,
    rank: int,
    cycle: set[int],
    d: Divergence,
    due: tuple[tuple, int],
    others: list[tuple[int, int]],
    after: bool,
) -> str | None:
    """Do the ranks outside `cycle` enter `due` (role, seq) before each of `others` (group, seq),
    which `rank` entered after (after=True: so it went past `due`) or before (after=False: so its
    `due` came late) it?"""
    keyed = [(group_role(analysis, g), s, g, s) for g, s in others]
    orders = analysis.key_rows([due[0]], [due[1]], [k[0] for k in keyed], [k[1] for k in keyed])
    outside = "outside the cycle" if len(cycle) > 1 else "besides it"
    for role, s, g, s_own in keyed:
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
            if after:
                return (f"rank {rank} skipped {analysis.label(d.group)} seq {d.seq}: {pro} rank(s) "
                        f"{outside} "
                        f"(e.g. rank {example}) entered their {_role_text(analysis, d.group)} seq "
                        f"{d.seq} before "
                        f"their {_role_text(analysis, g)} seq {s_own}, which rank {rank} entered "
                        "without it")
            return (f"rank {rank} left a collective of {analysis.label(d.group)} out: {pro} "
                    f"rank(s) {outside} "
                    f"(e.g. rank {example}) entered their {_role_text(analysis, d.group)} seq "
                    f"{due[1]} before their "
                    f"{_role_text(analysis, g)} seq {s_own}; rank {rank} entered that one first, "
                    "so its seq "
                    f"{due[1]} came a collective late and it never entered seq {d.seq}")
    return None


def skipped(analysis: Analysis, rank: int, divergences: list[Divergence]) -> str | None:
    """Program-order precedent: did `rank` skip a collective of a group it lags in? Returns the
    evidence text, or None when its lag is explained by where it is blocked (or history cannot
    tell)."""
    history = analysis.history(rank) if analysis.history else None
    if history is None:
        return None
    seqs, groups_in_order, incomplete_at = history
    if incomplete_at is None:
        # dumps taken after the timeout mark everything retired: the rank waits where it is ahead of
        # its peers, its latest entry in such a group
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
            return (f"rank {rank} skipped {analysis.label(lag_group)} seq {due_seq}: its own "
                    "history puts that "
                    f"collective before {analysis.label(blocked_group)} seq {predicted + 1}, yet "
                    "it entered "
                    f"{analysis.group_names[blocked_group]!r} seq {blocked_seq} without it")
    return None


def _predict(points: list[tuple[int, int]], due_seq: int) -> int | None:
    """K-count at which H seq `due_seq` was due, if the history of (H seq, K count) pairs is
    periodic.
    """
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



#: a cycle whose members are ordered by where each one is blocked: at most this many members
MAX_BLOCKING_MEMBERS = 32


def skipped_by_blocking(
    analysis: Analysis, cycle: set[int], divergences: list[Divergence]
) -> dict[int, str]:
    """Which member of `cycle` went past a collective, where no rank outside it entered the same
    collectives (a skip at the group's first collective, before any history, in a chain that takes
    every rank in). Every member is blocked in the last collective it entered; one that did not
    skip never reached the collectives it lags in, so they come after that one in the program (the
    same for every rank: parts, by group_role, and sequence ids). A skipper lags in collectives
    that come before the one it is blocked in. Each member is tried as the one skipper: the
    hypothesis stands where these precedences and every member's own entry order fit one program
    order (no precedence cycle). The member whose hypothesis stands with the fewest collectives
    left out, alone, is the skipper; otherwise nobody is."""
    if len(cycle) > MAX_BLOCKING_MEMBERS or cycle & analysis.missing:
        return {}
    history_of = analysis.history if analysis.history else None
    if history_of is None:
        return {}
    blocked: dict[int, tuple] = {}
    lags: dict[int, set[tuple]] = defaultdict(set)
    orders: list[tuple[tuple, tuple]] = []
    for rank in sorted(cycle):
        history = history_of(rank)
        if history is None or not history[0]:
            return {}
        seqs, groups_in_order, _incomplete = history
        keys = [(group_role(analysis, g), s) for g, s in zip(groups_in_order, seqs, strict=True)]
        blocked[rank] = keys[-1]
        tail = keys[-8:]
        orders += list(pairwise(tail))
    for d in divergences:
        if d.level != "entered" or d.seq is None:
            continue
        for rank in set(d.laggards) & cycle:
            lags[rank].add((group_role(analysis, d.group), d.seq))
    standing: list[tuple[int, int]] = []
    for candidate in sorted(cycle):
        if not lags[candidate]:
            continue
        edges = list(orders)
        for rank in cycle - {candidate}:
            edges += [(blocked[rank], key) for key in lags[rank]]
        edges += [(key, blocked[candidate]) for key in lags[candidate]]
        if _acyclic(edges):
            standing.append((len(lags[candidate]), candidate))
    standing.sort()
    if not standing or (len(standing) > 1 and standing[0][0] == standing[1][0]):
        return {}
    count, rank = standing[0]
    others = len(standing) - 1
    return {rank: (f"rank {rank} went past {count} collective(s) it lags in: each member of the "
                   f"cycle {sorted(cycle)} is blocked in the last collective it entered, and only "
                   f"with rank {rank} as the one that left a collective out do their entry orders "
                   "fit one program order"
                   + (f" with so few left out ({others} other hypothesis(es) need more)"
                      if others else ""))}


def _acyclic(edges: list[tuple[tuple, tuple]]) -> bool:
    """Whether the precedences `edges` (a before b) admit one order (Kahn's algorithm)."""
    after: dict[tuple, set[tuple]] = defaultdict(set)
    indegree: dict[tuple, int] = defaultdict(int)
    for a, b in edges:
        if a == b:
            return False
        if b not in after[a]:
            after[a].add(b)
            indegree[b] += 1
            indegree.setdefault(a, 0)
    ready = [n for n, k in indegree.items() if k == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for nxt in after[node]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    return seen == len(indegree)
