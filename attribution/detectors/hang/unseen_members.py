"""Groups whose other members no dump shows: every membership the dumps allow, and the answer
they all give.

gloo's raw pg_config names no members, so a group is known by the ranks that recorded it. A rank
whose last entry is the first (and only) collective of a group no other rank recorded waits there
on members nobody names (a skip before any history of the group: its peers never entered it). The
dumps still bound who they can be: every rank creates every group in the same order (torch names
desc-less groups by one counter), and a rank's local process-group id of a group it recorded is
1 + the number of earlier groups it belongs to. A rank whose known earlier groups already make up
that count belongs to no other earlier group. Each such group is given one more member, each
candidate in turn (a collective someone waits in has at least two members); where every
membership so made gives one and the same answer, naming its culprits at the failover confidence
and no uncertain root, the unknown membership does not matter and that answer stands. Any
disagreement, or more than MAX_MEMBERSHIPS memberships, leaves the report as it was.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

import pyarrow as pa

from faultlens.attribution.detectors.hang.graph import Analysis, ranks_text
from faultlens.attribution.detectors.hang.report import HangReport

#: memberships tried at most (the product of each group's candidates)
MAX_MEMBERSHIPS = 64
#: only small sets are tried (each membership is one more analysis of the table)
MAX_ROWS = 50_000


def unanimous_membership(
    table: pa.Table,
    analysis: Analysis,
    report: HangReport,
    analyse: Callable[[pa.Table], HangReport],
) -> HangReport:
    """The report under every membership the dumps allow where they all agree (module docstring),
    else `report`. `analyse`: the analysis of a table (without this step)."""
    if table.num_rows > MAX_ROWS or not analysis.p2p_unrecorded or not report.roots:
        return report
    # only where the analysis itself stands unsure of a rank (one waiting in such a group)
    unsure = {r for root in report.roots for r in root.ranks
              if any(line.startswith("uncertain: ") for line in root.evidence)}
    needed = ("rank", "pg_name", "pg_id", "record_id", "pg_ranks")
    if not unsure or any(c not in table.column_names for c in needed):
        return report
    cols = {c: table.column(c).to_pylist() for c in needed}
    unseen = _unseen_groups(analysis, cols)
    if not unseen or not unsure & {r for r, _ in unseen.values()}:
        return report
    candidates = _candidates(analysis, cols, unseen)
    sizes = [len(c) for c in candidates.values()]
    if not all(sizes) or _product(sizes) > MAX_MEMBERSHIPS:
        return report
    first_row = {}
    for i, (name, ranks) in enumerate(zip(cols["pg_name"], cols["pg_ranks"], strict=True)):
        if ranks is not None:
            first_row.setdefault(name, i)
    if any(name not in first_row for name in candidates):
        return report
    answers = []
    field = table.schema.field("pg_ranks")
    index = table.column_names.index("pg_ranks")
    for choice in itertools.product(*candidates.values()):
        ranks = list(cols["pg_ranks"])
        for name, extra in zip(candidates, choice, strict=True):
            ranks[first_row[name]] = sorted({unseen[name][0], extra})
        answers.append(analyse(table.set_column(index, field, pa.array(ranks, field.type))))
    first = answers[0]
    if not all(_same(first, a) for a in answers) or not _sure(first):
        return report
    shown = ", ".join(f"{name!r} ([{unseen[name][0]}] + one of [{ranks_text(c)}])"
                      for name, c in candidates.items())
    note = (f"group(s) {shown} recorded by one rank each (gloo's raw pg_config names no members; "
            "the candidates are what the ranks' local process-group ids allow): all "
            f"{len(answers)} memberships give this answer")
    return replace(first, evidence=(*first.evidence, note))


def _product(sizes: Sequence[int]) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


def _unseen_groups(analysis: Analysis, cols: dict[str, list]) -> dict[str, tuple[int, int]]:
    """name -> (its one recording rank, that rank's local id of it) for each desc-less group of
    one member, the rank that recorded it (membership rebuilt from the entries), whose one entry
    is that rank's last."""
    last: dict[int, tuple[int, str]] = {}
    count: dict[tuple[int, str], int] = {}
    local: dict[tuple[int, str], int] = {}
    for rank, name, pg_id, record in zip(cols["rank"], cols["pg_name"], cols["pg_id"],
                                         cols["record_id"], strict=True):
        if record is None or name is None:
            continue
        count[(rank, name)] = count.get((rank, name), 0) + 1
        if str(pg_id).isdigit():
            local[(rank, name)] = int(pg_id)
        if rank not in last or record > last[rank][0]:
            last[rank] = (record, name)
    out = {}
    recorded: dict[str, set[int]] = {}
    for rank, name in count:
        recorded.setdefault(str(name), set()).add(rank)
    for g, members in analysis.members.items():
        name = analysis.group_names[g]
        if len(members) != 1 or not str(name).isdigit():
            continue
        if analysis.group_descs.get(g) not in (None, "undefined"):
            continue
        (rank,) = members
        only = recorded.get(str(name)) == {rank} and count.get((rank, name)) == 1
        if only and last.get(rank, (0, None))[1] == name:
            out[str(name)] = (rank, local.get((rank, name), -1))
    return out


def _candidates(analysis: Analysis, cols: dict[str, list], unseen: dict[str, tuple[int, int]]
                ) -> dict[str, list[int]]:
    """Each unseen group's possible other member: any expected rank but those whose local ids
    say they belong to no other group created before a group they recorded."""
    member_of: dict[int, set[int]] = {}
    for g, members in analysis.members.items():
        name = str(analysis.group_names[g])
        if name.isdigit() and analysis.group_descs.get(g) != "default_pg":
            for r in members:
                member_of.setdefault(r, set()).add(int(name))
    excluded: dict[str, set[int]] = {name: set() for name in unseen}
    seen_ids = {(r, n, i) for r, n, i in zip(cols["rank"], cols["pg_name"], cols["pg_id"],
                                            strict=True) if n is not None and str(n).isdigit()}
    for rank, name, pg_id in seen_ids:
        if not str(pg_id).isdigit() or int(pg_id) < 1:
            continue
        number = int(name)
        known = sum(1 for m in member_of.get(rank, ()) if m < number)
        if known == int(pg_id) - 1:
            for other in unseen:
                if int(other) < number:
                    excluded[other].add(rank)
    return {name: sorted(analysis.expected - {rank} - excluded[name])
            for name, (rank, _local) in sorted(unseen.items(), key=lambda kv: int(kv[0]))}


def _same(a: HangReport, b: HangReport) -> bool:
    return (a.culprit_ranks, a.verdict, [(r.kind, r.ranks) for r in a.roots]) == (
        b.culprit_ranks, b.verdict, [(r.kind, r.ranks) for r in b.roots])


def _sure(report: HangReport) -> bool:
    """One answer that names its culprits and stands at its own confidence (no uncertain root)."""
    return bool(report.culprit_ranks) and not report.unresolved_cycle and not any(
        line.startswith("uncertain: ") for root in report.roots for line in root.evidence)
