"""Mismatches a lost dump hides. In a group whose other members wrote no dump (a group of two: the
partner's dump lost), nothing inside the group says the present members called another collective
than their partners: the comparison needs both sides. The groups playing the same part (the other EP
pairs, the other DP groups) say what the collective at that sequence id is: where every one of them
(two or more) agrees on one op, sizes and dtypes and the present members called something else, they
are the odd ones. Only unanimity counts: groups of one part may differ by design (data-parallel
groups of different pipeline stages reduce buckets of different sizes)."""

from collections import Counter

import pyarrow as pa

from faultlens.attribution.detectors.hang.columns import LazyColumn
from faultlens.attribution.detectors.hang.decode import SliceDecoder
from faultlens.attribution.detectors.hang.details import Signature, signatures_of_keys
from faultlens.attribution.detectors.hang.graph import BIG, Analysis, Mismatch, ranks_text
from faultlens.attribution.detectors.hang.lookups import rows_for_keys
from faultlens.attribution.detectors.hang.report import HangVerdict
from faultlens.attribution.detectors.hang.skips import group_role, groups_by_role

# the group's latest collectives compared (a mismatch further back has been followed by others)
RECENT = 8


def partner_mismatches(
    analysis: Analysis,
    decoder: SliceDecoder,
    table: pa.Table,
    times: LazyColumn,
    latest: dict[int, int],
) -> None:
    """Adds a mismatch per group with members without a dump whose present members' latest
    collectives differ from what every other group of its part called at the same sequence id.
    latest: group -> its highest seq."""
    if not analysis.missing_groups:
        return
    by_role = groups_by_role(analysis)
    checks: list[tuple[int, list[int], list[int]]] = []
    wanted: set[tuple[int, int]] = set()
    for missing_group in analysis.missing_groups:
        g = missing_group.group
        others = [o for o in by_role.get(group_role(analysis, g), ()) if o != g][:64]
        top = latest.get(g)
        if len(others) < 2 or top is None:
            continue
        seqs = list(range(max(0, top - RECENT + 1), top + 1))
        checks.append((g, seqs, others))
        wanted.update((o, s) for o in (g, *others) for s in seqs)
    by_key = signatures_of_keys(decoder, table, wanted) if checks else {}
    for g, seqs, others in checks:
        for s in seqs:
            found = _odd_against_part(by_key, g, s, others)
            if found is not None:
                analysis.mismatches.append(_mismatch(analysis, decoder, times, g, s, *found))
                break


def _odd_against_part(
    by_key: dict[tuple[int, int], dict[int, Signature]], g: int, s: int, others: list[int]
) -> tuple[tuple[int, ...], Signature, Signature, tuple[int, ...]] | None:
    """(the group's present members, their signature, the part's, the ranks of the part's groups)
    where the group's present members agree with each other and differ from every other group of the
    part, which agree."""
    mine = by_key.get((g, s))
    if not mine or len(set(mine.values())) != 1:
        # nothing of it, or its members disagree among themselves (an ordinary mismatch)
        return None
    theirs = [by_key[(o, s)] for o in others if (o, s) in by_key]
    agreed = Counter(next(iter(sigs.values())) for sigs in theirs if len(set(sigs.values())) == 1)
    if len(theirs) < 2 or len(agreed) != 1 or sum(agreed.values()) != len(theirs):
        return None
    part_sig = next(iter(agreed))
    own = next(iter(mine.values()))
    if own == part_sig:
        return None
    return tuple(sorted(mine)), own, part_sig, tuple(sorted(r for sigs in theirs for r in sigs))


def _mismatch(
    analysis: Analysis,
    decoder: SliceDecoder,
    times: LazyColumn,
    g: int,
    s: int,
    odd: tuple[int, ...],
    own: Signature,
    part_sig: Signature,
    majority: tuple[int, ...],
) -> Mismatch:
    ops = decoder.ops.values
    kind = HangVerdict.OP_MISMATCH if own[0] != part_sig[0] else HangVerdict.SIZE_MISMATCH
    rows = rows_for_keys(decoder, [(g, s)]).get((g, s))
    time = BIG
    if rows is not None:
        values, valid = times.at(rows)
        time = int(values[valid].min()) if valid.any() else BIG
    what = "op" if kind == HangVerdict.OP_MISMATCH else "size/dtype"
    missing = [r for r in analysis.members.get(g, ()) if r in analysis.missing]
    detail = (f"{analysis.label(g)} seq {s}: {what} mismatch, rank(s) {ranks_text(odd)} called "
              f"{_op(ops, own[0])} where every other group of its part called "
              f"{_op(ops, part_sig[0])}"
              + (" with other sizes/dtypes" if kind == HangVerdict.SIZE_MISMATCH else "")
              + f" (rank(s) {ranks_text(majority)}); its other member(s), rank(s) "
                f"{ranks_text(missing)}, wrote no "
                "dump")
    return Mismatch(g, s, kind, odd, majority, False, time, detail, _op(ops, part_sig[0]), None)


def _op(ops: list, code: int) -> str:
    return str(ops[code]) if 0 <= code < len(ops) else "?"
