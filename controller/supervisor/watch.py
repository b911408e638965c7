"""Watching one attempt of the reference supervisor (AttemptWatcher): the agents' exits and their
orphaned workers, the engine's incidents and the policy's decisions on them (delivered while the job
keeps running, a slowdown's failover held until the next checkpoint boundary, or the decision that
ends the attempt), and the node-side collectors ticking on their own thread meanwhile.

Which of those a decision is, is the policy's judgment (attribution/policy/running.py): this
module carries it out. What it needs of the supervisor comes in as a value (WatchInputs), so it
does not import the supervisor."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from faultlens.attribution.decision import Action, Decision, DeliveryStatus, Restore
from faultlens.attribution.incident import Incident, IncidentClass
from faultlens.attribution.policy.running import (
    fails_over_at_boundary,
    keeps_running,
    waits_for_pending_failover,
)
from faultlens.collectors.sources.agent import NodeAgent as CollectorAgent
from faultlens.collectors.sources.process_events import Source
from faultlens.collectors.store.schema import Role, tables_with
from faultlens.collectors.training.heartbeat import read_heartbeat
from faultlens.controller.supervisor.agents import TorchrunAgent, kill_workers, stop_agents
from faultlens.controller.supervisor.preflight import job_start_error, node_start_over
from faultlens.controller.supervisor.records import AttemptRecord, Events, RunConfig

if TYPE_CHECKING:
    from faultlens.attribution.follow import Follower
    from faultlens.attribution.policy import DecisionPolicy
    from faultlens.collectors.store.sink import SegmentSink
    from faultlens.controller.checkpoints.catalog import CheckpointCatalog
    from faultlens.controller.checkpoints.entry import RestoreChoice
    from faultlens.controller.delivery import Deliverer
    from faultlens.controller.supervisor.processes import EventRecorder

#: why a slowdown's failover is not carried out once every rank has finished training
TRAINING_OVER = "every rank had finished training (its step timer closed)"

#: tables whose rows a decision waits on: written through to the store, and they wake the watch loop
URGENT_TABLES = tables_with(Role.URGENT)


@dataclass(frozen=True)
class WatchInputs:
    """What watching one attempt needs of the supervisor, handed over as a value: the watcher reads
    these and nothing else of it (the supervisor, controller/supervisor/run.py, builds one per
    attempt)."""

    config: RunConfig
    say: Events
    follower: Follower  # the engine following the store: incidents, and the tables read here
    policy: DecisionPolicy
    deliverer: Deliverer
    recorder: EventRecorder  # the supervisor's own telemetry (agent exits, signals sent)
    catalog: CheckpointCatalog
    sink: SegmentSink
    excluded: list[str]  # the supervisor's excluded nodes, as the list grows (the same list)
    current_attempt: int
    fire_gpu_faults: Callable[[], None]  # called after every tick of the node-side collectors


class AttemptWatcher:
    """One attempt watched with the supervisor's engine follower, policy, deliverer, recorder and
    catalog.
    """

    def __init__(self, inputs: WatchInputs) -> None:
        self.config = inputs.config
        self.say = inputs.say
        self.follower = inputs.follower
        self.policy = inputs.policy
        self.deliverer = inputs.deliverer
        self.recorder = inputs.recorder
        self.catalog = inputs.catalog
        self.sink = inputs.sink
        self.excluded = inputs.excluded  # the supervisor's list, as it grows
        self.current_attempt = inputs.current_attempt
        self.fire_gpu_faults = inputs.fire_gpu_faults

    def _poll_agents(self, agents: list[TorchrunAgent], *, track: bool) -> None:
        """Record agent exits; an agent that is gone leaves no worker of its own running
        unwatched."""
        ranks = self._rank_pids() if track else {}
        for agent in agents:
            if agent.poll() is None:
                if track and agent.tracker is not None:
                    agent.tracker.refresh()
                    agent.tracker.add_ranks(ranks.get(agent.node, ()))
                continue
            if not agent.exit_recorded:
                agent.exit_recorded = True
                code = agent.exit_code if agent.exit_code is not None else 0
                how = f"killed by {signal_text(code)}" if code < 0 else f"exited with code {code}"
                self.recorder.agent_exit(
                    node=agent.node,
                    attempt=agent.attempt,
                    returncode=code,
                    pid=agent.pid,
                    message=f"torchrun agent of {agent.node} {how}"
                    + (" (stopped by the supervisor)" if agent.stopped_by_us else ""),
                    by_us=agent.stopped_by_us,
                )
                if not agent.stopped_by_us and code != 0:
                    self.say(f"{agent.node}: torchrun agent {how}")
            if agent.tracker is not None and agent.tracker.alive():
                reason = (
                    f"the torchrun agent of {agent.node} is gone "
                    f"({'exit ' + str(agent.exit_code)}): its "
                    "workers must not train on unwatched"
                )
                pids = kill_workers(agent, self.recorder, reason)
                if pids:
                    self.say(
                        f"{agent.node}: the agent is gone; killed its {len(pids)} orphaned "
                        "worker(s) "
                        f"(pids {', '.join(map(str, pids))})"
                    )

    def _rank_pids(self) -> dict[str, list[tuple[int, int | None, int | None]]]:
        frame = self.follower.tail.frame("ranks")
        if frame is None or frame.empty or "pid" not in frame.columns:
            return {}
        rows = frame[
            (frame["job_id"] == self.config.job_id)
            & (frame["attempt"] == self.current_attempt)
            & frame["pid"].notna()
        ]
        found: dict[str, list[tuple[int, int | None, int | None]]] = {}
        for node, pid, rank, local in zip(
            rows["node"], rows["pid"], rows["rank"], rows["local_rank"], strict=True
        ):
            found.setdefault(str(node), []).append(
                (int(pid), _int_or_none(rank), _int_or_none(local))
            )
        return found

    def _newest_restore(self, exclude: Sequence[str]) -> Restore | None:
        choice = self.catalog.choose(
            exclude, world_size=self.config.nnodes * self.config.nproc_per_node
        )
        return None if choice is None else choice.to_restore()

    def watch(
        self,
        agents: list[TorchrunAgent],
        collectors: list[CollectorAgent],
        attempt_dir: Path,
        record: AttemptRecord,
        nodes: Sequence[str],
    ) -> tuple[Incident | None, Decision | None]:
        """Watch one attempt until it completes, or an incident's decision ends it (returned, not
        yet applied), or it fails with nothing attributed. Decisions that leave the job running are
        delivered here."""
        collecting = _Collecting(collectors, self.fire_gpu_faults, self.config.poll_s)
        collecting.start()
        watch = _AttemptWatch()
        try:
            self._watch_until_over(agents, record, nodes, watch, collecting.news, attempt_dir)
            return self._conclude(agents, record, watch)
        finally:
            stop_agents(
                agents, self.config.stop_grace_s, recorder=self.recorder, reason=watch.stop_reason
            )
            self._poll_agents(agents, track=False)
            collecting.stop()
            for collector in collectors:
                collector.tick()  # the last lines the agents wrote as they stopped
            self.sink.flush()

    def _watch_until_over(
        self,
        agents: list[TorchrunAgent],
        record: AttemptRecord,
        nodes: Sequence[str],
        watch: _AttemptWatch,
        news: threading.Event,
        attempt_dir: Path,
    ) -> None:
        """Poll the agents and the engine until a decision ends the attempt, a pending failover
        reaches its checkpoint boundary, every agent has exited, the job could not start (the same
        error on every node before any step: a job error, no node to blame), or the attempt's time
        is up."""
        started = time.monotonic()
        watch.started = started
        watch.attempt_dir = attempt_dir
        while time.monotonic() - started < self.config.attempt_timeout_s:
            self._poll_agents(agents, track=True)
            if self._start_failed(agents, nodes, record, watch, attempt_dir):
                return
            self._release_held(agents, record, nodes, watch)
            if self._boundary_reached(watch):
                return  # a pending failover's wait is over: not held up by the next poll's work
            for found in self.follower.poll_once():
                if (
                    found.attempt not in (None, record.attempt)
                    or found.job_id != self.config.job_id
                ):
                    continue
                self._on_incident(found, agents, record, nodes, watch)
            if (
                watch.ending is not None
                or self._boundary_reached(watch)
                or self._agents_done(agents, record, watch)
            ):
                return
            news.wait(self.config.poll_s)
            news.clear()

    def _start_failed(
        self,
        agents: list[TorchrunAgent],
        nodes: Sequence[str],
        record: AttemptRecord,
        watch: _AttemptWatch,
        attempt_dir: Path,
    ) -> bool:
        """Every node's start is over before any step of the attempt (its agent exited non-zero by
        itself, or torchrun's failure report for it is complete and none of its workers is left:
        judged as soon as every local rank of every node has ended, not after torchrun's teardown),
        each node's ranks with the same error (controller/supervisor/preflight.py): a job error, not
        a node's."""
        if watch.ending is not None or watch.start_judged or watch.progressed:
            return False
        if self._has_progress() or _heartbeat_progress(attempt_dir):
            watch.progressed = True  # a step was made: a later failure is never a start failure
            return False
        if not all(_start_over(a) for a in agents):
            return False
        watch.start_judged = True
        if any(a.exit_code == 0 or a.stopped_by_us for a in agents) or self._has_progress():
            return False
        error = job_start_error(attempt_dir, nodes)
        if error is None:
            return False
        record.job_error = error
        watch.held = None
        watch.stop_reason = f"job error before any step: {error.error}"
        return True

    def _has_progress(self) -> bool:
        """A step row or a heartbeat of this attempt has been stored."""
        for table in ("steps", "heartbeats"):
            frame = self.follower.tail.frame(table)
            if frame is None or frame.empty or "attempt" not in frame.columns:
                continue
            rows = frame[
                (frame["job_id"] == self.config.job_id) & (frame["attempt"] == self.current_attempt)
            ]
            if "step" in rows.columns:
                rows = rows[rows["step"].notna()]
            if not rows.empty:
                return True
        return False

    def _release_held(
        self,
        agents: list[TorchrunAgent],
        record: AttemptRecord,
        nodes: Sequence[str],
        watch: _AttemptWatch,
    ) -> None:
        """A crash held while the start was judged: decided once the start is judged (every agent
        exited, not a job error) or the hold is over (a node is still running: not everyone's)."""
        if watch.held is None:
            return
        if not (watch.start_judged or time.monotonic() >= watch.held_until):
            return
        found, watch.held = watch.held, None
        self._act_on(found, agents, record, nodes, watch)

    def _on_incident(
        self,
        found: Incident,
        agents: list[TorchrunAgent],
        record: AttemptRecord,
        nodes: Sequence[str],
        watch: _AttemptWatch,
    ) -> None:
        """An incident of this attempt: held while the attempt's start is judged (a crash before
        any step), not acted on (the job ended, or a failover is already pending), delivered while
        the job keeps running, a failover that waits for the next checkpoint boundary, or the
        decision that ends the attempt (watch.ending)."""
        self.say(
            f"incident: {found.incident_class.value} / {found.cause.value} on "
            f"{', '.join(found.culprit_nodes) or 'no single node:'} ranks "
            f"{list(found.culprit_ranks)} "
            f"({found.rule}, confidence {found.confidence:.2f})"
        )
        if (
            watch.held is None
            and not watch.start_judged
            and watch.ending is None
            and found.incident_class is IncidentClass.CRASH
            and not self._has_progress()
        ):
            watch.held = found
            watch.held_until = time.monotonic() + self.config.start_hold_s
            self.say(
                "no step yet in this attempt: the crash is held until every node's start is "
                f"known (at most {self.config.start_hold_s:.0f} s): the same error everywhere "
                "is the job's, not a node's"
            )
            return
        self._act_on(found, agents, record, nodes, watch)

    def _act_on(
        self,
        found: Incident,
        agents: list[TorchrunAgent],
        record: AttemptRecord,
        nodes: Sequence[str],
        watch: _AttemptWatch,
    ) -> None:
        """The policy's decision on an incident, carried out (see _on_incident)."""
        if watch.ending is not None:
            return
        if self._ended_ok(agents):
            self.say(
                "every agent had already exited 0: the job ended; the incident is not acted on"
            )
            return
        # when the job fails over is the policy's judgment (attribution/policy/running.py)
        if watch.boundary is not None and waits_for_pending_failover(found):
            self.say(
                "a failover at the next checkpoint boundary is already pending; the job keeps "
                "running until then"
            )
            return
        decision = self.policy.decide(found, job_nodes=nodes)
        if keeps_running(found, decision):
            how = self._deliver(decision, "shown in the supervisor's log; the job kept running")
            record.notices.append(decision)
            self.say(
                f"decision: {decision.action.value} ({decision.policy_rule}): "
                f"{decision.reason}; {how}, the job keeps running"
            )
            return
        if fails_over_at_boundary(found, decision) and self._training_over(watch):
            self._outrun(found, decision, TRAINING_OVER)
            return
        if fails_over_at_boundary(found, decision):
            watch.boundary = self._pending_failover(found, decision, watch)
            if watch.boundary.deadline > time.monotonic():
                return
            # the checkpoint is recent: carried out at once
            boundary, watch.boundary = watch.boundary, None
            watch.ending = (found, boundary.at_once(self._newest_restore(boundary.exclude)))
            return
        if watch.boundary is not None:
            self.say(
                f"the pending failover of the {watch.boundary.incident.incident_class.value} "
                "is "
                "superseded by this incident"
            )
            watch.boundary = None
        watch.ending = (found, decision)

    def _deliver(self, decision: Decision, done: str) -> str:
        """Persist and deliver `decision` to the hooks; with no hook, the supervisor's own log is
        where it was delivered and what it did is all there is to do: marked applied (never
        pending in the store). Says how, for the live log."""
        results = self.deliverer.submit(decision)
        if not self.deliverer.hooks:
            self.deliverer.mark_applied(decision, note=f"applied by the supervisor: {done}")
            return "applied (no hook configured)"
        failed = [r.hook for r in results if r.status is not DeliveryStatus.DELIVERED]
        if failed:
            return f"delivered except to {', '.join(failed)} (retried by faultlens deliver)"
        return f"delivered to {', '.join(h.name for h in self.deliverer.hooks)}"

    def _pending_failover(
        self, found: Incident, decision: Decision, watch: _AttemptWatch
    ) -> _Boundary:
        """A slowdown's failover, to be carried out at the next checkpoint boundary (bounded by
        checkpoint_wait_s), or at once (the boundary's deadline already passed) when the work it
        loses now is no more than the policy priced in (straggler.lost_work_s): the newest
        checkpoint that survives the exclusion is that recent, or, with none, the attempt began
        that recently (waiting would only let the job outrun the decision).
        """
        exclude = [*self.excluded, *decision.exclude_nodes]
        choice = self.catalog.choose(
            exclude, world_size=self.config.nnodes * self.config.nproc_per_node
        )
        newest = None if choice is None else choice.to_restore()
        lost_s = _lost_work_s(choice, watch.started)
        priced = _priced_lost_work_s(self.policy)
        if lost_s is not None and lost_s <= priced:
            self.say(
                f"decision: failover ({decision.policy_rule}) at once: failing over now loses "
                f"{lost_s:.0f} s of work ("
                + ("since the newest checkpoint, step " + str(newest.step) if newest
                   else "no checkpoint: since the attempt began")
                + f"), no more than the {priced:.0f} s the policy counted"
            )
            return _Boundary(found, decision, None if newest is None else newest.step, exclude,
                             float("-inf"))
        boundary = _Boundary(
            found,
            decision,
            None if newest is None else newest.step,
            exclude,
            time.monotonic() + self.config.checkpoint_wait_s,
        )
        self.say(
            f"decision: failover ({decision.policy_rule}) at the next checkpoint boundary "
            f"(a complete checkpoint newer than step {boundary.step_at_decision} that "
            f"survives excluding {', '.join(decision.exclude_nodes)}; at most "
            f"{self.config.checkpoint_wait_s:.0f} s); training goes on until then"
        )
        return boundary

    def _boundary_reached(self, watch: _AttemptWatch) -> bool:
        """A pending failover (checked once a second) whose checkpoint boundary came, or whose wait
        is over: it becomes the decision that ends the attempt."""
        boundary = watch.boundary
        if boundary is None or time.monotonic() < boundary.next_check:
            return False
        boundary.next_check = time.monotonic() + 1.0
        newest = self._newest_restore(boundary.exclude)
        reached = newest is not None and (
            boundary.step_at_decision is None or newest.step > boundary.step_at_decision
        )
        if not (reached or time.monotonic() > boundary.deadline):
            return False
        if self._training_over(watch):  # nothing left to save: the job runs to its end
            watch.boundary = None
            self._outrun(boundary.incident, boundary.decision, TRAINING_OVER)
            return False
        watch.ending = (boundary.incident, boundary.at_boundary(newest, reached))
        self.say(
            f"checkpoint boundary: step {newest.step} is complete"
            if reached and newest
            else f"no newer checkpoint within {self.config.checkpoint_wait_s:.0f} s: "
            "failing over from the newest there is"
        )
        return True

    def _agents_done(
        self, agents: list[TorchrunAgent], record: AttemptRecord, watch: _AttemptWatch
    ) -> bool:
        """Every agent has exited: all 0 (the job completed), or a failure the engine has had
        finish_wait_s to attribute."""
        if not all(a.exit_code is not None for a in agents):
            return False
        if self._ended_ok(agents):
            record.completed = True
            watch.stop_reason = "end of job: every agent exited 0"
            if watch.boundary is not None:
                boundary = watch.boundary
                self._outrun(boundary.incident, boundary.decision,
                             "the job ended before its checkpoint boundary")
            return True
        watch.finished_at = watch.finished_at or time.monotonic()
        if time.monotonic() - watch.finished_at > self.config.finish_wait_s:
            watch.stop_reason = "the attempt failed and nothing was attributed"
            return True  # a failure the engine had time to see
        return False

    def _training_over(self, watch: _AttemptWatch) -> bool:
        """Every rank of the attempt has finished training: its step timer closed (it steps no
        more). A slowdown's failover then saves nothing: the job outran it."""
        if watch.attempt_dir is None:
            return False
        return _timers_closed(watch.attempt_dir, self.config.nnodes * self.config.nproc_per_node)

    def _outrun(self, incident: Incident, decision: Decision, why: str) -> None:
        """A slowdown's failover the job outran (it ended, or finished training, before the
        failover was carried out): stored with the status outrun and shown, never delivered or
        carried out."""
        note = f"not carried out: {why}"
        self.deliverer.mark_outrun(decision, note=note)
        self.say(
            f"decision: failover ({decision.policy_rule}) outrun: {note} "
            f"(stored as {DeliveryStatus.OUTRUN.value})"
        )

    def _conclude(
        self, agents: list[TorchrunAgent], record: AttemptRecord, watch: _AttemptWatch
    ) -> tuple[Incident | None, Decision | None]:
        """The decision that ends the attempt, delivered; none when there is none, or when the job
        ends by itself within the grace after the incident."""
        if watch.ending is None:
            return None, None
        incident, decision = watch.ending
        if self._ends_by_itself(agents, incident):
            record.completed = True
            watch.stop_reason = "end of job: every agent exited 0"
            self.say(
                "every agent exited 0 within the grace after the incident: the job had "
                "finished and "
                "was tearing down; the incident is not acted on"
            )
            if fails_over_at_boundary(incident, decision):
                self._outrun(incident, decision, "the job ended first")
            return None, None
        if decision.action in (Action.FAILOVER, Action.RESTART):
            self.deliverer.submit(decision)  # marked applied once carried out (run.py)
        else:
            self._deliver(decision, "the supervisor stopped the job for a human")
        self.say(f"decision: {decision.action.value} ({decision.policy_rule}): {decision.reason}")
        watch.stop_reason = (
            f"teardown after incident {incident.incident_id} "
            f"({incident.incident_class.value}/"
            f"{incident.cause.value}): decision {decision.action.value}"
        )
        return watch.ending

    def _ended_ok(self, agents: Sequence[TorchrunAgent]) -> bool:
        return all(a.poll() == 0 and not a.stopped_by_us for a in agents)

    def _ends_by_itself(self, agents: list[TorchrunAgent], incident: Incident) -> bool:
        """Before acting on an incident: does the job end by itself, every agent exiting 0, within
        hang_grace_s? Asked after a hang incident that names no live stuck rank (the dumps show
        nobody stuck, or none came, or only ranks whose worker has exited: what a finished job
        tearing down slowly looks like too) and after any incident raised once no worker is left on
        any node (agents in torchrun's exit barrier, whose own store may already be gone). A real
        failure ends the wait as soon as an agent exits non-zero; a hang with a live culprit is
        acted on at once."""
        workers_gone = all(
            a.poll() is not None or (a.tracker is not None and not a.tracker.alive())
            for a in agents
        )
        alive = {
            w.rank
            for a in agents
            if a.tracker is not None
            for w in a.tracker.alive()
            if w.rank is not None
        }
        # a hang naming no stuck rank, or naming only ranks whose process has already exited (a
        # worker that finished; one that failed makes its agent report it within the grace)
        teardown_like = incident.incident_class is IncidentClass.COLLECTIVE_HANG and not (
            set(incident.culprit_ranks) & alive
        )
        if not (teardown_like or workers_gone) or self._worker_failure_reported():
            return False
        deadline = time.monotonic() + self.config.hang_grace_s
        while True:
            self._poll_agents(agents, track=True)
            if any(a.exit_code not in (None, 0) for a in agents):
                return False
            if self._ended_ok(agents):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.config.poll_s)

    def _worker_failure_reported(self) -> bool:
        """A worker of this attempt failed: torchrun reported its non-zero exit, or it wrote an
        error file (only an exception leaving the script does). Its agent runs with
        --max-restarts=0, so it exits non-zero too and the job cannot end by itself."""
        frame = self.follower.tail.frame("process_events")
        if frame is None or frame.empty or "exit_code" not in frame.columns:
            return False
        rows = frame[
            (frame["job_id"] == self.config.job_id) & (frame["attempt"] == self.current_attempt)
        ]
        exits = rows[(rows["kind"] == "exit") & (rows["source"] != Source.SUPERVISOR)][
            "exit_code"
        ].dropna()
        raised = (rows["kind"] == "error") & (rows["source"] == Source.ERROR_JSON)
        if "is_secondary" in rows.columns:
            raised &= ~rows["is_secondary"].fillna(False).astype(bool)
        return bool((exits != 0).any() or raised.any())


