"""Crash attribution: the primary failure of an attempt among all the ranks' error signals, and its cause.

One attempt of a job ends in one crash incident, however many lines its ranks wrote: the survivors' echoes
("Connection closed by peer", collective timeouts, SIGTERM from torchrun) are folded into it as a count. The
primary failure is the rank that failed first on its own (an exception or OOM that is not an echo, a death by
signal, else an unexplained non-zero exit), never a survivor, even when torchrun's Root Cause names one. Its cause:

1. the same traceback fingerprint on ranks of different nodes -> software;
2. the same fingerprint at the same step in an earlier attempt -> software (deterministic repeat);
3. hardware GPU events on the culprit's node near the failure (XID by catalog component, DBE, GPU lost, ...);
4. the same fingerprint in an earlier attempt at another step -> software (not for a known network/hardware
   error text: those fail in the same call wherever a link dies);
5. a known signature in rules/crash.yaml (CUDA OOM, ECC error text, NCCL network error, ...);
6. otherwise: an exception -> software (low confidence); a signal or bare exit -> unknown.

An attempt whose only error signals are collective timeouts has no crash: it is handed to hang analysis. An
attempt whose first failure says a peer's message did not match its collective (rules/crash.yaml
`mismatch_patterns`) is no crash of that rank either: the job desynchronised (attribution/desync.py).

Lifecycle: what the supervisor did is never a failure. Its `signal_sent` process_events rows mark the start of
an attempt's teardown; every failure row from then on (and every death by a signal it sent) is a termination, as
are the texts of rules/crash.yaml `termination_patterns` (torchrun's SignalException when its agent is stopped).
An attempt whose failures are all terminations has no crash. Node loss: a node whose torchrun agent died by a
signal the supervisor did not send (its `agent_exit` row) and whose ranks have no failure of their own is a host
crash of that node (its ranks alive after it: the agent alone was lost); with no agent report, every rank of one
node silent while the others echoed the loss is one too. A death by signal has an identity, `<signal>@rank<r>`, in
the fingerprint column, so the same signal killing the same global rank again on another node is a repeat
(software). The step of a death is the last completed step + 1 (the heartbeat's, else the step rows').
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import pandas as pd

from faultlens.attribution.desync import desync_incident, mismatch_report
from faultlens.attribution.hardware import XidCatalogLike, as_datetime, hardware_findings
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.rules import CrashRules, any_of
from faultlens.attribution.telemetry import Placement, Telemetry, placements

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
    first_timeout: dt.datetime | None = None  # when this rank first reported a collective timeout
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class HangTrigger:
    """An attempt whose error signals say a collective timed out, with no primary failure: a hang to analyse."""

    job_id: str | None
    attempt: int | None
    ts: dt.datetime
    evidence: tuple[Evidence, ...]


WAIT = object()  # an attempt whose attribution waits for a report still to come


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
    return _signal_from_code(_get(row, "exit_code"), _get(row, "kind"))


def _matches(text: pd.Series, pattern: re.Pattern[str] | None) -> pd.Series:
    if pattern is None:
        return pd.Series(False, index=text.index)
    return text.map(lambda value: bool(value) and pattern.search(value) is not None).astype(bool)


def _signal_from_code(code: Any, kind: Any) -> str | None:
    if code is None or code != code:
        return None
    code = int(code)
    if code < 0:
        return SIGNALS_BY_NUMBER.get(-code, f"SIG{-code}")
    if 128 < code < 160 and kind == "exit":
        return SIGNALS_BY_NUMBER.get(code - 128)
    return None


TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGKILL"})


def signal_identity(signal: Any, rank: Any) -> str | None:
    """The identity of a death by signal (it has no traceback fingerprint): `<signal>@rank<global rank>`."""
    if not signal or rank is None or rank is pd.NA:
        return None
    return f"{signal}@rank{int(rank)}"


def _attempt_keys(frame: pd.DataFrame) -> pd.Series:
    job = frame["job_id"].astype(object).where(frame["job_id"].notna(), "") if "job_id" in frame.columns else ""
    attempt = frame["attempt"].astype(object).where(frame["attempt"].notna(), -1) \
        if "attempt" in frame.columns else -1
    return pd.Series(list(zip(pd.Series(job, index=frame.index), pd.Series(attempt, index=frame.index),
                              strict=True)), index=frame.index, dtype=object)


def teardown_starts(events: pd.DataFrame) -> dict[tuple[Any, Any], pd.Timestamp]:
    """(job or "", attempt or -1) -> when the supervisor began stopping that attempt (its first signal_sent row
    with a stopping signal)."""
    if events.empty or "kind" not in events.columns:
        return {}
    sent = events[events["kind"] == "signal_sent"]
    if sent.empty:
        return {}
    if "signal" in sent.columns:
        names = sent["signal"].astype(object).map(lambda v: None if v is None or v is pd.NA or v != v else (
            str(v).upper() if str(v).upper().startswith("SIG") else f"SIG{str(v).upper()}"))
        sent = sent[names.isin(TEARDOWN_SIGNALS) | names.isna()]
    if sent.empty:
        return {}
    return sent.groupby(_attempt_keys(sent))["ts"].min().to_dict()


def _in_teardown(events: pd.DataFrame, signal: pd.Series) -> pd.Series:
    """Rows at or after the start of their attempt's teardown by the supervisor."""
    starts = teardown_starts(events)
    if not starts:
        return pd.Series(False, index=events.index)
    keys = _attempt_keys(events)
    start = keys.map(lambda key: starts.get(key))
    mask = start.notna() & (events["ts"] >= start.where(start.notna(), events["ts"]))
    return mask.astype(bool) & (events["kind"] != "signal_sent")


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
        self._secondary_re = any_of(rules.secondary_patterns)
        self._timeout_re = any_of(rules.timeout_patterns)
        self._termination_re = any_of(rules.termination_patterns)
        self._mismatch_re = any_of(rules.mismatch_patterns)

    # ------------------------------------------------------------ row level (vectorised)

    def classify(self, events: pd.DataFrame) -> pd.DataFrame:
        """The failure rows of `events`, with columns _signal, _secondary, _timeout, _text added."""
        if events.empty:
            return events.assign(_signal=pd.Series(dtype=object), _secondary=pd.Series(dtype=bool),
                                 _timeout=pd.Series(dtype=bool), _text=pd.Series(dtype=object),
                                 _terminated=pd.Series(dtype=bool))
        def column(name: str) -> pd.Series:
            if name in events.columns:
                values = events[name].astype(object)
                return values.where(values.notna(), None)
            return pd.Series(None, index=events.index, dtype=object)

        kind = column("kind")
        exit_code = pd.to_numeric(column("exit_code"), errors="coerce")
        named = column("signal").map(lambda s: None if s is None or pd.isna(s) or not str(s) else (
            str(s).upper() if str(s).upper().startswith("SIG") else f"SIG{str(s).upper()}"))
        from_code = pd.Series(
            [_signal_from_code(c, k) for c, k in zip(exit_code.to_numpy(), kind.to_numpy(), strict=True)],
            index=events.index, dtype=object)
        signal = named.where(named.notna(), from_code)
        text = (column("message").fillna("") + "\n" + column("traceback").fillna("")).str.strip()
        flagged = column("is_secondary").fillna(False).astype(bool)
        echo = _matches(text, self._secondary_re)
        terminated = (_matches(text, self._termination_re)
                      | (kind.isin(["exit", "signal"]) & signal.isin(self.rules.termination_signals))
                      | _in_teardown(events, signal))
        secondary = flagged | (kind == "watchdog_timeout") | echo | terminated
        timeout = (kind == "watchdog_timeout") | _matches(text, self._timeout_re)
        failure = kind.isin(FAILURE_KINDS) & ((kind != "exit") | (exit_code.fillna(0) != 0) | signal.notna())
        frame = events.assign(_signal=signal, _secondary=secondary.astype(bool), _timeout=timeout.astype(bool),
                              _text=text, _terminated=terminated.astype(bool))
        return frame[failure.to_numpy(dtype=bool)]

    def is_secondary(self, row: Any) -> bool:
        return bool(self.classify(pd.DataFrame([dict(row)]))["_secondary"].any())

    # ------------------------------------------------------------ rank level

    def rank_failures(self, rows: pd.DataFrame) -> list[RankFailure]:
        """One RankFailure per rank of one attempt's classified failure rows (see classify)."""
        rows = rows.sort_values("ts", kind="stable")
        rank_key = rows["rank"].astype(object).where(rows["rank"].notna(), -1)
        kind = rows["kind"].astype(object)
        primary_row = ~rows["_secondary"]
        marks = pd.DataFrame({
            "rank": rank_key,
            "oom": (kind == "oom") & primary_row,
            "exception": kind.isin(["exception", "comm_error"]) & primary_row,
            "killed": rows["_signal"].isin(self.rules.primary_signals),
            "terminated": rows["_terminated"],
            "echo": rows["_secondary"] & (rows["_text"] != "") & ~rows["_terminated"],
            "secondary": rows["_secondary"],
            "primary": primary_row,
            "timeout": rows["_timeout"],
        }, index=rows.index)
        per_rank = marks.groupby("rank", sort=True)
        anys = per_rank[["oom", "exception", "killed", "terminated", "echo", "secondary", "primary"]].any()
        counts = per_rank.agg(rows_=("secondary", "size"), secondary_=("secondary", "sum"),
                              timeout_=("timeout", "sum"))
        failures = []
        for rank, flags in anys.iterrows():
            if flags["oom"]:
                kind_of, column = FailureKind.OOM, "oom"
            elif flags["exception"]:
                kind_of, column = FailureKind.EXCEPTION, "exception"
            elif flags["killed"]:
                # SIGKILL after a SIGTERM is the supervisor's; a survivor that echoed a peer's failure and was
                # then killed is a survivor
                kind_of = FailureKind.TERMINATED if flags["terminated"] else (
                    FailureKind.SECONDARY if flags["echo"] else FailureKind.KILLED)
                column = "killed"
            elif flags["terminated"] and not flags["echo"]:
                kind_of, column = FailureKind.TERMINATED, "terminated"
            elif flags["echo"]:
                kind_of, column = FailureKind.SECONDARY, "echo"
            elif flags["secondary"]:
                kind_of, column = FailureKind.TERMINATED, "secondary"
            else:
                kind_of, column = FailureKind.EXITED, "primary"
            mine = marks["rank"] == rank
            chosen_index = marks.index[mine & marks[column]][0]
            failures.append(self._rank_failure(rows, mine, chosen_index, kind_of, counts.loc[rank]))
        return failures

    def _rank_failure(self, rows: pd.DataFrame, mine: pd.Series, chosen_index: Any, kind: FailureKind,
                      counts: pd.Series) -> RankFailure:
        own = rows[mine]
        chosen = rows.loc[chosen_index]
        rank = _get(chosen, "rank")
        node = next((n for n in own["node"] if isinstance(n, str) and n), None) if "node" in own.columns else None
        details = own[own["kind"].isin(["exception", "comm_error", "oom"]) & ~own["_secondary"]]
        if details.empty:
            details = own

        def first(column: str) -> Any:
            if column not in details.columns:
                return None
            return next((v for v in details[column] if isinstance(v, str) and v), None)

        step_values = own["step"].dropna() if "step" in own.columns else pd.Series(dtype=float)
        exits = own[own["kind"] == "exit"]
        exit_code = _get(exits.iloc[0], "exit_code") if not exits.empty else None
        ts = as_datetime(chosen["ts"])
        if ts is None:
            raise ValueError(f"process_events: rank {rank}: a failure row without ts")
        shown = own[~own["_secondary"]] if kind in (*PRIMARY_KINDS, FailureKind.EXITED) else own
        timeouts = own.loc[own["_timeout"], "ts"]
        return RankFailure(
            rank=int(rank) if rank is not None else None, node=node, kind=kind, ts=ts, signal=_get(chosen, "_signal"),
            exit_code=int(exit_code) if exit_code is not None else None,
            exception_type=first("exception_type"), message=first("message"), traceback=first("traceback"),
            fingerprint=first("fingerprint") if kind in (FailureKind.EXCEPTION, FailureKind.OOM) else (
                signal_identity(_get(chosen, "_signal"), rank) if kind == FailureKind.KILLED else None),
            step=int(step_values.iloc[0]) if not step_values.empty else None,
            rows=int(counts["rows_"]), secondary_rows=int(counts["secondary_"]), timeout_rows=int(counts["timeout_"]),
            first_timeout=as_datetime(timeouts.min()) if not timeouts.empty else None,
            evidence=tuple(Evidence("process_events", as_datetime(row["ts"]), describe_process_event(row))
                           for _, row in shown.head(3).iterrows()))

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
        failing = self.classify(events)
        result: dict[tuple[str | None, int | None], list[RankFailure]] = {}
        if failing.empty:
            return result
        job_key = failing["job_id"].astype(object).where(failing["job_id"].notna(), "")
        attempt_key = failing["attempt"].astype(object).where(failing["attempt"].notna(), -1)
        for (job, attempt), group in failing.groupby([job_key, attempt_key], sort=True):
            result[(job or None, None if attempt == -1 else int(attempt))] = self.rank_failures(group)
        return result

    def attribute(self, telemetry: Telemetry, now: dt.datetime,
                  settled: Callable[[str | None, int | None], bool] | None = None) -> CrashResult:
        result = CrashResult()
        per_attempt = self.attempt_failures(telemetry.process_events)
        for key in lost_agents(telemetry.process_events):  # an agent lost while its ranks train on: no failure rows
            per_attempt.setdefault(key, [])
        for (job, attempt), failures in sorted(per_attempt.items(), key=lambda item: (item[0][0] or "",
                                                                                      item[0][1] or -1)):
            if settled is not None and not settled(job, attempt):
                result.pending.append((job, attempt))
                continue
            outcome = self._attribute_attempt(telemetry, job, attempt, failures, per_attempt, now)
            if outcome is WAIT:
                result.pending.append((job, attempt))
            elif isinstance(outcome, Incident):
                result.incidents.append(outcome)
            elif isinstance(outcome, HangTrigger):
                result.hang_triggers.append(outcome)
        return result

    def _attribute_attempt(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                           failures: list[RankFailure],
                           per_attempt: dict[tuple[str | None, int | None], list[RankFailure]],
                           now: dt.datetime) -> Incident | HangTrigger | object | None:
        primary = self.primary(failures)
        placement = placements(telemetry.ranks, attempt, telemetry.process_events, telemetry.steps,
                               telemetry.heartbeats)
        secondary_line = self._secondary_summary(failures, primary)
        lost = self._node_lost(telemetry, job, attempt, failures, placement, secondary_line, now)
        if lost is not None:
            return lost
        if not failures:
            return None
        if self._training_ended(telemetry, job, attempt, failures, placement):
            return None
        if primary is None:
            primary = self._stopped_from_outside(telemetry.process_events, job, attempt, failures)
        if primary is None:
            return self._no_primary(telemetry, job, attempt, failures, placement, secondary_line, now)
        hang = self._hang_before(job, attempt, primary, failures)
        if hang is not None:
            return hang
        report = mismatch_report(primary, failures, self._mismatch_re, self.rules.signal_notice_slack_s)
        if report is not None:  # the first to fail got a peer's message for another collective: a desync
            desync = desync_incident(self.rules, telemetry, job, attempt, primary, report, placement, secondary_line,
                                     now)
            reported = max(report.ts, primary.ts)
            if not desync.culprit_ranks and now < reported + dt.timedelta(seconds=self.rules.desync_wait_s):
                return WAIT  # the ranks' last heartbeats may still be on their way
            return desync
        # the ranks table (the collectors' node names, which GPU events carry too) over a report's host name
        node = (placement[primary.rank].node if primary.rank in placement else None) or primary.node
        own = placement.get(primary.rank) if primary.rank is not None else None
        step = death_step(telemetry, attempt, primary.rank)
        step = step if step is not None else primary.step
        evidence: list[Evidence] = list(primary.evidence)
        culprit_ranks = [primary.rank] if primary.rank is not None else []
        culprit_nodes = [node] if node else []
        culprit_gpus = [own.gpu_label] if own is not None and own.gpu_label else []
        first_signal = primary.ts
        cause, rule, confidence = self._default_cause(primary)

        same = [f for f in failures if f is not primary and f.fingerprint and f.fingerprint == primary.fingerprint
                and f.kind in (FailureKind.EXCEPTION, FailureKind.OOM)]
        other_nodes = {(placement[f.rank].node if f.rank in placement else None) or f.node for f in same} - {node}
        other_nodes.discard(None)
        if primary.kind in (FailureKind.EXCEPTION, FailureKind.OOM) and self._others_to_come(
                telemetry, job, attempt, failures, placement, primary, now,
                besides=None if other_nodes else node,
                within_s=self.rules.silent_node_wait_s if other_nodes else self.rules.exception_peer_wait_s):
            # an exception's verdict waits a moment for the other nodes' first reports (the same exception there
            # makes it the code's), and once it is the code's, for every rank's (the ranks that ran it)
            return WAIT
        repeats = self._repeats(job, attempt, primary, per_attempt, telemetry, node)
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
            if not (best.same_gpu and culprit_gpus):
                culprit_gpus = [best.gpu] if best.gpu else culprit_gpus
            first_signal = min(first_signal, best.ts)
        elif repeats and not (signature is not None and signature.cause.is_hardware):
            # the same code position failing again at another step is a bug, unless the failure is a known
            # network/hardware error: those fail in the same collective call wherever and whenever a link dies
            cause = Cause.SOFTWARE
            rule = "crash-software-repeat-signal" if primary.kind == FailureKind.KILLED else \
                "crash-software-repeat-fingerprint"
            confidence = self.rules.conf(rule)
            culprit_nodes, culprit_gpus = [], []
        elif signature is not None:
            cause, rule, confidence = signature.cause, signature.id, signature.confidence
        if cause == Cause.OOM:  # the job asked for more memory than it has: the workload's, no node to blame
            culprit_nodes, culprit_gpus = [], []
        for previous_attempt, previous, same_step in repeats[:3]:
            what = f"same death ({primary.fingerprint})" if primary.kind == FailureKind.KILLED else \
                "same fingerprint"
            evidence.append(Evidence("process_events", previous.ts,
                                     f"{what} in attempt {previous_attempt} (rank {previous.rank}"
                                     + (f" on {previous.node}" if previous.node else "")
                                     + f"{', same step ' + str(step) if same_step else ''})"))
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

    def _others_to_come(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                        failures: list[RankFailure], placement: dict[int, Placement], primary: RankFailure,
                        now: dt.datetime, besides: str | None = None, within_s: float = 0.0) -> bool:
        """Ranks (of nodes other than `besides`) that reported nothing yet while their torchrun agent still runs,
        within `within_s` of the primary failure: their reports may still come (a loaded collector reads their
        error files later)."""
        if now >= primary.ts + dt.timedelta(seconds=within_s):
            return False
        reported = {f.rank for f in failures}
        running = running_agents(telemetry.process_events, job, attempt)
        return any(p.node in running and p.node != besides and rank not in reported
                   for rank, p in placement.items())

    def _hang_before(self, job: str | None, attempt: int | None, primary: RankFailure,
                     failures: list[RankFailure]) -> HangTrigger | None:
        """Collective timeouts reported before the first failure: the job hung first, and the failure came out
        of the hang (a stuck rank giving up, a supervisor's kill). A dead rank makes its peers time out only
        after their timeout, so a crash never looks like this."""
        effective = primary.ts - dt.timedelta(seconds=self.rules.signal_notice_slack_s) \
            if primary.kind == FailureKind.KILLED else primary.ts
        timeouts = sorted((f for f in failures if f.first_timeout is not None), key=lambda f: f.first_timeout)
        if not timeouts or timeouts[0].first_timeout >= effective:  # type: ignore[operator]
            return None
        evidence = [e for f in timeouts[:3] for e in f.evidence[:1]]
        evidence.append(Evidence("process_events", primary.ts, "after the timeouts: " + (
            primary.evidence[0].text if primary.evidence else f"rank {primary.rank} failed")))
        return HangTrigger(job, attempt, timeouts[0].first_timeout, tuple(evidence))  # type: ignore[arg-type]

    def _training_ended(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                        failures: list[RankFailure], placement: dict[int, Placement]) -> bool:
        """Every rank of the attempt closed its step timer (its training loop was over) before the first error
        signal, and no rank failed on its own: what failed is the end of the job tearing down (a torchrun agent
        losing the rendezvous store in its exit barrier as the host's agent exits, a survivor's echo in
        destroy_process_group), never a crash."""
        if any(f.rank is not None and f.kind in (*PRIMARY_KINDS, FailureKind.EXITED) for f in failures):
            return False
        ranks = sorted(placement)
        closed = closed_ranks(telemetry.heartbeats, attempt)
        if not ranks or not set(ranks) <= set(closed):
            return False
        return max(closed[r] for r in ranks) <= min(f.ts for f in failures)

    def _stopped_from_outside(self, events: pd.DataFrame, job: str | None, attempt: int | None,
                              failures: list[RankFailure]) -> RankFailure | None:
        """One rank ended by a termination signal (SIGTERM, SIGINT, SIGHUP) that nobody watching sent: torchrun
        names it the first failure on its node, it came before the supervisor's own teardown, and the ranks of the
        other nodes only echoed it. Something on that node stopped the rank (a node daemon, an operator, a
        drain): a death by that signal, as SIGKILL is. Several ranks stopped so (a job-wide cancel or preemption)
        stay a stop from outside, not a crash."""
        if events.empty or "reported_root_cause" not in events.columns:
            return None
        keys = _attempt_keys(events)
        key = (job or "", attempt if attempt is not None else -1)
        rows = events[(keys == key).to_numpy(dtype=bool)]
        roots = rows[(rows["kind"] == "exit") & rows["reported_root_cause"].astype(object).eq(True)]
        if roots.empty:
            return None
        roots = self.classify(roots)
        start = teardown_starts(rows).get(key)
        if start is not None:
            roots = roots[roots["ts"] < start]
        stops = roots[roots["_signal"].isin(self.rules.termination_signals)]
        if len(stops) != 1 or stops["rank"].isna().any():
            return None
        rank = int(stops["rank"].iloc[0])
        stopped = next((f for f in failures if f.rank == rank and f.kind == FailureKind.TERMINATED), None)
        if stopped is None:
            return None
        # the ranks of other nodes echoed it (lost contact), none of them was stopped too; a single-node job
        # stopped so may as well be the whole job stopped: no verdict from that
        elsewhere = [f for f in failures if f.node != stopped.node]
        if not elsewhere or any(f.kind != FailureKind.SECONDARY for f in elsewhere):
            return None
        signal = str(stops["_signal"].iloc[0])
        return replace(stopped, kind=FailureKind.KILLED, signal=signal, fingerprint=signal_identity(signal, rank))

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
                 telemetry: Telemetry, node: str | None) -> list[tuple[int | None, RankFailure, bool]]:
        """Earlier attempts of the same job whose primary failure had the same fingerprint: (attempt, failure,
        same step). A death by signal (its fingerprint: signal and global rank) counts only from another node: on
        the same node it may be the node."""
        if not primary.fingerprint or attempt is None:
            return []
        step = death_step(telemetry, attempt, primary.rank)
        step = step if step is not None else primary.step
        found = []
        for (other_job, other_attempt), failures in per_attempt.items():
            if other_job != job or other_attempt is None or other_attempt >= attempt or not failures:
                continue
            previous = self.primary(failures)
            if previous is None or previous.fingerprint != primary.fingerprint:
                continue
            if primary.kind == FailureKind.KILLED:
                before = placements(telemetry.ranks, other_attempt, telemetry.process_events, telemetry.steps,
                                    telemetry.heartbeats)
                previous_node = (before[previous.rank].node if previous.rank in before else None) or previous.node
                if previous_node is None or previous_node == node:
                    continue
            previous_step = death_step(telemetry, other_attempt, previous.rank)
            previous_step = previous_step if previous_step is not None else previous.step
            found.append((other_attempt, previous, step is not None and previous_step == step))
        return sorted(found, key=lambda item: -(item[0] or 0))

    def _node_lost(self, telemetry: Telemetry, job: str | None, attempt: int | None, failures: list[RankFailure],
                   placement: dict[int, Placement], secondary_line: Evidence | None,
                   now: dt.datetime) -> Incident | None:
        """A node whose torchrun agent died by a signal nobody in the job sent: the host (its ranks died with it,
        or train on unwatched)."""
        lost = lost_agents(telemetry.process_events).get((job or "", attempt if attempt is not None else -1), [])
        nodes = sorted({node for node, _, _, _ in lost})
        if len(nodes) != 1:
            return None
        node = nodes[0]
        ts, signal, text = min((ts, signal, text) for n, ts, signal, text in lost if n == node)
        ranks = sorted(r for r, p in placement.items() if p.node == node)
        own = [f for f in failures if f.rank is not None and (
            (placement[f.rank].node if f.rank in placement else None) or f.node) == node]
        if any(f.kind in (FailureKind.EXCEPTION, FailureKind.OOM) and f.ts <= ts for f in own):
            return None  # a rank's own failure came first: the normal path explains it
        alive = _alive_after(telemetry.heartbeats, attempt, ranks, ts + dt.timedelta(seconds=1))
        rule = "crash-agent-lost" if alive else "crash-node-lost"
        evidence = [Evidence("process_events", ts, text)]
        if alive:
            evidence.append(Evidence("heartbeats", None, f"ranks {alive} of {node} kept running after their agent "
                                                         "died: unwatched"))
        else:
            silent = [r for r in ranks if r not in {f.rank for f in own}]
            evidence.append(Evidence("process_events", ts, f"{node}'s ranks {ranks} died with it"
                                     + (f" ({len(silent)} reported nothing)" if silent else "")))
        if secondary_line:
            evidence.append(secondary_line)
        gpus = sorted({placement[r].gpu_label for r in ranks if placement[r].gpu_label})
        step = next((s for s in (death_step(telemetry, attempt, r) for r in ranks) if s is not None), None)
        first = min([ts, *(f.ts for f in failures)])
        what = "its torchrun agent was lost (" + signal + ")" + (", its ranks run on unwatched" if alive else
                                                                  ", its ranks with it")
        return Incident(
            incident_id=Incident.make_id("crash", job, attempt), incident_class=IncidentClass.CRASH,
            cause=Cause.HOST, first_signal_ts=first, detected_ts=now, confidence=self.rules.conf(rule, 0.85),
            rule=rule, summary=f"crash: node loss: {node}: {what}; cause host", job_id=job, attempt=attempt,
            culprit_nodes=(node,), culprit_ranks=tuple(ranks), culprit_gpus=tuple(gpus),
            evidence=tuple(evidence[: self.rules.evidence_limit]), step=step,
            details={"primary_kind": "node_lost", "failures": len(failures), "alive": alive})

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

    def _silent_node(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                     failures: list[RankFailure], placement: dict[int, Placement], silent: list[int],
                     silent_nodes: list[str], first: dt.datetime, secondary_line: Evidence | None,
                     now: dt.datetime) -> Incident | None:
        """Every rank of one node said nothing while ranks of other nodes echoed a lost peer, and that node made
        no progress after the failure began: the node was lost (no agent report needed)."""
        if len(silent_nodes) != 1 or not any(f.kind == FailureKind.SECONDARY for f in failures):
            return None
        node = silent_nodes[0]
        ranks = sorted(r for r, p in placement.items() if p.node == node)
        if not ranks or not set(ranks) <= set(silent):
            return None
        if node in ended_agents(telemetry.process_events, job, attempt):
            return None  # its torchrun agent exited 0: the node ended its part, it was not lost
        progressed = last_progress(telemetry, attempt, ranks)
        if progressed is not None and progressed > first:
            return None  # it was still training after the others failed: not lost
        if _alive_after(telemetry.heartbeats, attempt, ranks, first + dt.timedelta(seconds=2)):
            return None
        rule = "crash-node-silent"
        evidence = [Evidence("process_events", first, f"every rank of {node} ({ranks}) fell silent while "
                                                      f"{len(failures)} rank(s) of other nodes lost contact")]
        evidence.extend(e for f in sorted(failures, key=lambda f: f.ts)[:2] for e in f.evidence[:1])
        if secondary_line:
            evidence.append(secondary_line)
        gpus = sorted({placement[r].gpu_label for r in ranks if placement[r].gpu_label})
        return Incident(
            incident_id=Incident.make_id("crash", job, attempt), incident_class=IncidentClass.CRASH,
            cause=Cause.HOST, first_signal_ts=min(first, progressed or first), detected_ts=now,
            confidence=self.rules.conf(rule, 0.75), rule=rule,
            summary=f"crash: node loss: every rank of {node} fell silent while its peers lost contact; cause host",
            job_id=job, attempt=attempt, culprit_nodes=(node,), culprit_ranks=tuple(ranks), culprit_gpus=tuple(gpus),
            evidence=tuple(evidence[: self.rules.evidence_limit]),
            step=next((s for s in (death_step(telemetry, attempt, r) for r in ranks) if s is not None), None),
            details={"primary_kind": "node_silent", "failures": len(failures),
                     "failures_from": first.isoformat()})

    def _no_primary(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                    failures: list[RankFailure], placement: dict[int, Placement], secondary_line: Evidence | None,
                    now: dt.datetime) -> Incident | HangTrigger | object | None:
        first = min(f.ts for f in failures)
        # a node whose ranks said nothing while the others echoed a failure, or whose GPU reported hardware errors
        reported = {f.rank for f in failures}
        # a rank that closed its step timer ended its training loop itself: it is not silent (a lost node's
        # processes never close anything)
        closed = closed_ranks(telemetry.heartbeats, attempt)
        silent = sorted(r for r in placement if r not in reported and r not in closed)
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
        running = running_agents(telemetry.process_events, job, attempt)
        # a silent rank whose agent still runs: that agent's report of what happened to it is still to come (its
        # node-mates' own error files and teed lines land first, so the node is not silent as a whole)
        unreported = {placement[r].node for r in silent if placement[r].node} & running
        if (unreported or (silent_nodes and set(silent_nodes) <= running)) and \
                (now - first).total_seconds() < self.rules.silent_node_wait_s:
            return WAIT
        silent_node = self._silent_node(telemetry, job, attempt, failures, placement, silent, silent_nodes, first,
                                        secondary_line, now)
        if silent_node is not None:
            return silent_node
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


