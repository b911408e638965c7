"""From a dump set to an incident: the latest dump set of an attempt, analysed; culprits mapped
to nodes and GPUs; cycles broken by progress."""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from faultlens.attribution.detectors.desync import apart_text, completed_steps, ranks_apart
from faultlens.attribution.detectors.progress.monitor import completion_times
from faultlens.attribution.detectors.progress.suspect import (
    DumpRequester,
    HangAnalyzer,
    HangSuspect,
    default_analyzer,
)
from faultlens.attribution.hardware import XidCatalogLike, as_datetime, hardware_findings
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.telemetry import Placement, Telemetry, placements
from faultlens.attribution.rules import CrashRules

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- from a dump set to an incident


def latest_dump_set(collectives: pa.Table, job: str | None, attempt: int | None) -> pa.Table:
    """The newest dump of every rank of one attempt (collectives rows of possibly many dumps)."""
    if collectives.num_rows == 0:
        return collectives
    mask = (
        pc.fill_null(pc.equal(collectives.column("job_id"), pa.scalar(job)), False)
        if job is not None
        else pc.is_null(collectives.column("job_id"))
    )
    rows = collectives.filter(mask)
    if attempt is not None and rows.num_rows:
        same = rows.filter(
            pc.fill_null(pc.equal(rows.column("attempt"), pa.scalar(attempt, pa.int32())), False)
        )
        unknown = rows.filter(pc.is_null(rows.column("attempt")))
        rows = same if same.num_rows else unknown
    if rows.num_rows == 0:
        return rows
    frame = pa.table(
        {
            "rank": rows.column("rank"),
            "dump_id": pc.fill_null(rows.column("dump_id"), ""),
            "ts": rows.column("ts"),
        }
    )
    newest = frame.group_by(["rank", "dump_id"]).aggregate([("ts", "max")]).to_pandas()
    keep = newest.sort_values("ts_max").drop_duplicates("rank", keep="last")
    wanted = set(zip(keep["rank"].tolist(), keep["dump_id"].tolist(), strict=True))
    keys = zip(frame.column("rank").to_pylist(), frame.column("dump_id").to_pylist(), strict=True)
    return rows.filter(pa.array([key in wanted for key in keys]))


#: verdicts that say the ranks disagree on what they called (the code's doing, no node's)
MISMATCH_VERDICTS = frozenset({"size_mismatch", "op_mismatch", "collective_mismatch"})


def waiting_ranks(
    process_events: pd.DataFrame, attempt: int | None, rules: CrashRules
) -> frozenset[int]:
    """Ranks of `attempt` whose own exit says they were waiting on a peer: a collective's timeout
    (rules/crash.yaml timeout_patterns) or a survivor's echo of another's failure (is_secondary),
    not a rank told to stop (termination_patterns)."""
    needed = {"rank", "attempt", "message", "is_secondary"}
    if process_events is None or len(process_events) == 0:
        return frozenset()
    if not needed <= set(process_events.columns):
        return frozenset()
    rows = process_events[sorted(needed)].dropna(subset=["rank"])
    if attempt is not None:
        rows = rows[rows["attempt"] == attempt]
    timeouts = [re.compile(p) for p in rules.timeout_patterns]
    stopped = [re.compile(p) for p in rules.termination_patterns]
    waited: set[int] = set()
    for rank, message, secondary in zip(
        rows["rank"], rows["message"], rows["is_secondary"].fillna(False).astype(bool), strict=True
    ):
        text = message if isinstance(message, str) else ""
        echo = secondary and not any(p.search(text) for p in stopped)
        if echo or any(p.search(text) for p in timeouts):
            waited.add(int(rank))
    return frozenset(waited)


def _verdict(report: Any) -> str:
    verdict = getattr(report, "verdict", "unknown")
    return str(getattr(verdict, "value", verdict)).lower()


