"""Members a lost dump hides: groups whose membership is rebuilt from the entries (gloo's raw
pg_config names no members) miss the members that wrote no dump.

A group only its surviving members recorded looks smaller than it is: the rank that waits in it
for a peer whose dump is lost seems to wait on nobody, and seems to sit outside the part its group
plays (a TP group of one beside TP groups of two). Both mislead: its wait on the missing peer is
dropped, and it is read as lagging or skipping where it is blocked with its peers. Where the groups
of one desc split the job's ranks (Megatron's TP/DP/PP groups, a mesh dim's: each rank in one, all
of one size), the ranks no group of the part holds are members of its short groups; where they
are all ranks without a dump and fill the short groups in exactly one way, they are added:

- one short group: the ranks outside the part are its other members;
- several: the part's whole groups are translates of one offset pattern ([0, 4] and [1, 5]); each
  short group takes the one placement of that pattern over its members that uses only ranks
  outside the part, and the placements together take every outside rank once.

Anything else (a rank in two groups of the part, sizes that do not add up, two placements, an
outside rank that did dump) is left as the entries say. The reader completes the same way among
the ranks that dumped (it does not know the job's size); this is the analysis' half, where the
expected ranks are known.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

#: descs that name no part (torch's default group, groups created without a desc)
NO_PART = (None, "", "undefined", "default_pg")


def complete_with_missing(
    members: Mapping[int, tuple[int, ...]],
    descs: Mapping[int, str | None],
    rebuilt: set[int],
    expected: set[int],
    missing: set[int],
) -> dict[int, tuple[int, ...]]:
    """group -> the ranks without a dump to add to it (module docstring); only groups in
    `rebuilt` gain members."""
    if not missing or not rebuilt:
        return {}
    by_desc: dict[str, list[int]] = defaultdict(list)
    for g, desc in descs.items():
        if desc not in NO_PART and g in members:
            by_desc[desc].append(g)
    added: dict[int, tuple[int, ...]] = {}
    for groups in by_desc.values():
        added.update(_complete_part(groups, members, rebuilt, expected, missing))
    return added


def _complete_part(
    groups: list[int],
    members: Mapping[int, tuple[int, ...]],
    rebuilt: set[int],
    expected: set[int],
    missing: set[int],
) -> dict[int, tuple[int, ...]]:
    size = max(len(members[g]) for g in groups)
    short = [g for g in groups if len(members[g]) < size]
    covered = [r for g in groups for r in members[g]]
    outside = expected - set(covered)
    if (
        len(groups) < 2
        or not short
        or not set(short) <= rebuilt
        or not outside
        or not outside <= missing
        or len(covered) != len(set(covered))
        or len(covered) + len(outside) != size * len(groups)
    ):
        return {}
    if len(short) == 1:
        return {short[0]: tuple(sorted(outside))}
    whole = [sorted(members[g]) for g in groups if g not in short]
    patterns = {tuple(r - ranks[0] for r in ranks) for ranks in whole}
    if len(patterns) != 1:
        return {}
    (pattern,) = patterns
    out: dict[int, tuple[int, ...]] = {}
    taken: set[int] = set()
    for g in short:
        own = set(members[g])
        placements = []
        for anchor in {r - offset for r in own for offset in pattern}:
            placed = {anchor + offset for offset in pattern}
            if own <= placed and placed - own <= outside:
                placements.append(placed - own)
        if len(placements) != 1 or placements[0] & taken:
            return {}
        taken |= placements[0]
        out[g] = tuple(sorted(placements[0]))
    return out if taken == outside else {}
