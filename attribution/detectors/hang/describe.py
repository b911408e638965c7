"""Describing: a root of the wait-for graph as a HangRoot (its kind per rank, headline, evidence
chain, confidence and reason), and the HangReport of the whole hang: with roots, without (missing
dumps, a group stuck as a whole, no hang), or with no rows at all."""

from collections import Counter
from collections.abc import Sequence

from faultlens.attribution.detectors.hang.graph import (
    BIG,
    Analysis,
    Divergence,
    Mismatch,
    Root,
    ranks_text,
)
from faultlens.attribution.detectors.hang.hidden_p2p import silent_by_trace
from faultlens.attribution.detectors.hang.report import (
    COMPLETED_MISMATCH_CONFIDENCE,
    MAX_EVIDENCE,
    MISSING_DUMP_CONFIDENCE,
    VERDICT_FAMILY,
    HangReport,
    HangRoot,
    HangVerdict,
)

_LEVEL_RANK = {
    "mismatch": 0,
    "entered": 1,
    "completed": 2,
    "started": 3,
    "missing": 4,
    "stopped": 4,
    "p2p": 5,
    "stack": 6,
}


def rooted_report(analysis: Analysis, roots: list[Root], hang_roots: tuple[HangRoot, ...],
                  skippers: dict[int, str], follow_on_mismatches: list[Mismatch]) -> HangReport:
    """The report of a hang with at least one root: the first root heads it, every root is listed.
    A completed mismatch (no hang) heads it only where nothing hangs; beside a hang it is listed
    after the hang's roots and names no culprit of the hang."""
    hanging = tuple(r for r in hang_roots if r.kind != HangVerdict.COLLECTIVE_MISMATCH)
    if hanging:
        hang_roots = hanging + tuple(r for r in hang_roots if r not in hanging)
    counted = hanging or hang_roots  # what the report's confidence is read from
    culprits = sorted({r for root in hang_roots for r in root.ranks})
    waiting = sorted({w for root in hang_roots for w in root.waiting_ranks} - set(culprits))
    unresolved = any(root.kind == HangVerdict.CYCLE for root in hang_roots)
    head = hang_roots[0]
    summary = (
        [f"root {i + 1} of {len(hang_roots)}: {root.reason}" for i, root in enumerate(hang_roots)]
        if len(hang_roots) > 1
        else [head.reason]
    )
    lines = [*summary]
    if not hanging:
        lines.insert(0, "no hang: every member completed the mismatched collective(s)")
    for root in hang_roots:
        lines.extend(root.where)
    for root in hang_roots:
        lines.extend(e for e in root.evidence if e not in lines)
    lines.extend(skippers.values())
    own = {id(d) for r in roots for d in r.divergences}
    explained = [d for d in analysis.divergences if id(d) not in own]
    lines.extend(
        "follow-on: " + d.detail for d in sorted(explained, key=lambda d: d.time)[:MAX_EVIDENCE]
    )
    lines.extend("follow-on: " + m.detail for m in follow_on_mismatches[:MAX_EVIDENCE])
    kinds = {r: k for root in hang_roots for r, k in root.kinds}
    never = tuple(
        r
        for r in culprits
        if kinds.get(r)
        in (
            HangVerdict.NEVER_JOINED.value,
            HangVerdict.STUCK_OUTSIDE.value,
            HangVerdict.SKIPPED.value,
            HangVerdict.CYCLE.value,
        )
    )
    stalled = tuple(r for r in culprits if kinds.get(r) == HangVerdict.STALLED.value)
    reason = (
        head.reason
        if len(hang_roots) == 1
        else (
            f"{len(hang_roots)} independent roots: "
            + "; ".join(
                f"rank(s) {ranks_text(r.ranks)} {r.kind.value}"
                + (f" in {r.pg_desc or r.pg_name} seq {r.collective_seq_id}" if r.pg_name else "")
                for r in hang_roots
            )
        )
    )
    if waiting:
        reason += f"; {len(waiting)} other rank(s) wait on them (follow-ons)"
    unexplained = sorted(analysis.missing - set(culprits) - set(waiting))
    if unexplained:
        reason += (f"; rank(s) {ranks_text(unexplained)} wrote no dump, and no rank waits on them "
                   "alone (not counted)")
        lines.extend(_unexplained_lines(analysis, unexplained))
    if unresolved:
        reason += "; the ranks of a cycle wait on each other and nothing could order them"
    return HangReport(
        verdict=VERDICT_FAMILY.get(head.kind, head.kind),
        culprit_ranks=tuple(culprits),
        pg_id=head.pg_id,
        pg_name=head.pg_name,
        pg_desc=head.pg_desc,
        collective_seq_id=head.collective_seq_id,
        op=head.op,
        never_joined=never,
        stalled=stalled,
        missing_dumps=tuple(sorted(analysis.missing)),
        reason=reason,
        confidence=round(min(root.confidence for root in counted), 3),
        evidence=tuple(list(analysis.evidence) + lines),
        roots=hang_roots,
        follow_ons=tuple(waiting),
        unresolved_cycle=unresolved,
        waited_missing=tuple(sorted(analysis.waited_missing)),
    )