@dataclass
class _Boundary:
    """A slowdown's failover waiting for the next checkpoint boundary."""

    incident: Incident
    decision: Decision
    step_at_decision: int | None
    exclude: list[str]
    deadline: float
    next_check: float = 0.0

    def at_once(self, restore: Restore | None) -> Decision:
        """The decision carried out at once (its checkpoint is recent)."""
        note = (
            "carried out at once: no checkpoint, the attempt began recently"
            if restore is None
            else f"carried out at once: restore {restore.tier} step {restore.step} is recent"
        )
        return dataclasses.replace(
            self.decision, restore=restore or self.decision.restore,
            reason=f"{self.decision.reason}; {note}",
        )

    def at_boundary(self, restore: Restore | None, reached: bool) -> Decision:
        """The decision as carried out: restoring from the checkpoint of the boundary."""
        if restore is None:
            return self.decision
        note = (
            f"carried out at the checkpoint boundary: restore {restore.tier} step {restore.step}"
            if reached
            else f"no newer checkpoint in time: restore {restore.tier} step {restore.step}"
        )
        return dataclasses.replace(
            self.decision, restore=restore, reason=f"{self.decision.reason}; {note}"
        )


class _Collecting:
    """The node-side collectors ticking on their own thread while an attempt runs. `news` is set
    when a tick stored a death or a GPU event: the watch loop looks at once, not at its next poll.
    """

    def __init__(
        self, collectors: list[CollectorAgent], after_tick: Callable[[], None], poll_s: float
    ) -> None:
        self.collectors = collectors
        self.after_tick = after_tick
        self.poll_s = poll_s
        self.news = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faultlens-collectors", daemon=True)

    def _urgent_rows(self) -> int:
        return sum(c.stats.rows.get(table, 0) for c in self.collectors for table in URGENT_TABLES)

    def _run(self) -> None:
        while not self._stopping.is_set():
            before = self._urgent_rows()
            for collector in self.collectors:
                collector.tick()
            if self._urgent_rows() != before:
                self.news.set()
            self.after_tick()
            self._stopping.wait(self.poll_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)