def lost_agents(events: pd.DataFrame) -> dict[tuple[Any, Any], list[tuple[str, dt.datetime, str, str]]]:
    """(job or "", attempt or -1) -> [(node, ts, signal, text)] of torchrun agents that died by a signal before the
    supervisor began stopping the attempt (the supervisor's agent_exit rows)."""
    if events.empty or "kind" not in events.columns:
        return {}
    exits = events[events["kind"] == "agent_exit"]
    if exits.empty:
        return {}
    starts = teardown_starts(events)
    found: dict[tuple[Any, Any], list[tuple[str, dt.datetime, str, str]]] = {}
    keys = _attempt_keys(exits)
    for index, row in exits.iterrows():
        signal = signal_of(row)
        node = _get(row, "node")
        ts = as_datetime(row["ts"])
        if signal is None or node is None or ts is None:
            continue
        key = keys.loc[index]
        start = starts.get(key)
        if start is not None and row["ts"] >= start:
            continue  # the supervisor was stopping it
        message = _get(row, "message")
        text = f"{node}: torchrun agent died by {signal}" + (f": {message}" if message else "") + " [supervisor]"
        found.setdefault(key, []).append((str(node), ts, signal, text))
    return found


def closed_ranks(heartbeats: pd.DataFrame, attempt: int | None) -> dict[int, dt.datetime]:
    """rank -> when its step timer closed (its first heartbeat that says so) in `attempt`: the rank ended its
    training loop itself (after the last step, or unwinding from an error of its own)."""
    if heartbeats.empty or "closed" not in heartbeats.columns or "rank" not in heartbeats.columns:
        return {}
    rows = heartbeats[heartbeats["closed"].fillna(False).astype(bool) & heartbeats["rank"].notna()]
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    if rows.empty:
        return {}
    first = rows.groupby("rank")["ts"].min()
    return {int(rank): ts for rank, ts in ((r, as_datetime(t)) for r, t in first.items()) if ts is not None}