def rootless_report(analysis: Analysis) -> HangReport:
    """No root: missing dumps, a group stuck as a whole, or no hang."""
    evidence = list(analysis.evidence)
    missing = tuple(sorted(analysis.missing))
    waited_on = _waited_on_by_timeouts(analysis)
    if waited_on is not None:
        return waited_on
    if missing:
        # nobody that dumped waits on them: every dumped member of their groups completed what it
        # entered, or lags behind another member that dumped. They are all the dumps show, so they
        # are named, but a lost or late dump of a healthy rank looks the same: below any failover
        evidence.extend(_unexplained_lines(analysis, missing))
        reason = (f"no dump from rank(s) {ranks_text(missing)}; the ranks that dumped agree with "
                  "each other and "
                  "nothing shows a wait on the missing rank(s): a rank killed before the dump, or "
                  "a lost or late "
                  "dump of a healthy one (low confidence)")
        root = HangRoot(
            kind=HangVerdict.MISSING_DUMPS,
            ranks=missing,
            kinds=tuple((r, HangVerdict.MISSING_DUMPS.value) for r in missing),
            pg_id=None,
            pg_name=None,
            pg_desc=None,
            collective_seq_id=None,
            op=None,
            waiting_ranks=(),
            where=(),
            confidence=0.4,
            reason=reason,
            evidence=(),
        )
        return HangReport(
            verdict=HangVerdict.MISSING_DUMPS,
            culprit_ranks=missing,
            pg_id=None,
            pg_name=None,
            pg_desc=None,
            collective_seq_id=None,
            op=None,
            never_joined=(),
            stalled=(),
            missing_dumps=missing,
            reason=reason,
            confidence=0.4,
            evidence=tuple(evidence),
            roots=(root,),
        )
    if analysis.stuck_groups:
        g, seq, stuck, _t = min(analysis.stuck_groups, key=lambda x: x[3])
        evidence.append(f"{analysis.label(g)} seq {seq}: every member entered it and none "
                        "completed it")
        return HangReport(
            verdict=HangVerdict.STALLED,
            culprit_ranks=(),
            pg_id=None,
            pg_name=analysis.group_names[g],
            pg_desc=analysis.group_descs.get(g),
            collective_seq_id=seq,
            op=None,
            never_joined=(),
            stalled=stuck,
            missing_dumps=(),
            reason=f"{analysis.label(g)} seq {seq}: all {len(stuck)} members joined and none "
            "completed; no rank "
            "lags in the trace (fabric, or a peer outside these dumps)",
            confidence=0.4,
            evidence=tuple(evidence),
        )
    return HangReport(
        verdict=HangVerdict.NO_HANG, culprit_ranks=(), pg_id=None, pg_name=None, pg_desc=None,
        collective_seq_id=None, op=None, never_joined=(), stalled=(), missing_dumps=(),
        reason=f"all {len(analysis.dumped)} dumps agree: every group's members reached and "
               "completed the same collectives"
               + ("" if analysis.mismatches else ", with matching ops, sizes and dtypes (inputs "
                  "and outputs) wherever they must match"),
        confidence=0.8, evidence=tuple(evidence))