@dataclass
class _AttemptWatch:
    """What watching one attempt has come to so far."""

    # the decision that ends the attempt, with its incident
    ending: tuple[Incident, Decision] | None = None
    # a slowdown's failover waiting for the next checkpoint boundary
    boundary: _Boundary | None = None
    finished_at: float | None = None  # when every agent had exited, not all with 0
    # the reason the agents' stop signals carry
    stop_reason: str = "the attempt ran past its time limit"
    # a crash before any step, held until the start is judged (every agent exited, or the hold ends)
    held: Incident | None = None
    held_until: float = 0.0
    start_judged: bool = False  # every node's start was over when the start was judged
    started: float | None = None  # when watching began (monotonic)
    attempt_dir: Path | None = None
    progressed: bool = False  # a step of this attempt was seen: its start did not fail


def _lost_work_s(choice: RestoreChoice | None, started: float | None) -> float | None:
    """The work a failover now loses: the age of the checkpoint it restores (its newest entry's
    creation), or with none the attempt's age (it restarts from the beginning); None unknown."""
    if choice is None:
        return None if started is None else time.monotonic() - started
    created = [e.created_at for e in choice.entries if e.created_at is not None]
    if not created:
        return None
    return max(0.0, (dt.datetime.now(dt.UTC) - max(created)).total_seconds())


