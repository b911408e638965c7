"""Crash attribution: the primary failure of an attempt among all the ranks' error signals, and its cause.

One attempt of a job ends in one crash incident, however many lines its ranks wrote: the survivors' echoes
("Connection closed by peer", collective timeouts, SIGTERM from torchrun) are folded into it as a count. The
primary failure is the rank that failed first on its own (an exception or OOM that is not an echo, a death by
signal, else an unexplained non-zero exit), never a survivor, even when torchrun's Root Cause names one. Its cause:

1. the same traceback fingerprint on ranks of different nodes -> software;
2. the same fingerprint at the same step in an earlier attempt -> software (deterministic repeat);
3. hardware GPU events on the culprit's node near the failure (XID by catalog component, DBE, GPU lost, ...);
4. the same fingerprint in an earlier attempt at another step -> software;
5. a known signature in rules/crash.yaml (CUDA OOM, ECC error text, NCCL network error, ...);
6. otherwise: an exception -> software (low confidence); a signal or bare exit -> unknown.

An attempt whose only error signals are collective timeouts has no crash: it is handed to hang analysis.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pandas as pd

from attribution.hardware import XidCatalogLike, as_datetime, hardware_findings
from attribution.incident import Cause, Evidence, Incident, IncidentClass
from attribution.rules import CrashRules
from attribution.telemetry import Placement, Telemetry, placements

FAILURE_KINDS = {"exit", "exception", "oom", "comm_error", "watchdog_timeout", "signal"}
SIGNALS_BY_NUMBER = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
                     11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


class FailureKind(StrEnum):
    OOM = "oom"
    EXCEPTION = "exception"
    KILLED = "killed"  # died of a signal nobody in the job sent (SIGKILL, SIGSEGV, ...)
    EXITED = "exited"  # non-zero exit with no explanation
    TERMINATED = "terminated"  # stopped by the supervisor (SIGTERM, ...)
    SECONDARY = "secondary"  # echoed someone else's failure
    UNKNOWN = "unknown"


PRIMARY_KINDS = (FailureKind.OOM, FailureKind.EXCEPTION, FailureKind.KILLED)


@dataclass(frozen=True)
class RankFailure:
    """What one rank of one attempt went through, condensed from its process_events rows."""

    rank: int | None
    node: str | None
    kind: FailureKind
    ts: dt.datetime
    signal: str | None = None
    exit_code: int | None = None
    exception_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    fingerprint: str | None = None
    step: int | None = None
    rows: int = 0
    secondary_rows: int = 0
    timeout_rows: int = 0
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class HangTrigger:
    """An attempt whose error signals say a collective timed out, with no primary failure: a hang to analyse."""

    job_id: str | None
    attempt: int | None
    ts: dt.datetime
    evidence: tuple[Evidence, ...]


@dataclass
class CrashResult:
    incidents: list[Incident] = field(default_factory=list)
    hang_triggers: list[HangTrigger] = field(default_factory=list)
    pending: list[tuple[str | None, int | None]] = field(default_factory=list)  # attempts not settled yet


def _get(row: Any, key: str) -> Any:
    value = row.get(key) if isinstance(row, dict) else (row[key] if key in row.index else None)
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value


def signal_of(row: Any) -> str | None:
    """The signal that ended a process: the row's `signal`, or decoded from exit codes -N and 128+N."""
    signal = _get(row, "signal")
    if signal:
        text = str(signal).upper()
        return text if text.startswith("SIG") else f"SIG{text}"
    code = _get(row, "exit_code")
    if code is None:
        return None
    code = int(code)
    if code < 0:
        return SIGNALS_BY_NUMBER.get(-code, f"SIG{-code}")
    if 128 < code < 160 and _get(row, "kind") == "exit":
        return SIGNALS_BY_NUMBER.get(code - 128)
    return None


def _text(row: Any) -> str:
    return "\n".join(str(_get(row, key)) for key in ("message", "traceback") if _get(row, key))