def _waited_on_by_timeouts(analysis: Analysis) -> HangReport | None:
    """Ranks without a dump whose own exits say they timed out waiting, beside ranks that dumped and
    stopped in their own code (a stack there, or, without one, every entry they recorded done):
    the ones that dumped are what the others waited on; a missing dump is never a culprit by its
    absence. None where that is not the case (a missing rank that did not say it waited, or no
    rank that dumped stopped outside the collectives)."""
    missing = sorted(analysis.missing)
    if not missing or not set(missing) <= analysis.timed_out:
        return None
    outside = tuple(
        r
        for r in sorted(analysis.dumped)
        if (
            analysis.where.get(r) is not None
            and analysis.where[r].kind.value == "outside_collectives"
        )
        or silent_by_trace(analysis, r)
    )
    if not outside:
        return None
    located = any(analysis.where.get(r) is not None for r in outside)
    confidence = 0.85 if located else 0.55  # without a stack: may be in an unrecorded send/recv
    where = tuple(analysis.where[r].text(r) for r in outside if r in analysis.where)
    reason = (f"rank(s) {ranks_text(outside)} never joined the collective their peers waited in "
              "and are inside no collective (stuck outside); rank(s) "
              f"{ranks_text(missing)} timed out waiting (their own errors) and exited without a "
              "dump")
    if where:
        reason += f"; {where[0]}"
    evidence = [
        *analysis.evidence,
        reason,
        *where,
        f"rank(s) {ranks_text(missing)}: no dump, and their exits say they timed out waiting: "
        "waiters, not culprits",
    ]
    root = HangRoot(
        kind=HangVerdict.STUCK_OUTSIDE,
        ranks=outside,
        kinds=tuple((r, HangVerdict.STUCK_OUTSIDE.value) for r in outside),
        pg_id=None,
        pg_name=None,
        pg_desc=None,
        collective_seq_id=None,
        op=None,
        waiting_ranks=tuple(missing),
        where=where,
        confidence=confidence,
        reason=reason,
        evidence=tuple(evidence[len(analysis.evidence):]),
    )
    return HangReport(
        verdict=HangVerdict.NEVER_JOINED,
        culprit_ranks=outside,
        pg_id=None,
        pg_name=None,
        pg_desc=None,
        collective_seq_id=None,
        op=None,
        never_joined=outside,
        stalled=(),
        missing_dumps=tuple(missing),
        reason=reason,
        confidence=confidence,
        evidence=tuple(evidence),
        roots=(root,),
        follow_ons=tuple(missing),
        waited_missing=(),
    )


def _unexplained_lines(analysis: Analysis, ranks: Sequence[int]) -> list[str]:
    lines = [f"no dump from rank(s) {ranks_text(ranks)}; no rank that dumped waits on them alone"]
    lines.extend(
        "unexplained missing dump: " + line for line in analysis.unexplained_missing[:MAX_EVIDENCE]
    )
    return lines


def headline(root: Root) -> Divergence | None:
    """The divergence that best says what a root did: a collective (not p2p) one, covering most of
    its ranks, earliest."""
    ranks = set(root.ranks)
    # a mismatched collective the root's ranks hold their group in says what they did, whatever else
    # they lag in
    return min(
        root.divergences,
        key=lambda d: (
            d.level != "mismatch",
            d.level in ("p2p", "stack"),
            -len(set(d.laggards) & ranks),
            d.time,
            _LEVEL_RANK[d.level],
        ),
        default=None,
    )


