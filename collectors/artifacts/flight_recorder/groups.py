"""Process-group facts from a dump: the ranks of a group as pg_config spells them (parse_ranks), a
group's pg_status counters, and the communication library a dump's ops name."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from faultlens.collectors.artifacts.flight_recorder.model import Dump, DumpFormatError
from faultlens.collectors.artifacts.flight_recorder.values import as_int
from faultlens.collectors.artifacts.fr_limits import default_limits

_RANKS_CACHE: dict[tuple[str, int], tuple[int, ...] | None] = {}


def _rank_list(values: Any, world: int) -> tuple[int, ...] | None:
    if not isinstance(values, (list, tuple)) or len(values) > world:
        return None
    ranks = []
    for r in values:
        if isinstance(r, str) and 0 < len(r.strip()) <= 10 and r.strip().isdigit():
            r = int(r.strip())
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world:
            return None
        ranks.append(r)
    return tuple(sorted(ranks)) or None


def parse_ranks(text: Any, max_world_size: int | None = None) -> tuple[int, ...] | None:
    """pg_config 'ranks' ('[0, 1, 2]' or a list) -> sorted tuple; None when empty or unreadable, or
    when a rank is not one of a real job (outside 0..max_world_size-1: fr_limits)."""
    world = max_world_size or default_limits().max_world_size
    if isinstance(text, (list, tuple)):
        return _rank_list(text, world)
    if not isinstance(text, str):
        return None
    cached = _RANKS_CACHE.get((text, world), ...)
    if cached is not ...:
        return cached  # type: ignore[return-value]
    try:
        ranks = _rank_list(json.loads(text), world) if len(text) <= 16 * world + 2 else None
    except (ValueError, TypeError, RecursionError):
        ranks = None
    if len(_RANKS_CACHE) < 65536:
        _RANKS_CACHE[(text, world)] = ranks
    return ranks


def config_ranks(pg_config: Mapping[str, Any], name: str | None,
                 max_world_size: int | None = None) -> tuple[int, ...] | None:
    """The ranks pg_config gives the group `name` (parse_ranks), None where it gives none."""
    if name is None or not name:
        return None
    entry = pg_config.get(name)
    if not isinstance(entry, Mapping):
        return None
    return parse_ranks(entry.get("ranks"), max_world_size)


def status_value(status: Mapping[str, Any], pg_id: str, key: str) -> int | None:
    """One pg_status counter of the group `pg_id`, None where it is missing or not an integer."""
    group = status.get(pg_id)
    if not isinstance(group, Mapping):
        return None
    try:
        return as_int(group.get(key), key)
    except DumpFormatError:
        return None


def comm_lib_of(dump: Dump) -> str | None:
    """The communication library of a dump: its ops' prefix, else what its version field implies."""
    ops = dump.strings["op"].values
    for prefix in ("nccl", "gloo", "ucc", "mpi", "xccl"):
        if any(op.startswith(prefix + ":") for op in ops):
            return prefix
    if dump.comm_lib_version:
        return "nccl"
    return "gloo" if dump.comm_lib_version == "" else None


def complete_partitions(members: Mapping[str, set[int]], descs: Mapping[str, str], ranks: set[int]
                        ) -> dict[str, list[int]]:
    """Members the entries cannot show, for groups whose pg_config is unusable (gloo's): where the
    groups of one part split the job's ranks (a mesh dim's, Megatron's TP/DP/PP groups: each rank in
    one, all of one size), a rank that never entered its group's first collective is in none of
    them. A part is the groups of one desc, or a creation run of groups without one (parts). Where
    exactly one group is short and the ranks outside every group of the part fill it exactly, they
    are its members. Where several are short, the part's whole groups must all be one pattern of
    rank offsets (a mesh dim's groups are translates of one another: [1, 5] and [3, 7]); each short
    group is completed by the one placement of that pattern over its members that takes only ranks
    outside the part, and the completions must take every outside rank once. Anything else (a rank
    in two groups, sizes that cannot add up, two placements) is left as the entries say.
    `members`: group -> ranks seen in its entries (those groups only); returns group -> the ranks
    to add."""
    out: dict[str, list[int]] = {}
    for groups in _parts(members, descs):
        covered = [r for name in groups for r in members[name]]
        size = max((len(members[name]) for name in groups), default=0)
        short = [name for name in groups if len(members[name]) < size]
        outside = set(ranks) - set(covered)
        if (
            len(groups) < 2
            or not short
            or len(covered) != len(set(covered))
            or len(covered) + len(outside) != size * len(groups)
        ):
            continue
        if len(short) == 1:
            out[short[0]] = sorted(outside)
            continue
        out.update(_by_pattern([members[n] for n in groups if n not in short],
                               {n: members[n] for n in short}, outside))
    return out


def _parts(members: Mapping[str, set[int]], descs: Mapping[str, str]) -> list[list[str]]:
    """The groups of each desc, and the creation runs of groups without a desc (torch names them by
    a counter: '5', '6', ...): consecutive names whose members seen so far are disjoint (a group
    sharing a rank with the run starts the next part)."""
    by_desc: dict[str, list[str]] = defaultdict(list)
    numbered = []
    for name in members:
        desc = descs.get(name)
        if desc and desc not in ("default_pg", "undefined"):
            by_desc[desc].append(name)
        elif desc != "default_pg" and name.isdigit() and len(name) < 10:
            numbered.append((int(name), name))
    parts = list(by_desc.values())
    run: list[str] = []
    covered: set[int] = set()
    last = None
    for number, name in sorted(numbered):
        if run and (number != last + 1 or covered & members[name]):
            parts.append(run)
            run, covered = [], set()
        run.append(name)
        covered |= members[name]
        last = number
    if run:
        parts.append(run)
    return parts


def _by_pattern(whole: list[set[int]], short: Mapping[str, set[int]], outside: set[int]
                ) -> dict[str, list[int]]:
    """Short groups completed by the one offset pattern of the whole groups (complete_partitions),
    or nothing."""
    patterns = {tuple(r - min(m) for r in sorted(m)) for m in whole}
    if len(patterns) != 1:
        return {}
    (pattern,) = patterns
    added: dict[str, list[int]] = {}
    for name, seen in short.items():
        placements = set()
        for anchor in seen:
            for offset in pattern:
                group = frozenset(anchor - offset + p for p in pattern)
                if seen <= group and group - seen <= outside:
                    placements.add(group)
        if len(placements) != 1:
            return {}
        added[name] = sorted(next(iter(placements)) - seen)
    taken = [r for ranks in added.values() for r in ranks]
    if len(taken) != len(set(taken)) or set(taken) != outside:
        return {}
    return added