def running_agents(events: pd.DataFrame, job: str | None, attempt: int | None) -> set[str]:
    """Nodes whose torchrun agent the supervisor started in this attempt and has not seen exit."""
    if events.empty or "kind" not in events.columns:
        return set()
    rows = events[events["kind"].isin(["start", "agent_exit"]) & (events.get("source") == "supervisor")] \
        if "source" in events.columns else events[events["kind"].isin(["start", "agent_exit"])]
    if job is not None and "job_id" in rows.columns:
        rows = rows[rows["job_id"] == job]
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    started = {str(n) for n in rows.loc[rows["kind"] == "start", "node"].dropna()}
    exited = {str(n) for n in rows.loc[rows["kind"] == "agent_exit", "node"].dropna()}
    return started - exited


def ended_agents(events: pd.DataFrame, job: str | None, attempt: int | None) -> set[str]:
    """Nodes whose torchrun agent exited 0 in this attempt (the supervisor's agent_exit rows): they ended their
    part of the job."""
    if events.empty or "kind" not in events.columns:
        return set()
    exits = events[events["kind"] == "agent_exit"]
    if job is not None and "job_id" in exits.columns:
        exits = exits[exits["job_id"] == job]
    if attempt is not None and "attempt" in exits.columns:
        exits = exits[exits["attempt"] == attempt]
    if exits.empty or "exit_code" not in exits.columns:
        return set()
    codes = pd.to_numeric(exits["exit_code"], errors="coerce")
    return {str(n) for n in exits.loc[codes == 0, "node"].dropna()}