def _rank_kind(analysis: Analysis, rank: int, root: Root, skippers: dict[int, str]) -> HangVerdict:
    if rank in analysis.missing:
        place = analysis.where.get(rank)  # a stack of it may still say where it is
        return (
            HangVerdict.STUCK_OUTSIDE
            if place is not None and place.kind.value == "outside_collectives"
            else HangVerdict.MISSING_DUMPS
        )
    if rank in skippers:
        return HangVerdict.SKIPPED
    if root.cyclic:
        return HangVerdict.CYCLE
    levels = {d.level for d in root.divergences if rank in d.laggards}
    if (not levels or "mismatch" in levels) and root.mismatches:
        return root.mismatches[0].kind
    if levels & {"completed", "started"}:
        # stuck inside a collective its peers completed: that explains the rest
        return HangVerdict.STALLED
    place = analysis.where.get(rank)
    if place is not None and place.kind.value == "outside_collectives":
        return HangVerdict.STUCK_OUTSIDE
    if silent_by_trace(analysis, rank):
        # every entry it recorded completed: it is inside no collective
        return HangVerdict.STUCK_OUTSIDE
    # a stack was taken and shows no thread of it (the process or thread is gone: crashed), or it is
    # blocked in something the trace does not explain
    return HangVerdict.NEVER_JOINED


def describe_root(analysis: Analysis, root: Root, skippers: dict[int, str]) -> tuple[HangRoot, int]:
    head = headline(root)
    mismatch = min(root.mismatches, key=lambda m: m.time, default=None)
    kinds = {r: _rank_kind(analysis, r, root, skippers) for r in root.ranks}
    use_mismatch = mismatch is not None and (
        head is None or mismatch.time <= head.time or head.level == "mismatch"
    )
    # every member went past the mismatch and nobody waits on these ranks: no hang, a silent desync
    completed_only = (
        use_mismatch and mismatch.completed and not root.divergences and not root.waiting
    )
    if use_mismatch:
        kind = HangVerdict.COLLECTIVE_MISMATCH if completed_only else mismatch.kind
        kinds = {r: (kind if r in mismatch.odd or mismatch.tie else k) for r, k in kinds.items()}
    else:
        kind = Counter(kinds.values()).most_common(1)[0][0]
    where = tuple(analysis.where[r].text(r) for r in root.ranks if r in analysis.where)
    chain = []
    if use_mismatch:
        chain.append(mismatch.detail)
    for d in sorted(root.divergences, key=lambda d: (d is not head, d.time))[:MAX_EVIDENCE]:
        if (
            use_mismatch
            and d.level == "mismatch"
            and (d.group, d.seq) == (mismatch.group, mismatch.seq)
        ):
            chain.append(f"rank(s) {ranks_text(d.waiters)} wait in it for rank(s) "
                         f"{ranks_text(d.laggards)}")
            continue
        chain.append(d.detail)
    for m in root.mismatches:
        if m is not mismatch or not use_mismatch:
            chain.append("follow-on: " + m.detail)
    if root.uncertain:
        chain.append("uncertain: " + root.uncertain)
    if completed_only:
        chain.append(f"{analysis.label(mismatch.group)} seq {mismatch.seq}: every member went past "
                     "it; nobody waits on it (no hang)")
    # confidence
    if kind == HangVerdict.CYCLE:
        confidence = 0.5
    elif completed_only:
        confidence = min(COMPLETED_MISMATCH_CONFIDENCE, 0.4 if mismatch.tie else 1.0)
    elif use_mismatch:
        confidence = 0.95 if len(mismatch.majority) >= 2 * len(mismatch.odd) else 0.8
        if mismatch.tie:
            confidence = (
                0.75
                if head is not None or set(root.ranks) != set(mismatch.odd) | set(mismatch.majority)
                else 0.4
            )
    elif kind == HangVerdict.SKIPPED:
        confidence = 0.8
    else:
        groups = Counter(r for d in root.divergences for r in set(d.laggards) & set(root.ranks))
        located = any(
            analysis.where.get(r) is not None
            and analysis.where[r].kind.value == "outside_collectives"
            for r in root.ranks
        )
        confidence = 0.95 if (groups and min(groups.values()) >= 2) or located else 0.85
        if kind == HangVerdict.MISSING_DUMPS:
            # named by its absence alone (no dump, no stack of its own): a lost dump weakens
            confidence = min(confidence, MISSING_DUMP_CONFIDENCE)
        if kind == HangVerdict.MISSING_DUMPS and not any(d.confirmed for d in root.divergences):
            # only ranks that stopped early, with no stack showing them gone, wait on it: they may
            # as well be stuck in their own code (a culprit whose last group holds a lost dump)
            confidence = 0.55
        if root.uncertain:
            confidence = min(confidence, 0.55)
        if kind == HangVerdict.MISSING_DUMPS and not all(
            _own_evidence(analysis, root, r) for r in root.ranks
        ):
            # a wait on several ranks without a dump, and nothing that waits on this one alone:
            # which of them the others wait on, the dumps cannot tell
            confidence = min(confidence, 0.5)
    if use_mismatch:
        group, seq, op, pg_id, t = (
            mismatch.group,
            mismatch.seq,
            mismatch.op,
            mismatch.pg_id,
            mismatch.time,
        )
        what = mismatch.detail
    elif head is not None:
        group, seq, op, pg_id, t = head.group, head.seq, head.op, head.pg_id, head.time
        what = head.detail
    else:
        group, seq, op, pg_id, t, what = -1, None, None, None, BIG, ""
    phrase = {HangVerdict.STUCK_OUTSIDE: "never joined the collective their peers wait in and are "
                                         "inside no "
                                         "collective (stuck outside)",
              HangVerdict.SKIPPED: "left a collective out and went on (their peers wait in it)",
              HangVerdict.CYCLE: "wait on each other in a cycle nothing could order",
              HangVerdict.COLLECTIVE_MISMATCH: "called a collective with another op, sizes or "
                                               "dtypes than their peers, and every member "
                                               "completed it (no hang: a silent desync, the "
                                               "precursor of a hang or of corrupted training)",
              }.get(kind) or _verdict_phrase(kind)
    reason = f"rank(s) {ranks_text(root.ranks)} {phrase}: {what}"
    skip_text = [skippers[r] for r in root.ranks if r in skippers]
    if skip_text:
        reason += f" ({skip_text[0]})"
    if where:
        reason += f"; {where[0]}"
    if root.waiting:
        reason += f"; rank(s) {ranks_text(sorted(root.waiting))} wait on them"
    valid = 0 <= group < len(analysis.group_names)
    return HangRoot(
        kind=kind,
        ranks=tuple(root.ranks),
        kinds=tuple((r, k.value) for r, k in sorted(kinds.items())),
        pg_id=pg_id,
        pg_name=analysis.group_names[group] if valid else None,
        pg_desc=analysis.group_descs.get(group) if valid else None,
        collective_seq_id=seq,
        op=op,
        waiting_ranks=tuple(sorted(root.waiting)),
        where=where,
        confidence=confidence,
        reason=reason,
        evidence=tuple(chain),
    ), t


