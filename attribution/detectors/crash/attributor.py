"""The attempt level: CrashAttributor, from each failed attempt's rank failures to one crash
incident, a hang trigger, nothing, or a wait for reports still to come."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import replace

import pandas as pd

from faultlens.attribution.detectors.crash.cause import CrashFindings, Repeat, crash_incident
from faultlens.attribution.detectors.crash.classify import FailureClassifier
from faultlens.attribution.detectors.crash.failures import (
    PRIMARY_KINDS,
    WAIT,
    CrashResult,
    FailureKind,
    HangTrigger,
    RankFailure,
)
from faultlens.attribution.detectors.crash.lifecycle import (
    at_or_after,
    lost_agents,
    running_agents,
    teardown_starts,
)
from faultlens.attribution.detectors.crash.liveness import closed_ranks, death_step
from faultlens.attribution.detectors.crash.nodes import no_primary, node_lost, secondary_summary
from faultlens.attribution.detectors.crash.rows import attempt_keys, signal_identity
from faultlens.attribution.detectors.desync import desync_incident, mismatch_report
from faultlens.attribution.hardware import XidCatalogLike, hardware_findings
from faultlens.attribution.incident import Evidence, Incident
from faultlens.attribution.reading.telemetry import Placement, Telemetry, placements
from faultlens.attribution.rules import CrashRules

Failures = dict[tuple[str | None, int | None], list[RankFailure]]


class CrashAttributor(FailureClassifier):
    """Finds the primary failure of each failed attempt and attributes its cause."""

    def __init__(self, rules: CrashRules, catalog: XidCatalogLike | None) -> None:
        super().__init__(rules)
        self.catalog = catalog

    # ------------------------------------------------------------ attempt level

    def attempt_failures(self, events: pd.DataFrame) -> Failures:
        """(job, attempt) -> one RankFailure per rank that has failure rows."""
        failing = self.classify(events)
        result: Failures = {}
        if failing.empty:
            return result
        job_key = failing["job_id"].astype(object).where(failing["job_id"].notna(), "")
        attempt_key = failing["attempt"].astype(object).where(failing["attempt"].notna(), -1)
        for (job, attempt), group in failing.groupby([job_key, attempt_key], sort=True):
            result[(job or None, None if attempt == -1 else int(attempt))] = self.rank_failures(
                group
            )
        return result

    def attribute(
        self,
        telemetry: Telemetry,
        now: dt.datetime,
        settled: Callable[[str | None, int | None], bool] | None = None,
        failure_seen: Callable[[str | None, int | None], dt.datetime | None] | None = None,
    ) -> CrashResult:
        """The crash verdict of every failed attempt. Live mode passes `settled` (has the attempt's
        cascade landed?) and `failure_seen` (when a failure of the attempt was first seen): the
        waits for other nodes' reports count from the later of that and the failure's own time."""
        result = CrashResult()
        per_attempt = self.attempt_failures(telemetry.process_events)
        # an agent lost while its ranks train on: no failure rows
        for key in lost_agents(telemetry.process_events):
            per_attempt.setdefault(key, [])
        for (job, attempt), failures in sorted(
            per_attempt.items(), key=lambda item: (item[0][0] or "", item[0][1] or -1)
        ):
            if settled is not None and not settled(job, attempt):
                result.pending.append((job, attempt))
                continue
            seen = failure_seen(job, attempt) if failure_seen is not None else None
            outcome = self._attribute_attempt(
                telemetry, job, attempt, failures, per_attempt, now, seen
            )
            if outcome is WAIT:
                result.pending.append((job, attempt))
            elif isinstance(outcome, Incident):
                result.incidents.append(outcome)
            elif isinstance(outcome, HangTrigger):
                result.hang_triggers.append(outcome)
        return result

    def _attribute_attempt(
        self,
        telemetry: Telemetry,
        job: str | None,
        attempt: int | None,
        failures: list[RankFailure],
        per_attempt: Failures,
        now: dt.datetime,
        seen: dt.datetime | None = None,
    ) -> Incident | HangTrigger | object | None:
        primary = self.primary(failures)
        placement = placements(telemetry.ranks, attempt, telemetry.process_events, telemetry.steps,
                               telemetry.heartbeats)
        secondary_line = secondary_summary(failures, primary)
        lost = node_lost(self.rules, telemetry, job, attempt, failures, placement, secondary_line,
                         now)
        if lost is not None:
            return lost
        if not failures:
            return None
        if self._training_ended(telemetry, job, attempt, failures, placement):
            return None
        if primary is None:
            primary = self._stopped_from_outside(telemetry.process_events, job, attempt, failures)
        if primary is None:
            return no_primary(self.rules, self.catalog, telemetry, job, attempt, failures,
                              placement, secondary_line, now)
        hang = self._hang_before(job, attempt, primary, failures)
        if hang is not None:
            return hang
        report = mismatch_report(
            primary, failures, self._mismatch_re, self.rules.signal_notice_slack_s
        )
        # the first to fail got a peer's message for another collective: a desync
        if report is not None:
            desync = desync_incident(
                self.rules, telemetry, job, attempt, primary, report, placement, secondary_line, now
            )
            reported = max(report.ts, primary.ts)
            if not desync.culprit_ranks and now < reported + dt.timedelta(
                seconds=self.rules.desync_wait_s
            ):
                return WAIT  # the ranks' last heartbeats may still be on their way
            return desync
        return self._crash(
            telemetry,
            job,
            attempt,
            primary,
            failures,
            per_attempt,
            placement,
            secondary_line,
            now,
            seen,
        )

    def _crash(
        self,
        telemetry: Telemetry,
        job: str | None,
        attempt: int | None,
        primary: RankFailure,
        failures: list[RankFailure],
        per_attempt: Failures,
        placement: dict[int, Placement],
        secondary_line: Evidence | None,
        now: dt.datetime,
        seen: dt.datetime | None = None,
    ) -> Incident | object:
        """The crash incident of a primary failure (or WAIT for the other nodes' first reports):
        what is found around it, then the cause decided from that (cause.py)."""
        # the ranks table (the collectors' node names, which GPU events carry too) over a report's
        # host name
        node = (placement[primary.rank].node if primary.rank in placement else None) or primary.node
        own = placement.get(primary.rank) if primary.rank is not None else None
        step = death_step(telemetry, attempt, primary.rank)
        step = step if step is not None else primary.step
        same = [
            f
            for f in failures
            if f is not primary
            and f.fingerprint
            and f.fingerprint == primary.fingerprint
            and f.kind in (FailureKind.EXCEPTION, FailureKind.OOM)
        ]
        other_nodes = {
            (placement[f.rank].node if f.rank in placement else None) or f.node for f in same
        } - {node}
        other_nodes.discard(None)
        if primary.kind in (FailureKind.EXCEPTION, FailureKind.OOM) and self._others_to_come(
            telemetry,
            job,
            attempt,
            failures,
            placement,
            primary,
            now,
            seen,
            besides=None if other_nodes else node,
            within_s=self.rules.silent_node_wait_s
            if other_nodes
            else self.rules.exception_peer_wait_s,
        ):
            # an exception's verdict waits a moment for the other nodes' first reports (the same
            # exception there makes it the code's), and once it is the code's, for every rank's (the
            # ranks that ran it)
            return WAIT
        repeats = self._repeats(job, attempt, primary, per_attempt, telemetry, node)
        findings = hardware_findings(
            telemetry.gpu_events, node, primary.ts, self.rules, self.catalog, own
        )
        signature = next(
            (
                s
                for s in self.rules.signatures
                if s.matches(primary.exception_type, primary.message, primary.traceback)
            ),
            None,
        )
        found = CrashFindings(
            primary=primary,
            node=node,
            own=own,
            step=step,
            same=tuple(same),
            other_nodes=frozenset(n for n in other_nodes if n is not None),
            repeats=tuple(repeats),
            findings=tuple(findings),
            signature=signature,
        )
        return crash_incident(self.rules, job, attempt, failures, found, secondary_line, now)

    def _others_to_come(
        self,
        telemetry: Telemetry,
        job: str | None,
        attempt: int | None,
        failures: list[RankFailure],
        placement: dict[int, Placement],
        primary: RankFailure,
        now: dt.datetime,
        seen: dt.datetime | None,
        besides: str | None = None,
        within_s: float = 0.0,
    ) -> bool:
        """Ranks (of nodes other than `besides`) that reported nothing yet while their torchrun
        agent still runs, within `within_s` of the primary failure, or of when it was first seen
        live (`seen`) where that is later: their reports may still come (a loaded collector reads
        their error files later, and one node's collector may deliver a tick after another's). The
        failure's own time alone is no anchor: torchrun's error files stamp whole seconds, and a
        report seen seconds after its stamp would have no wait at all."""
        anchor = primary.ts if seen is None else max(primary.ts, seen)
        if now >= anchor + dt.timedelta(seconds=within_s):
            return False
        reported = {f.rank for f in failures}
        running = running_agents(telemetry.process_events, job, attempt)
        return any(p.node in running and p.node != besides and rank not in reported
                   for rank, p in placement.items())

    def _hang_before(self, job: str | None, attempt: int | None, primary: RankFailure,
                     failures: list[RankFailure]) -> HangTrigger | None:
        """Collective timeouts reported before the first failure: the job hung first, and the
        failure came out of the hang (a stuck rank giving up, a supervisor's kill). A dead rank
        makes its peers time out only after their timeout, so a crash never looks like this."""
        effective = primary.ts - dt.timedelta(seconds=self.rules.signal_notice_slack_s) \
            if primary.kind == FailureKind.KILLED else primary.ts
        timeouts = sorted(
            (f for f in failures if f.first_timeout is not None), key=lambda f: f.first_timeout
        )
        if not timeouts or timeouts[0].first_timeout >= effective:  # type: ignore[operator]
            return None
        evidence = [e for f in timeouts[:3] for e in f.evidence[:1]]
        evidence.append(Evidence("process_events", primary.ts, "after the timeouts: " + (
            primary.evidence[0].text if primary.evidence else f"rank {primary.rank} failed")))
        return HangTrigger(job, attempt, timeouts[0].first_timeout, tuple(evidence))  # type: ignore[arg-type]

    def _training_ended(self, telemetry: Telemetry, job: str | None, attempt: int | None,
                        failures: list[RankFailure], placement: dict[int, Placement]) -> bool:
        """Every rank of the attempt closed its step timer (its training loop was over) before the
        first error signal, and no rank failed on its own: what failed is the end of the job tearing
        down (a torchrun agent losing the rendezvous store in its exit barrier as the host's agent
        exits, a survivor's echo in destroy_process_group), never a crash."""
        if any(
            f.rank is not None and f.kind in (*PRIMARY_KINDS, FailureKind.EXITED) for f in failures
        ):
            return False
        ranks = sorted(placement)
        closed = closed_ranks(telemetry.heartbeats, attempt)
        if not ranks or not set(ranks) <= set(closed):
            return False
        return max(closed[r] for r in ranks) <= min(f.ts for f in failures)

    def _stopped_from_outside(self, events: pd.DataFrame, job: str | None, attempt: int | None,
                              failures: list[RankFailure]) -> RankFailure | None:
        """One rank ended by a termination signal (SIGTERM, SIGINT, SIGHUP) that nobody watching
        sent: torchrun names it the first failure on its node, it came before the supervisor's own
        teardown, and the ranks of the other nodes only echoed it. Something on that node stopped
        the rank (a node daemon, an operator, a drain): a death by that signal, as SIGKILL is.
        Several ranks stopped so (a job-wide cancel or preemption) stay a stop from outside, not a
        crash."""
        if events.empty or "reported_root_cause" not in events.columns:
            return None
        keys = attempt_keys(events)
        key = (job or "", attempt if attempt is not None else -1)
        rows = events[(keys == key).to_numpy(dtype=bool)]
        roots = rows[(rows["kind"] == "exit") & rows["reported_root_cause"].astype(object).eq(True)]
        if roots.empty:
            return None
        roots = self.classify(roots)
        start = teardown_starts(rows).get(key)
        # before the supervisor's own teardown began, at the resolution of each row's time
        if start is not None:
            roots = roots[~at_or_after(roots, {key: start}).to_numpy(dtype=bool)]
        stops = roots[roots["_signal"].isin(self.rules.termination_signals)]
        if len(stops) != 1 or stops["rank"].isna().any():
            return None
        rank = int(stops["rank"].iloc[0])
        stopped = next(
            (f for f in failures if f.rank == rank and f.kind == FailureKind.TERMINATED), None
        )
        if stopped is None:
            return None
        # the ranks of other nodes echoed it (lost contact), none of them was stopped too; a
        # single-node job stopped so may as well be the whole job stopped: no verdict from that
        elsewhere = [f for f in failures if f.node != stopped.node]
        if not elsewhere or any(f.kind != FailureKind.SECONDARY for f in elsewhere):
            return None
        signal = str(stops["_signal"].iloc[0])
        return replace(
            stopped,
            kind=FailureKind.KILLED,
            signal=signal,
            fingerprint=signal_identity(signal, rank),
        )

    def _repeats(self, job: str | None, attempt: int | None, primary: RankFailure,
                 per_attempt: Failures, telemetry: Telemetry, node: str | None) -> list[Repeat]:
        """Earlier attempts of the same job whose primary failure had the same fingerprint:
        (attempt, failure, same step). A death by signal (its fingerprint: signal and global rank)
        counts only from another node: on the same node it may be the node."""
        if not primary.fingerprint or attempt is None:
            return []
        step = death_step(telemetry, attempt, primary.rank)
        step = step if step is not None else primary.step
        found = []
        for (other_job, other_attempt), failures in per_attempt.items():
            if (
                other_job != job
                or other_attempt is None
                or other_attempt >= attempt
                or not failures
            ):
                continue
            previous = self.primary(failures)
            if previous is None or previous.fingerprint != primary.fingerprint:
                continue
            if primary.kind == FailureKind.KILLED:
                before = placements(
                    telemetry.ranks,
                    other_attempt,
                    telemetry.process_events,
                    telemetry.steps,
                    telemetry.heartbeats,
                )
                previous_node = (
                    before[previous.rank].node if previous.rank in before else None
                ) or previous.node
                if previous_node is None or previous_node == node:
                    continue
            previous_step = death_step(telemetry, other_attempt, previous.rank)
            previous_step = previous_step if previous_step is not None else previous.step
            found.append((other_attempt, previous, step is not None and previous_step == step))
        return sorted(found, key=lambda item: -(item[0] or 0))