def _alive_after(heartbeats: pd.DataFrame, attempt: int | None, ranks: list[int], after: dt.datetime) -> list[int]:
    """Ranks whose heartbeat shows them running (not closed) after `after`."""
    if heartbeats.empty or not ranks:
        return []
    rows = heartbeats[heartbeats["rank"].isin(ranks) & (heartbeats["ts"] > after)]
    if attempt is not None:
        rows = rows[rows["attempt"] == attempt]
    if "closed" in rows.columns:
        rows = rows[~rows["closed"].fillna(False).astype(bool)]
    return sorted(int(r) for r in rows["rank"].dropna().unique())


def last_progress(telemetry: Telemetry, attempt: int | None, ranks: list[int]) -> dt.datetime | None:
    """When any of `ranks` last completed a step in `attempt` (heartbeats and step rows)."""
    times = []
    for frame, column in ((telemetry.heartbeats, "step_ts"), (telemetry.steps, "end_ts")):
        if frame.empty or column not in frame.columns:
            continue
        rows = frame[frame["rank"].isin(ranks)]
        if attempt is not None:
            rows = rows[rows["attempt"] == attempt]
        value = rows[column].max() if not rows.empty else None
        if value is not None and value is not pd.NaT and value == value:
            times.append(as_datetime(value))
    times = [t for t in times if t is not None]
    return max(times) if times else None