def _own_evidence(analysis: Analysis, root: Root, rank: int) -> bool:
    """Whether some rank waits on `rank` (without a dump) alone, not on it or another rank without a
    dump.
    """
    return rank not in analysis.missing or any(
        rank in d.laggards and not (set(d.laggards) & analysis.missing) - {rank}
        for d in root.divergences
    )


def _verdict_phrase(verdict: HangVerdict) -> str:
    return {
        HangVerdict.NEVER_JOINED: "never joined the collective their peers wait in",
        HangVerdict.STALLED: "joined the collective but did not complete it while their peers did",
        HangVerdict.MISSING_DUMPS: "wrote no dump and their peers wait on them",
        HangVerdict.SIZE_MISMATCH: "called a collective with other sizes/dtypes than their peers",
        HangVerdict.OP_MISMATCH: "called another collective than their peers",
    }.get(verdict, "lag")


def report_empty(expected_ranks: Sequence[int] | None) -> HangReport:
    missing = tuple(sorted(int(r) for r in expected_ranks)) if expected_ranks else ()
    return HangReport(
        verdict=HangVerdict.MISSING_DUMPS if missing else HangVerdict.UNKNOWN,
        culprit_ranks=(),
        pg_id=None,
        pg_name=None,
        pg_desc=None,
        collective_seq_id=None,
        op=None,
        never_joined=(),
        stalled=(),
        missing_dumps=missing,
        reason="no flight-recorder rows to analyse",
        confidence=0.0,
        evidence=(),
    )