class HangAttributor:
    """Turns a hang suspect into a collective_hang incident: dump request, hang analysis, culprits,
    cause.
    """

    def __init__(
        self,
        crash_rules: CrashRules,
        catalog: XidCatalogLike | None,
        analyzer: HangAnalyzer | None = None,
        dump_requester: DumpRequester | None = None,
    ) -> None:
        self.rules = crash_rules
        self.catalog = catalog
        self._analyzer = analyzer
        self.dump_requester = dump_requester

    @property
    def analyzer(self) -> HangAnalyzer:
        if self._analyzer is None:
            self._analyzer = default_analyzer()
        return self._analyzer

    def dumps_for(self, suspect: HangSuspect, telemetry: Telemetry) -> tuple[pa.Table, str]:
        """The dump set to analyse: what the dump requester returns, else the newest dumps in the
        store.
        """
        if self.dump_requester is not None:
            try:
                requested = self.dump_requester(suspect)
            except Exception as exc:  # a failing trigger must not stop attribution
                log.warning("flight-recorder dump request for %s attempt %s failed: %s",
                            suspect.job_id, suspect.attempt, exc)
                requested = None
            if requested is not None and requested.num_rows:
                return requested, "requested dump set"
        return latest_dump_set(
            telemetry.collectives, suspect.job_id, suspect.attempt
        ), "dumps in the store"

    def attribute(self, suspect: HangSuspect, telemetry: Telemetry, now: dt.datetime) -> Incident:
        placement = placements(
            telemetry.ranks,
            suspect.attempt,
            telemetry.process_events,
            telemetry.steps,
            telemetry.heartbeats,
        )
        expected = sorted(placement) or None
        dumps, origin = self.dumps_for(suspect, telemetry)
        evidence = list(suspect.evidence)
        if dumps.num_rows == 0:
            evidence.append(Evidence("collectives", None, "no flight-recorder dumps for this "
                                                          "attempt"))
            return self._incident(
                suspect,
                now,
                Cause.UNKNOWN,
                "hang-no-dumps",
                0.3,
                (),
                placement,
                evidence,
                "collective hang suspected; no flight-recorder dumps to analyse",
            )
        waited = waiting_ranks(telemetry.process_events, suspect.attempt, self.rules)
        # the shipped analysis takes the ranks whose exits say they waited (a missing dump of one is
        # never a culprit by absence); an analyzer passed in is called as the protocol says
        extra = {"timed_out": waited} if waited and self._analyzer is None else {}
        report = self.analyzer(dumps, expected, **extra)
        verdict = _verdict(report)
        culprits = tuple(int(r) for r in getattr(report, "culprit_ranks", ()) or ())
        dump_ranks = len(set(dumps.column("rank").to_pylist()))
        evidence.append(Evidence("collectives", as_datetime(pc.max(dumps.column("ts")).as_py()),
                                 f"hang analysis of {origin} ({dump_ranks} rank(s), "
                                 f"{dumps.num_rows} entries): "
                                 f"{verdict}: {getattr(report, 'reason', '')}"))
        lines = tuple(getattr(report, "evidence", ()) or ())[:5]
        evidence.extend(Evidence("collectives", None, str(line)) for line in lines)
        confidence = float(getattr(report, "confidence", 0.5) or 0.0)
        cause, rule = Cause.UNKNOWN, f"hang-{verdict.replace('_', '-')}"
        lost = _lost_node(getattr(report, "missing_dumps", ()) or (), placement)
        if lost is not None and not _waited_on(report, lost[1]):
            # nothing that dumped waits on them (a node's dumps lost or late, or its ranks waiting
            # themselves): the analysis' own low-confidence answer stands
            evidence.append(Evidence("collectives", None, f"every rank of {lost[0]} "
                                                          f"({_ranks_short(lost[1])}) "
                                                          "wrote no dump, but no rank that dumped "
                                                          "waits on them"))
            lost = None
        if lost is not None and verdict not in MISMATCH_VERDICTS:
            # every rank of one node (and only those) wrote no dump while all the others did: the
            # node is gone (power, kernel, board); the ranks its loss blocked elsewhere (pipeline
            # peers, the groups waiting on it) are follow-ons, never culprits
            node, lost_ranks = lost
            others = sorted(r for r in culprits if r not in lost_ranks)
            evidence.append(
                Evidence(
                    "collectives",
                    None,
                    f"every rank of {node} "
                    f"({_ranks_short(lost_ranks)}) and "
                    f"only those wrote no dump: {node} was "
                    "lost" + (f"; ranks {_ranks_short(others)} waited on it" if others else ""),
                )
            )
            culprits = tuple(lost_ranks)
            verdict = "node_lost"
            cause, rule, confidence = Cause.HOST, "hang-node-lost", max(confidence, 0.9)
            findings = hardware_findings(
                telemetry.gpu_events, node, suspect.since, self.rules, self.catalog
            )
            if findings:
                best = max(findings, key=lambda f: (f.same_gpu, f.confidence))
                cause, rule = best.cause, "hang-node-lost-hardware"
                evidence.extend(f.evidence() for f in findings[:3])
        elif verdict in MISMATCH_VERDICTS:
            # the ranks called different collectives or shapes: the code's, never a node's (a
            # mismatch every member completed is reported below the failover threshold)
            cause = Cause.SOFTWARE
        elif verdict == "stalled":
            cause = Cause.NETWORK
            confidence *= 0.7
        elif verdict in {"never_joined", "missing_dumps"}:
            findings = [
                f
                for rank in culprits
                for f in hardware_findings(
                    telemetry.gpu_events,
                    _node(placement, rank),
                    suspect.since,
                    self.rules,
                    self.catalog,
                    placement.get(rank),
                )
            ]
            if findings:
                best = max(findings, key=lambda f: (f.same_gpu, f.confidence))
                cause, rule = best.cause, f"hang-{verdict.replace('_', '-')}-hardware"
                confidence = max(confidence, best.confidence)
                evidence.extend(f.evidence() for f in findings[:3])
        elif verdict == "no_hang":
            culprits = ()
            confidence = min(confidence, 0.4)
        if getattr(report, "unresolved_cycle", False) and len(culprits) > 1:
            # a cycle the dumps could not order (gloo records no send/recv): the member that
            # completed a step whose collectives the others are still inside went past one of them;
            # it left the sequence
            completed = completed_steps(telemetry, suspect.attempt, sorted(placement))
            apart, majority = ranks_apart(completed, set())
            if apart and set(apart) < set(culprits):
                rule, culprits = "hang-cycle-progress", tuple(apart)
                confidence = self.rules.conf(rule, 0.5)
                evidence.append(Evidence("heartbeats", None, apart_text(
                    completed, apart, majority, "it went past a collective the others wait in (it "
                                                "skipped it)")))
        group = (
            getattr(report, "pg_desc", None)
            or getattr(report, "pg_name", None)
            or getattr(report, "pg_id", None)
        )
        op = getattr(report, "op", None)
        seq = getattr(report, "collective_seq_id", None)
        summary = (
            f"collective hang: {verdict}"
            + (f" in group {group}" if group else "")
            + (f" at {op} #{seq}" if op else "")
            + (f"; culprit ranks {list(culprits)}" if culprits else "")
            + f"; cause {cause.value}"
        )
        incident = self._incident(
            suspect, now, cause, rule, confidence, culprits, placement, evidence, summary
        )
        incident.details.update(
            {"verdict": verdict, "pg": group, "op": op, "collective_seq_id": seq}
        )
        roots = getattr(report, "roots", ())
        # every independent root with its own kind (stuck_outside, skipped, stalled, ...), group,
        # waiters
        if roots:
            incident.details["roots"] = [root.to_dict() for root in roots]
        return incident

    def _incident(
        self,
        suspect: HangSuspect,
        now: dt.datetime,
        cause: Cause,
        rule: str,
        confidence: float,
        culprits: tuple[int, ...],
        placement: dict[int, Placement],
        evidence: list[Evidence],
        summary: str,
    ) -> Incident:
        nodes = sorted({p for p in (_node(placement, r) for r in culprits) if p})
        gpus = sorted(
            {placement[r].gpu_label for r in culprits if r in placement and placement[r].gpu_label}
        )
        return Incident(
            incident_id=suspect.incident_id,
            incident_class=IncidentClass.COLLECTIVE_HANG,
            cause=cause,
            first_signal_ts=suspect.since,
            detected_ts=now,
            confidence=round(max(0.0, min(1.0, confidence)), 3),
            rule=rule,
            summary=summary,
            job_id=suspect.job_id,
            attempt=suspect.attempt,
            culprit_nodes=tuple(nodes),
            culprit_ranks=culprits,
            culprit_gpus=tuple(gpus),
            evidence=tuple(evidence[: self.rules.evidence_limit]),
            step=suspect.last_step,
            details={"detected_by": suspect.detected_by},
        )