def describe_process_event(row: Any) -> str:
    rank = _get(row, "rank")
    node = _get(row, "node")
    who = f"rank {int(rank)}" if rank is not None else "a process"
    if node:
        who += f" on {node}"
    kind = _get(row, "kind")
    if kind == "exit":
        signal = signal_of(row)
        what = f"exited with code {_get(row, 'exit_code')}" + (f" ({signal})" if signal else "")
    else:
        first = (_get(row, "message") or "").strip().splitlines()
        what = f"{kind}: " + (f"{_get(row, 'exception_type')}: " if _get(row, "exception_type") and not (
            first and first[0].startswith(str(_get(row, "exception_type")))) else "") + (first[0] if first else "")
    source = _get(row, "source")
    return f"{who} {what.strip()}" + (f" [{source}]" if source else "")


class CrashAttributor:
    """Finds the primary failure of each failed attempt and attributes its cause."""

    def __init__(self, rules: CrashRules, catalog: XidCatalogLike | None) -> None:
        self.rules = rules
        self.catalog = catalog
        self._secondary = [re.compile(p) for p in rules.secondary_patterns]
        self._timeout = [re.compile(p) for p in rules.timeout_patterns]

    # ------------------------------------------------------------ row level

    def is_secondary(self, row: Any) -> bool:
        if _get(row, "is_secondary") is True:
            return True
        kind = _get(row, "kind")
        if kind == "watchdog_timeout":
            return True
        if kind in {"exit", "signal"} and signal_of(row) in self.rules.termination_signals:
            return True
        text = _text(row)
        return bool(text) and any(p.search(text) for p in self._secondary)

    def is_timeout(self, row: Any) -> bool:
        if _get(row, "kind") == "watchdog_timeout":
            return True
        text = _text(row)
        return bool(text) and any(p.search(text) for p in self._timeout)

    @staticmethod
    def is_failure(row: Any) -> bool:
        kind = _get(row, "kind")
        if kind not in FAILURE_KINDS:
            return False
        if kind == "exit":
            code = _get(row, "exit_code")
            return bool(code) or signal_of(row) is not None
        return True

    # ------------------------------------------------------------ rank level

    def rank_failure(self, rows: pd.DataFrame) -> RankFailure:
        """Condense one rank's failure rows (of one attempt) into what happened to it."""
        rows = rows.sort_values("ts", kind="stable")
        secondary = [self.is_secondary(row) for _, row in rows.iterrows()]
        timeouts = sum(self.is_timeout(row) for _, row in rows.iterrows())
        primary_rows = rows[[not s for s in secondary]]
        first = rows.iloc[0]
        rank = _get(first, "rank")
        node = next((n for n in rows["node"] if n is not None and n is not pd.NA), None) \
            if "node" in rows.columns else None
        signals = [signal_of(row) for _, row in rows.iterrows()]
        kind = FailureKind.UNKNOWN
        chosen: Any = None
        ooms = primary_rows[primary_rows["kind"] == "oom"]
        exceptions = primary_rows[primary_rows["kind"].isin(["exception", "comm_error"])]
        killed = [row for (_, row), sig in zip(rows.iterrows(), signals, strict=True)
                  if sig in self.rules.primary_signals]
        terminated = any(sig in self.rules.termination_signals for sig in signals)
        echoes = [row for (_, row), sec in zip(rows.iterrows(), secondary, strict=True) if sec and _text(row)]
        if not ooms.empty:
            kind, chosen = FailureKind.OOM, ooms.iloc[0]
        elif not exceptions.empty:
            kind, chosen = FailureKind.EXCEPTION, exceptions.iloc[0]
        elif killed:
            # SIGKILL after a SIGTERM is the supervisor's; a survivor that echoed a peer's failure and was then
            # killed is a survivor
            kind = FailureKind.TERMINATED if terminated else (FailureKind.SECONDARY if echoes else FailureKind.KILLED)
            chosen = killed[0]
        elif echoes:
            kind, chosen = FailureKind.SECONDARY, echoes[0]
        elif any(secondary):
            kind, chosen = FailureKind.TERMINATED, rows[secondary].iloc[0]
        elif not primary_rows.empty:
            kind, chosen = FailureKind.EXITED, primary_rows.iloc[0]
        if chosen is None:
            chosen = first
        evidence = tuple(Evidence("process_events", as_datetime(row["ts"]), describe_process_event(row))
                         for _, row in (primary_rows if not primary_rows.empty else rows).head(3).iterrows())
        # exception details may sit on another row of the same rank (stderr vs error.json): take the richest
        details = exceptions if not exceptions.empty else (ooms if not ooms.empty else rows)
        traceback = next((t for t in details["traceback"] if isinstance(t, str) and t), None) \
            if "traceback" in details.columns else None
        fingerprint = next((f for f in details["fingerprint"] if isinstance(f, str) and f), None) \
            if "fingerprint" in details.columns else None
        step = next((int(s) for s in rows["step"] if s is not None and s is not pd.NA), None) \
            if "step" in rows.columns else None
        exit_rows = rows[rows["kind"] == "exit"]
        exit_code = _get(exit_rows.iloc[0], "exit_code") if not exit_rows.empty else None
        ts = as_datetime(chosen["ts"]) or as_datetime(first["ts"])
        if ts is None:
            raise ValueError(f"process_events: rank {rank}: a failure row without ts")
        return RankFailure(
            rank=int(rank) if rank is not None else None, node=node, kind=kind, ts=ts,
            signal=signal_of(chosen), exit_code=int(exit_code) if exit_code is not None else None,
            exception_type=_get(chosen, "exception_type"), message=_get(chosen, "message"), traceback=traceback,
            fingerprint=fingerprint if kind in (FailureKind.EXCEPTION, FailureKind.OOM) else None, step=step,
            rows=len(rows), secondary_rows=sum(secondary), timeout_rows=timeouts, evidence=evidence)

    def primary(self, failures: list[RankFailure]) -> RankFailure | None:
        """The failure that came first on its own: exceptions/OOMs and deaths by signal (the latter stamped late
        by the supervisor, so moved earlier by the notice slack), else an unexplained non-zero exit."""
        slack = dt.timedelta(seconds=self.rules.signal_notice_slack_s)
        strong = [f for f in failures if f.kind in PRIMARY_KINDS]
        if strong:
            return min(strong, key=lambda f: (f.ts - slack if f.kind == FailureKind.KILLED else f.ts,
                                              f.rank if f.rank is not None else -1))
        weak = [f for f in failures if f.kind == FailureKind.EXITED]
        if weak:
            return min(weak, key=lambda f: (f.ts, f.rank if f.rank is not None else -1))
        return None

    # ------------------------------------------------------------ attempt level

    def attempt_failures(self, events: pd.DataFrame) -> dict[tuple[str | None, int | None], list[RankFailure]]:
        """(job, attempt) -> one RankFailure per rank that has failure rows."""
        if events.empty:
            return {}
        mask = [self.is_failure(row) for _, row in events.iterrows()]
        failing = events[mask]
        result: dict[tuple[str | None, int | None], list[RankFailure]] = {}
        if failing.empty:
            return result
        keys = failing[["job_id", "attempt", "rank"]].astype(object).where(failing[["job_id", "attempt", "rank"]]
                                                                          .notna(), None)
        failing = failing.assign(_job=keys["job_id"], _attempt=keys["attempt"], _rank=keys["rank"])
        for (job, attempt), group in failing.groupby(["_job", "_attempt"], dropna=False, sort=True):
            job_key = None if job is None or job is pd.NA or (isinstance(job, float) and job != job) else str(job)
            attempt_key = None if attempt is None or attempt is pd.NA or (
                isinstance(attempt, float) and attempt != attempt) else int(attempt)
            ranks = [self.rank_failure(rank_rows) for _, rank_rows in group.groupby("_rank", dropna=False)]
            result[(job_key, attempt_key)] = ranks
        return result

    def attribute(self, telemetry: Telemetry, now: dt.datetime,
                  settled: Callable[[str | None, int | None], bool] | None = None) -> CrashResult:
        result = CrashResult()
        per_attempt = self.attempt_failures(telemetry.process_events)
        for (job, attempt), failures in per_attempt.items():
            if settled is not None and not settled(job, attempt):
                result.pending.append((job, attempt))
                continue
            outcome = self._attribute_attempt(telemetry, job, attempt, failures, per_attempt, now)
            if isinstance(outcome, Incident):
                result.incidents.append(outcome)
            elif isinstance(outcome, HangTrigger):
                result.hang_triggers.append(outcome)
        return result

    def _attribute_attempt(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                           failures: list[RankFailure],
                           per_attempt: dict[tuple[str | None, int | None], list[RankFailure]],
                           now: dt.datetime) -> Incident | HangTrigger | None:
        primary = self.primary(failures)
        placement = placements(telemetry.ranks, attempt, telemetry.steps, telemetry.process_events)
        secondary_line = self._secondary_summary(failures, primary)
        if primary is None:
            return self._no_primary(telemetry, job, attempt, failures, placement, secondary_line, now)
        node = primary.node or (placement[primary.rank].node if primary.rank in placement else None)
        own = placement.get(primary.rank) if primary.rank is not None else None
        step = primary.step if primary.step is not None else _failure_step(telemetry.steps, attempt, primary.rank)
        evidence: list[Evidence] = list(primary.evidence)
        culprit_ranks = [primary.rank] if primary.rank is not None else []
        culprit_nodes = [node] if node else []
        culprit_gpus = [own.gpu_label] if own is not None and own.gpu_label else []
        first_signal = primary.ts
        cause, rule, confidence = self._default_cause(primary)

        same = [f for f in failures if f is not primary and f.fingerprint and f.fingerprint == primary.fingerprint
                and f.kind in (FailureKind.EXCEPTION, FailureKind.OOM)]
        other_nodes = {f.node or (placement[f.rank].node if f.rank in placement else None) for f in same} - {node}
        other_nodes.discard(None)
        repeats = self._repeats(job, attempt, primary, per_attempt, telemetry.steps)
        findings = hardware_findings(telemetry.gpu_events, node, primary.ts, self.rules, self.catalog, own)
        signature = next((s for s in self.rules.signatures
                          if s.matches(primary.exception_type, primary.message, primary.traceback)), None)

        if same:
            culprit_ranks = sorted({primary.rank, *(f.rank for f in same)} - {None})
            evidence.append(Evidence("process_events", same[0].ts,
                                     f"same fingerprint {primary.fingerprint} on {len(same)} more rank(s)"
                                     + (f" on {len(other_nodes)} other node(s): {', '.join(sorted(other_nodes))}"
                                        if other_nodes else " of the same node")))
        if same and other_nodes:
            cause = Cause.OOM if signature is not None and signature.cause == Cause.OOM else Cause.SOFTWARE
            rule = "crash-software-same-fingerprint-multi-node"
            confidence = self.rules.conf(rule)
            culprit_nodes = []
            culprit_gpus = []
        elif repeats and any(r[2] for r in repeats):
            cause, rule = Cause.SOFTWARE, "crash-software-repeat-same-step"
            confidence = self.rules.conf(rule)
            culprit_nodes, culprit_gpus = [], []
        elif findings:
            best = findings[0]
            cause = best.cause
            rule = "crash-hardware-same-gpu" if best.same_gpu else "crash-hardware-same-node"
            confidence = self.rules.conf(rule) * min(1.0, best.confidence / 0.9)
            culprit_gpus = [best.gpu] if best.gpu else culprit_gpus
            first_signal = min(first_signal, best.ts)
        elif repeats:
            cause, rule = Cause.SOFTWARE, "crash-software-repeat-fingerprint"
            confidence = self.rules.conf(rule)
            culprit_nodes, culprit_gpus = [], []
        elif signature is not None:
            cause, rule, confidence = signature.cause, signature.id, signature.confidence
        for previous_attempt, previous, same_step in repeats[:3]:
            evidence.append(Evidence("process_events", previous.ts,
                                     f"same fingerprint in attempt {previous_attempt} (rank {previous.rank}"
                                     f"{', same step ' + str(step) if same_step else ''})"))
        evidence.extend(f.evidence() for f in findings[:3])
        if signature is not None and rule != signature.id:
            evidence.append(Evidence("process_events", primary.ts, f"matches signature {signature.id}: "
                                     f"{signature.description or signature.cause}"))
        if secondary_line:
            evidence.append(secondary_line)
        evidence = evidence[: self.rules.evidence_limit]
        what = {FailureKind.KILLED: f"killed by {primary.signal}", FailureKind.OOM: "ran out of memory",
                FailureKind.EXCEPTION: f"raised {primary.exception_type or 'an exception'}",
                FailureKind.EXITED: f"exited with code {primary.exit_code}"}.get(primary.kind, str(primary.kind))
        summary = (f"crash: rank {primary.rank}" + (f" on {node}" if node else "") + f" {what}"
                   + (f" at step {step}" if step is not None else "") + f"; cause {cause.value} ({rule})")
        if len(culprit_ranks) > 1:
            summary += f"; {len(culprit_ranks)} ranks failed the same way"
        return Incident(
            incident_id=Incident.make_id("crash", job, attempt), incident_class=IncidentClass.CRASH, cause=cause,
            first_signal_ts=first_signal, detected_ts=now, confidence=round(float(confidence), 3), rule=rule,
            summary=summary, job_id=job, attempt=attempt, culprit_nodes=tuple(culprit_nodes),
            culprit_ranks=tuple(int(r) for r in culprit_ranks), culprit_gpus=tuple(culprit_gpus),
            evidence=tuple(evidence), fingerprint=primary.fingerprint, step=step,
            details={"primary_kind": primary.kind.value, "failures": len(failures),
                     "secondary_rows": sum(f.secondary_rows for f in failures)})

    def _default_cause(self, primary: RankFailure) -> tuple[Cause, str, float]:
        if primary.kind == FailureKind.OOM:
            return Cause.OOM, "crash-oom", self.rules.conf("crash-oom", 0.9)
        if primary.kind == FailureKind.EXCEPTION:
            return Cause.SOFTWARE, "crash-exception", self.rules.conf("crash-exception")
        if primary.kind == FailureKind.KILLED:
            return Cause.UNKNOWN, "crash-killed-by-signal", self.rules.conf("crash-killed-by-signal")
        return Cause.UNKNOWN, "crash-nonzero-exit", self.rules.conf("crash-nonzero-exit")

    def _repeats(self, job: str | None, attempt: int | None, primary: RankFailure,
                 per_attempt: dict[tuple[str | None, int | None], list[RankFailure]],
                 steps: pd.DataFrame) -> list[tuple[int | None, RankFailure, bool]]:
        """Earlier attempts of the same job whose primary failure had the same fingerprint: (attempt, failure,
        same step)."""
        if not primary.fingerprint or attempt is None:
            return []
        step = primary.step if primary.step is not None else _failure_step(steps, attempt, primary.rank)
        found = []
        for (other_job, other_attempt), failures in per_attempt.items():
            if other_job != job or other_attempt is None or other_attempt >= attempt:
                continue
            previous = self.primary(failures)
            if previous is None or previous.fingerprint != primary.fingerprint:
                continue
            previous_step = previous.step if previous.step is not None else _failure_step(
                steps, other_attempt, previous.rank)
            found.append((other_attempt, previous, step is not None and previous_step == step))
        return sorted(found, key=lambda item: -(item[0] or 0))

    def _secondary_summary(self, failures: list[RankFailure], primary: RankFailure | None) -> Evidence | None:
        others = [f for f in failures if f is not primary]
        rows = sum(f.rows for f in others)
        if not others:
            return None
        kinds = Counter(f.kind.value for f in others)
        first = min(f.ts for f in others)
        parts = ", ".join(f"{kind} x{count}" for kind, count in kinds.most_common())
        return Evidence("process_events", first, f"{rows} more error signal(s) from {len(others)} other rank(s), "
                                                 f"folded into this incident ({parts})")

    def _no_primary(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                    failures: list[RankFailure], placement: dict[int, Placement], secondary_line: Evidence | None,
                    now: dt.datetime) -> Incident | HangTrigger | None:
        first = min(f.ts for f in failures)
        # a node whose ranks said nothing while the others echoed a failure, or whose GPU reported hardware errors
        reported = {f.rank for f in failures}
        silent = sorted(r for r in placement if r not in reported)
        nodes = sorted({p.node for p in placement.values() if p.node})
        node_findings = {node: hardware_findings(telemetry.gpu_events, node, first, self.rules, self.catalog)
                         for node in nodes}
        node_findings = {n: f for n, f in node_findings.items() if f}
        if len(node_findings) == 1:
            node, findings = next(iter(node_findings.items()))
            best = findings[0]
            ranks = sorted(r for r, p in placement.items() if p.node == node)
            rule = "crash-hardware-node-no-report"
            evidence = [best.evidence(), *(f.evidence() for f in findings[1:3])]
            if secondary_line:
                evidence.append(secondary_line)
            return Incident(
                incident_id=Incident.make_id("crash", job, attempt), incident_class=IncidentClass.CRASH,
                cause=best.cause, first_signal_ts=min(best.ts, first), detected_ts=now,
                confidence=min(self.rules.conf(rule), best.confidence), rule=rule,
                summary=f"crash: {node} reported {best.kind} and its peers lost contact; cause {best.cause.value}",
                job_id=job, attempt=attempt, culprit_nodes=(node,), culprit_ranks=tuple(ranks),
                culprit_gpus=(best.gpu,) if best.gpu else (), evidence=tuple(evidence[: self.rules.evidence_limit]))
        if all(f.kind == FailureKind.TERMINATED for f in failures):
            return None  # stopped from outside (cancelled, preempted): not a crash to attribute
        timeouts = [f for f in failures if f.timeout_rows]
        if timeouts:
            evidence = [e for f in sorted(timeouts, key=lambda f: f.ts)[:3] for e in f.evidence[:1]]
            return HangTrigger(job, attempt, min(f.ts for f in timeouts), tuple(evidence))
        silent_nodes = sorted({placement[r].node for r in silent if placement[r].node}
                              - {f.node for f in failures if f.node})
        rule = "crash-no-primary"
        evidence = [e for f in sorted(failures, key=lambda f: f.ts)[:3] for e in f.evidence[:1]]
        if silent:
            evidence.insert(0, Evidence("process_events", first, f"ranks {silent} reported no failure while "
                                                                 f"{len(failures)} others echoed one"))
        return Incident(
            incident_id=Incident.make_id("crash", job, attempt), incident_class=IncidentClass.CRASH,
            cause=Cause.UNKNOWN, first_signal_ts=first, detected_ts=now, confidence=self.rules.conf(rule),
            rule=rule, summary="crash: every failing rank echoed another's failure; the primary one was not seen"
            + (f" (silent ranks {silent} on {', '.join(silent_nodes) or 'unknown nodes'})" if silent else ""),
            job_id=job, attempt=attempt, culprit_nodes=tuple(silent_nodes) if len(silent_nodes) == 1 else (),
            culprit_ranks=tuple(silent) if silent_nodes and len(silent_nodes) == 1 else (),
            evidence=tuple(evidence[: self.rules.evidence_limit]))


def _failure_step(steps: pd.DataFrame, attempt: int | None, rank: int | None) -> int | None:
    """The step a rank was in when it failed: one past its last completed step of that attempt."""
    if steps.empty or rank is None or "step" not in steps.columns:
        return None
    rows = steps[steps["rank"] == rank]
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    if rows.empty or rows["step"].dropna().empty:
        return None
    return int(rows["step"].max()) + 1