def _priced_lost_work_s(policy: DecisionPolicy) -> float:
    """The lost work the policy's cost rule counts for a slowdown's failover."""
    slowdown = getattr(policy.config, "straggler", None)
    return float(getattr(slowdown, "lost_work_s", 0.0) or 0.0)


def _start_over(agent: TorchrunAgent) -> bool:
    """The node's start is over: its agent exited, or torchrun's failure report for it is complete
    and no worker of it is left (the report is written after torchrun stopped the group)."""
    if agent.poll() is not None:
        return True
    if agent.tracker is not None:
        agent.tracker.refresh()
        if agent.tracker.alive():
            return False
    return node_start_over(agent.stderr_path)


def _timers_closed(attempt_dir: Path, world: int) -> bool:
    """Every rank's step timer of this attempt (its heartbeat file, read directly) is closed, and
    there are at least `world` of them."""
    closed = 0
    for path in (attempt_dir / "heartbeats").glob("*/hb-*.bin"):
        try:
            beat = read_heartbeat(path)
        except (OSError, ValueError):
            return False
        if not beat.closed:
            return False
        closed += 1
    return closed >= world


def _heartbeat_progress(attempt_dir: Path) -> bool:
    """A rank's step timer of this attempt has begun or finished a step (its heartbeat file, read
    directly: the store may lag the judgment by a poll)."""
    for path in (attempt_dir / "heartbeats").glob("*/hb-*.bin"):
        try:
            beat = read_heartbeat(path)
        except (OSError, ValueError):
            continue
        if beat.steps or beat.last_step is not None or beat.current_step is not None:
            return True
    return False


def signal_text(returncode: int) -> str:
    from faultlens.controller.supervisor.processes import signal_name

    return signal_name(-returncode)


def _int_or_none(value: object) -> int | None:
    try:
        return None if value is None or value != value else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