def _lost_node(
    missing: Sequence[int], placement: dict[int, Placement]
) -> tuple[str, tuple[int, ...]] | None:
    """(node, its ranks) when the ranks without a dump are exactly every rank of one node of
    several.
    """
    missing_set = {int(r) for r in missing}
    if not missing_set:
        return None
    nodes = {_node(placement, r) for r in missing_set}
    if len(nodes) != 1 or None in nodes:
        return None
    node = next(iter(nodes))
    ranks = tuple(sorted(r for r, p in placement.items() if p.node == node))
    if set(ranks) != missing_set or len(placement) <= len(ranks):
        return None
    return node, ranks  # type: ignore[return-value]


def _waited_on(report: object, ranks: Sequence[int]) -> bool:
    """Whether ranks that dumped wait on one of `ranks` (a root of the analysis or not: a whole node
    without a dump is a node lost, where the analysis alone could take one missing rank for a
    follow-on)."""
    waited = set(getattr(report, "waited_missing", ()) or ())
    named = {r for root in getattr(report, "roots", ()) or () if getattr(root, "waiting_ranks", ())
             for r in getattr(root, "ranks", ())}
    return bool(set(ranks) & named) or (len(ranks) > 1 and bool(set(ranks) & waited))


def _ranks_short(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks[:12]) + (
        f", ... ({len(ranks)})" if len(ranks) > 12 else ""
    )


def _node(placement: dict[int, Placement], rank: int) -> str | None:
    return placement[rank].node if rank in placement else None


def suspect_from_trigger(
    job: str | None,
    attempt: int | None,
    ts: dt.datetime,
    evidence: Sequence[Evidence],
    steps: pd.DataFrame,
) -> HangSuspect:
    """A hang suspect from collective-timeout reports (watchdog / gloo timeouts) in process_events.
    """
    last_step = None
    since = ts
    if not steps.empty:
        rows = steps[(steps["job_id"] == job)] if job is not None else steps
        if attempt is not None:
            rows = rows[rows["attempt"] == attempt]
        if not rows.empty and rows["step"].notna().any():
            done = completion_times(rows)
            last_index = done.idxmax()
            last_step = int(rows.loc[last_index, "step"])
            since = min(since, as_datetime(done.loc[last_index]) or since)
    return HangSuspect(job, attempt, since, "watchdog", last_step, None, None, tuple(evidence))