def death_step(telemetry: Telemetry, attempt: int | None, rank: int | None) -> int | None:
    """The step a rank was in when it failed: the heartbeat's step in progress, else one past its last completed
    step (heartbeat or step rows) of that attempt."""
    if rank is None:
        return None
    candidates = []
    beats = telemetry.heartbeats
    if not beats.empty:
        rows = beats[beats["rank"] == rank]
        if attempt is not None:
            rows = rows[rows["attempt"] == attempt]
        if not rows.empty:
            latest = rows.sort_values(["ts", "steps"], kind="stable").iloc[-1]
            current, last = _get(latest, "current_step"), _get(latest, "step")
            if bool(_get(latest, "in_step")) and current is not None:
                candidates.append(int(current))
            elif last is not None:
                candidates.append(int(last) + 1)
    from_rows = _failure_step(telemetry.steps, attempt, rank)
    if from_rows is not None:
        candidates.append(from_rows)
    if not candidates:  # nothing of its own survived (a kill loses unflushed rows): synchronous peers' progress
        peers = telemetry.steps if attempt is None or telemetry.steps.empty else \
            telemetry.steps[telemetry.steps["attempt"] == attempt]
        if not peers.empty and peers["step"].notna().any():
            candidates.append(int(peers["step"].max()) + 1)
    return max(candidates) if candidates else None


def _failure_step(steps: pd.DataFrame, attempt: int | None, rank: int | None) -> int | None:
    """The step a rank was in when it failed: one past the last step any rank of the attempt completed (synchronous
    training: no rank completes a step the failed one never finished; the failed rank's own last rows may never
    have been flushed, a SIGKILL loses its step timer's buffer)."""
    if steps.empty or rank is None or "step" not in steps.columns:
        return None
    rows = steps
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    if "phase" in rows.columns:
        rows = rows[rows["phase"].astype(object).fillna("train") != "checkpoint"]
    if rows.empty or rows["step"].dropna().empty:
        return None
    return int(rows["step"].max()) + 1
