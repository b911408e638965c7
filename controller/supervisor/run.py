"""The reference supervisor: `faultlens run --nnodes N --nproc-per-node P [--spares S] -- train.py ARGS`.

It runs a torchrun job as N simulated nodes on loopback (one torchrun agent each, own node name, own local
checkpoint tier), with the node-side collectors (process source over each agent's stderr and --log-dir, a
recorded NVML backend per node), the attribution engine following the store, and the decision policy. On a
failover decision it stops the attempt, excludes the culprit node(s) (taking spares), writes the restore plan
and starts the next attempt from it; on escalate it stops and prints the decision for a human. A collective
hang is confirmed by requesting flight-recorder dumps from every rank (the trigger file the ranks poll) and
analysing them.

What an action means here (docs/design.md "What an action means"):
- a notify, and any decision on a slowdown (straggler, workload imbalance) that is not a failover, is delivered
  and the job keeps running: a running job is never stopped for a slowdown;
- a failover of a slowdown waits (bounded) for the next checkpoint boundary: a complete checkpoint newer than the
  one there was at decision time, which survives the exclusion; then the attempt stops and restarts from it;
- a failover the supervisor carried out is marked applied (never delivered again by `faultlens deliver`);
- a job whose agents all exited 0 has ended: an incident raised while it tore down (a hang of a job that had
  finished) is not acted on; after a hang incident that names no stuck rank the job gets a short grace to end by
  itself first.

What the supervisor sees and does is telemetry (process_events, source supervisor): each node's launch (start),
each torchrun agent's exit (agent_exit), and every signal it sends, written before it sends it (signal_sent).
An agent that dies (node or agent loss) leaves its workers in their own sessions: the supervisor kills them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pyarrow as pa

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.detectors.hang import attach_stacks
from faultlens.attribution.detectors.progress import HangSuspect
from faultlens.attribution.engine import Engine, Follower
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, StoreHistory, load_policy
from faultlens.attribution.rules import load_thresholds
from faultlens.attribution.store import Store
from faultlens.collectors import environment
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.agent import NodeAgent as CollectorAgent
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.process_events import ProcessSource, Source
from faultlens.collectors.sources.pystack import capture_dump_dir_stacks
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.heartbeat import HeartbeatSource
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiers import Tier, TierKind
from faultlens.controller.delivery import Deliverer
from faultlens.controller.hooks.base import Hook
from faultlens.controller.restore import plan_restore, write_plan
from faultlens.controller.supervisor.agents import (
    LaunchSpec,
    TorchrunAgent,
    free_port,
    kill_workers,
    start_agent,
    stop_agents,
)
from faultlens.controller.supervisor.gpus import FaultClock, recorded_backend
from faultlens.controller.supervisor.processes import EventRecorder

log = logging.getLogger(__name__)

#: tables whose rows a decision waits on: written through to the store, and they wake the watch loop
URGENT_TABLES = ("process_events", "gpu_events")


class Outcome(StrEnum):
    COMPLETED = "completed"
    ESCALATED = "escalated"
    NO_CAPACITY = "no_capacity"
    GAVE_UP = "gave_up"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class RunConfig:
    script: tuple[str, ...]
    nnodes: int
    nproc_per_node: int
    spares: int = 0
    store: str = "./faultlens-store"
    workdir: Path = Path("./faultlens-run")
    job_id: str = field(default_factory=lambda: f"job-{uuid.uuid4().hex[:8]}")
    max_attempts: int = 8
    policy_path: Path | None = None
    thresholds_path: Path | None = None
    attempt_timeout_s: float = 600.0
    poll_s: float = 0.25
    dump_wait_s: float = 8.0
    node_prefix: str = "node-"
    stop_grace_s: float = 5.0  # SIGTERM -> SIGKILL
    hang_grace_s: float = 15.0  # after a hang naming no stuck rank: time for a job only tearing down to end itself
    checkpoint_wait_s: float = 120.0  # a slowdown's failover waits at most this for the next checkpoint boundary
    finish_wait_s: float = 6.0  # after every agent exited with a failure: time for the engine to attribute it
    total_steps: int | None = None  # the job's declared length (FAULTLENS_TOTAL_STEPS for the step timer)
    # the remaining run time the slowdown policy assumes for a job that declares no length (None: the policy file's)
    assumed_remaining_s: float | None = None


@dataclass(frozen=True)
class AttemptFault:
    """What the caller injects into one attempt: env for the ranks, and which node's GPU fails with it."""

    env: dict[str, str] = field(default_factory=dict)
    gpu_node: str | None = None  # the node whose simulated GPU fails with the fault
    gpu_local_rank: int = 0
    gpu_fault: str | None = None  # "lost" (Xid 79) or "hot" (thermal slowdown); fires on <workdir>/gpu_<fault>-<node>
    description: str = ""


@dataclass
class AttemptRecord:
    attempt: int
    nodes: tuple[str, ...]
    started: dt.datetime
    ended: dt.datetime | None = None
    restored_step: int | None = None
    restored_tier: str | None = None
    last_step: int | None = None
    incident: Incident | None = None
    decision: Decision | None = None
    fault: str = ""
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    notices: list[Decision] = field(default_factory=list)  # decisions delivered while the job kept running
    completed: bool = False


@dataclass
class RunResult:
    outcome: Outcome
    job_id: str
    attempts: list[AttemptRecord]
    excluded: list[str]
    store: str


Events = Callable[[str], None]


class Supervisor:
    def __init__(self, config: RunConfig, *, hooks: Sequence[Hook] = (),
                 faults: Callable[[int, Sequence[str], int], AttemptFault] | None = None,
                 on_event: Events | None = None) -> None:
        self.config = config
        self.faults = faults or (lambda attempt, nodes, start_step: AttemptFault())
        self.say = on_event or (lambda text: log.info("%s", text))
        self.workdir = Path(config.workdir).resolve()
        self.pool = [f"{config.node_prefix}{i}" for i in range(config.nnodes + config.spares)]
        self.excluded: list[str] = []
        # a death or a GPU event lands at once (a decision waits on it); steps and samples every 0.5 s
        self.sink = SegmentSink(config.store, flush_rows=10_000, flush_age_s=0.5, write_through=URGENT_TABLES)
        thresholds = load_thresholds(config.thresholds_path) if config.thresholds_path else None
        self._current_dump_dir: Path | None = None
        self._current_trigger: Path | None = None
        self._current_attempt = 0
        self.engine = Engine(thresholds=thresholds, dump_requester=self._request_dumps)
        self.follower = Follower(config.store, job=config.job_id, engine=self.engine)
        self.catalog = CheckpointCatalog(self._tiers(), job_id=config.job_id)
        policy_config = load_policy(config.policy_path) if config.policy_path else None
        if config.assumed_remaining_s is not None:
            policy_config = policy_config or load_policy()
            policy_config = dataclasses.replace(policy_config, straggler=dataclasses.replace(
                policy_config.straggler, remaining_s=float(config.assumed_remaining_s)))
        self.policy = DecisionPolicy(policy_config, history=StoreHistory(Store(config.store)),
                                     restore_chooser=self.catalog)
        self.deliverer = Deliverer(config.store, list(hooks))
        self.recorder = EventRecorder(self.sink, job_id=config.job_id)
        self.gpu_clocks: dict[str, FaultClock] = {}
        self.gpu_markers: dict[str, Path | None] = {}

    # ------------------------------------------------------------------ layout

    def node_dir(self, node: str) -> Path:
        return self.workdir / "nodes" / node

    def durable_dir(self) -> Path:
        return self.workdir / "durable"

    def _tiers(self) -> list[Tier]:
        tiers = [Tier(TierKind.LOCAL, str(self.node_dir(node) / "ckpt"), node=node) for node in self.pool]
        return [*tiers, Tier(TierKind.DURABLE, str(self.durable_dir()))]

    # ------------------------------------------------------------------ hang confirmation

    def _request_dumps(self, suspect: HangSuspect) -> pa.Table | None:
        """Ask every rank of the current attempt for its flight-recorder dump, wait for them, store them."""
        if self._current_trigger is None or self._current_dump_dir is None:
            return None
        if suspect.attempt is not None and suspect.attempt != self._current_attempt:
            return None
        self.say(f"progress stopped ({suspect.detected_by}); requesting flight-recorder dumps from every rank")
        self._current_trigger.write_text(str(time.time()))
        world = self.config.nnodes * self.config.nproc_per_node
        deadline = time.monotonic() + self.config.dump_wait_s
        while time.monotonic() < deadline:
            if len(list(self._current_dump_dir.glob("rank_*.pkl"))) >= world:
                break
            time.sleep(0.1)
        time.sleep(0.2)  # let a rank finishing its rename land
        try:
            dumps = read_dump_dir(self._current_dump_dir, identity=NodeIdentity(
                node=None, job_id=self.config.job_id, attempt=self._current_attempt))
        except Exception as exc:  # the analysis goes on with what the store has
            self.say(f"cannot read the dumps: {exc}")
            return None
        table = dumps.table
        if table is not None and table.num_rows:
            self.sink.write("collectives", table)
            self.sink.flush("collectives")
            # where each rank is while the hang is live (py-spy, when installed): names a stuck rank's frame
            table = attach_stacks(table, capture_dump_dir_stacks(self._current_dump_dir))
        return table

    # ------------------------------------------------------------------ one attempt

    def _choose_nodes(self) -> list[str] | None:
        healthy = [n for n in self.pool if n not in self.excluded]
        if len(healthy) < self.config.nnodes:
            return None
        return healthy[: self.config.nnodes]

    def _start_attempt(self, attempt: int, nodes: Sequence[str], plan_path: Path | None,
                       fault: AttemptFault) -> tuple[list[TorchrunAgent], list[CollectorAgent], Path]:
        attempt_dir = self.workdir / f"attempt-{attempt}"
        if attempt_dir.exists():
            shutil.rmtree(attempt_dir)
        (attempt_dir / "dumps").mkdir(parents=True)
        self._current_dump_dir = attempt_dir / "dumps"
        self._current_trigger = attempt_dir / "fr.trigger"
        self._current_attempt = attempt
        spec = LaunchSpec(script=tuple(self.config.script), nnodes=self.config.nnodes,
                          nproc_per_node=self.config.nproc_per_node, master_port=free_port(), workdir=attempt_dir,
                          env={"FAULTLENS_STORE": str(self.config.store), "FAULTLENS_JOB_ID": self.config.job_id,
                               "FAULTLENS_ATTEMPT": str(attempt), "FAULTLENS_FR_DIR": str(attempt_dir / "dumps"),
                               "FAULTLENS_FR_TRIGGER": str(self._current_trigger),
                               "FAULTLENS_FR_STACK_TRACES": "0",
                               "FAULTLENS_CKPT_DURABLE": str(self.durable_dir()),
                               "FAULTLENS_DEMO_DIR": str(attempt_dir),
                               **({"FAULTLENS_RESTORE_PLAN": str(plan_path)} if plan_path else {}),
                               **({environment.TOTAL_STEPS.name: str(self.config.total_steps)}
                                  if self.config.total_steps else {}),
                               **fault.env})
        agents = []
        collectors = []
        for node_rank, node in enumerate(nodes):
            ckpt = self.node_dir(node) / "ckpt"
            ckpt.mkdir(parents=True, exist_ok=True)
            heartbeats = attempt_dir / "heartbeats" / node  # the node's step timers' progress records
            agent = start_agent(spec, node, node_rank, {"FAULTLENS_CKPT_LOCAL": str(ckpt),
                                                        "FAULTLENS_HEARTBEAT_DIR": str(heartbeats)},
                                attempt=attempt)
            agents.append(agent)
            identity = NodeIdentity(node=node, job_id=self.config.job_id, attempt=attempt)
            clock = FaultClock()
            faulty = fault.gpu_node == node and fault.gpu_fault is not None
            self.gpu_clocks[node] = clock
            self.gpu_markers[node] = attempt_dir / f"gpu_{fault.gpu_fault}-{node}" if faulty else None
            backend = recorded_backend(self.pool.index(node), self.config.nproc_per_node, clock,
                                       fault.gpu_local_rank if faulty else None, fault.gpu_fault if faulty else None)
            process_source = ProcessSource(identity, paths=[agent.stderr_path, agent.log_dir])
            # the launch itself is telemetry: goodput counts an attempt's start-up from this row
            process_source.record_start(rank=None, local_rank=None, pid=agent.process.pid, attempt=attempt)
            sources = [process_source, HeartbeatSource(heartbeats, identity, min_interval_s=0.0, keepalive_s=0.5),
                       NvmlSource(backend, NodeIdentity(node=node))]
            collectors.append(CollectorAgent(sources, self.sink, interval_s=self.config.poll_s))
        return agents, collectors, attempt_dir

    def _fire_gpu_faults(self) -> None:
        for node, clock in self.gpu_clocks.items():
            marker = self.gpu_markers.get(node)
            if marker is not None and not clock.fired and marker.exists():
                clock.fire()
                self.say(f"{node}: " + ("the driver reports Xid 79 (GPU has fallen off the bus)"
                                        if marker.name.startswith("gpu_lost") else
                                        "a GPU reports HW thermal slowdown (93 C, SM clock 1095 MHz)"))

    def _progress(self) -> int | None:
        frame = self.follower.tail.frame("steps")
        if frame is None or frame.empty:
            return None
        rows = frame[(frame["job_id"] == self.config.job_id) & (frame["attempt"] == self._current_attempt)]
        return None if rows.empty else int(rows["step"].max())

    def run(self) -> RunResult:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lemons = [lemon.node for lemon in self.policy.lemon_nodes()]
        for node in lemons:
            if node in self.pool and node not in self.excluded:
                self.excluded.append(node)
                self.say(f"{node} is a lemon (implicated across jobs): excluded before start")
        self.catalog.retire(self.excluded)
        attempts: list[AttemptRecord] = []
        plan_path: Path | None = None
        restored: tuple[int | None, str | None] = (None, None)
        world = self.config.nnodes * self.config.nproc_per_node
        for attempt in range(self.config.max_attempts):
            nodes = self._choose_nodes()
            if nodes is None:
                self.say("not enough healthy nodes left: a human must add capacity")
                return RunResult(Outcome.NO_CAPACITY, self.config.job_id, attempts, self.excluded, self.config.store)
            fault = self.faults(attempt, nodes, 0 if restored[0] is None else restored[0] + 1)
            record = AttemptRecord(attempt, tuple(nodes), dt.datetime.now(dt.UTC), restored_step=restored[0],
                                   restored_tier=restored[1], fault=fault.description)
            attempts.append(record)
            where = f"from step {restored[0]} ({restored[1]})" if restored[0] is not None else "from scratch"
            self.say(f"attempt {attempt}: starting on {', '.join(nodes)} {where}"
                     + (f"; injected: {fault.description}" if fault.description else ""))
            agents, collectors, attempt_dir = self._start_attempt(attempt, nodes, plan_path, fault)
            incident, decision = self._watch(agents, collectors, attempt_dir, record, nodes)
            record.ended = dt.datetime.now(dt.UTC)
            record.exit_codes = {a.node: a.exit_code for a in agents}
            record.last_step = self._progress()
            if record.completed:
                self.say(f"attempt {attempt}: training completed")
                return RunResult(Outcome.COMPLETED, self.config.job_id, attempts, self.excluded, self.config.store)
            record.incident, record.decision = incident, decision
            if incident is None or decision is None:
                self.say(f"attempt {attempt}: ended without an attributed incident (exit codes "
                         f"{record.exit_codes}); giving up")
                return RunResult(Outcome.GAVE_UP, self.config.job_id, attempts, self.excluded, self.config.store)
            if decision.action is not Action.FAILOVER:
                for item in decision.evidence[:2]:  # what the human is called for (data: printed literally)
                    self.say(f"evidence ({item.table}): {item.text}")
                self.say(f"escalated to a human; the job is stopped (decision {decision.decision_id}; its JSON: "
                         f"faultlens decisions --store {self.config.store} --job {self.config.job_id} --json)")
                return RunResult(Outcome.ESCALATED, self.config.job_id, attempts, self.excluded, self.config.store)
            for node in decision.exclude_nodes:
                if node not in self.excluded:
                    self.excluded.append(node)
            self.catalog.retire(self.excluded)  # their local tiers are gone for every later restore too
            plan = plan_restore(decision, self.catalog, world_size=world)
            plan_path = self.workdir / f"restore-plan-{attempt + 1}.json"
            if plan is not None:
                write_plan(plan, plan_path)
                restored = (plan.step, plan.tier)
            else:
                plan_path, restored = None, (None, None)
            self.deliverer.mark_applied(decision, note=(
                f"applied by the supervisor: excluded {', '.join(decision.exclude_nodes)}; restart "
                + (f"from step {restored[0]} ({restored[1]})" if restored[0] is not None else "from scratch")))
        return RunResult(Outcome.GAVE_UP, self.config.job_id, attempts, self.excluded, self.config.store)

    # ------------------------------------------------------------------ watching one attempt

    def _poll_agents(self, agents: list[TorchrunAgent], *, track: bool) -> None:
        """Record agent exits; an agent that is gone leaves no worker of its own running unwatched."""
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
                how = (f"killed by {signal_text(code)}" if code < 0 else f"exited with code {code}")
                self.recorder.agent_exit(node=agent.node, attempt=agent.attempt, returncode=code, pid=agent.pid,
                                         message=f"torchrun agent of {agent.node} {how}"
                                                 + (" (stopped by the supervisor)" if agent.stopped_by_us else ""),
                                         by_us=agent.stopped_by_us)
                if not agent.stopped_by_us and code != 0:
                    self.say(f"{agent.node}: torchrun agent {how}")
            if agent.tracker is not None and agent.tracker.alive():
                reason = (f"the torchrun agent of {agent.node} is gone ({'exit ' + str(agent.exit_code)}): its "
                          "workers must not train on unwatched")
                pids = kill_workers(agent, self.recorder, reason)
                if pids:
                    self.say(f"{agent.node}: the agent is gone; killed its {len(pids)} orphaned worker(s) "
                             f"(pids {', '.join(map(str, pids))})")

    def _rank_pids(self) -> dict[str, list[tuple[int, int | None, int | None]]]:
        frame = self.follower.tail.frame("ranks")
        if frame is None or frame.empty or "pid" not in frame.columns:
            return {}
        rows = frame[(frame["job_id"] == self.config.job_id) & (frame["attempt"] == self._current_attempt)
                     & frame["pid"].notna()]
        found: dict[str, list[tuple[int, int | None, int | None]]] = {}
        for node, pid, rank, local in zip(rows["node"], rows["pid"], rows["rank"], rows["local_rank"], strict=True):
            found.setdefault(str(node), []).append((int(pid), _int_or_none(rank), _int_or_none(local)))
        return found

    def _newest_restore(self, exclude: Sequence[str]) -> Restore | None:
        choice = self.catalog.choose(exclude, world_size=self.config.nnodes * self.config.nproc_per_node)
        return None if choice is None else choice.to_restore()

    def _watch(self, agents: list[TorchrunAgent], collectors: list[CollectorAgent], attempt_dir: Path,
               record: AttemptRecord, nodes: Sequence[str]) -> tuple[Incident | None, Decision | None]:
        """Watch one attempt until it completes, or an incident's decision ends it (returned, not yet applied),
        or it fails with nothing attributed. Decisions that leave the job running are delivered here."""
        collecting = _Collecting(collectors, self._fire_gpu_faults, self.config.poll_s)
        collecting.start()
        watch = _AttemptWatch()
        try:
            self._watch_until_over(agents, record, nodes, watch, collecting.news)
            return self._conclude(agents, record, watch)
        finally:
            stop_agents(agents, self.config.stop_grace_s, recorder=self.recorder, reason=watch.stop_reason)
            self._poll_agents(agents, track=False)
            collecting.stop()
            for collector in collectors:
                collector.tick()  # the last lines the agents wrote as they stopped
            self.sink.flush()

    def _watch_until_over(self, agents: list[TorchrunAgent], record: AttemptRecord, nodes: Sequence[str],
                          watch: _AttemptWatch, news: threading.Event) -> None:
        """Poll the agents and the engine until a decision ends the attempt, a pending failover reaches its
        checkpoint boundary, every agent has exited, or the attempt's time is up."""
        started = time.monotonic()
        while time.monotonic() - started < self.config.attempt_timeout_s:
            self._poll_agents(agents, track=True)
            for found in self.follower.poll_once():
                if found.attempt not in (None, record.attempt) or found.job_id != self.config.job_id:
                    continue
                self._on_incident(found, agents, record, nodes, watch)
            if watch.ending is not None or self._boundary_reached(watch) or self._agents_done(agents, record, watch):
                return
            news.wait(self.config.poll_s)
            news.clear()

    def _on_incident(self, found: Incident, agents: list[TorchrunAgent], record: AttemptRecord,
                     nodes: Sequence[str], watch: _AttemptWatch) -> None:
        """An incident of this attempt: not acted on (the job ended, or a failover is already pending), delivered
        while the job keeps running, a failover that waits for the next checkpoint boundary, or the decision that
        ends the attempt (watch.ending)."""
        self.say(f"incident: {found.incident_class.value} / {found.cause.value} on "
                 f"{', '.join(found.culprit_nodes) or 'no single node:'} ranks {list(found.culprit_ranks)} "
                 f"({found.rule}, confidence {found.confidence:.2f})")
        if watch.ending is not None:
            return
        if self._ended_ok(agents):
            self.say("every agent had already exited 0: the job ended; the incident is not acted on")
            return
        if watch.boundary is not None and is_slowdown(found):
            self.say("a failover at the next checkpoint boundary is already pending; the job keeps "
                     "running until then")
            return
        decision = self.policy.decide(found, job_nodes=nodes)
        if keeps_running(found, decision):
            self.deliverer.submit(decision)
            record.notices.append(decision)
            self.say(f"decision: {decision.action.value} ({decision.policy_rule}): {decision.reason}; "
                     "delivered, the job keeps running")
            return
        if is_slowdown(found) and decision.action is Action.FAILOVER:
            watch.boundary = self._pending_failover(found, decision)
            return
        if watch.boundary is not None:
            self.say(f"the pending failover of the {watch.boundary.incident.incident_class.value} is "
                     "superseded by this incident")
            watch.boundary = None
        watch.ending = (found, decision)

    def _pending_failover(self, found: Incident, decision: Decision) -> _Boundary:
        """A slowdown's failover, to be carried out at the next checkpoint boundary (bounded by checkpoint_wait_s)."""
        exclude = [*self.excluded, *decision.exclude_nodes]
        newest = self._newest_restore(exclude)
        boundary = _Boundary(found, decision, None if newest is None else newest.step, exclude,
                             time.monotonic() + self.config.checkpoint_wait_s)
        self.say(f"decision: failover ({decision.policy_rule}) at the next checkpoint boundary "
                 f"(a complete checkpoint newer than step {boundary.step_at_decision} that "
                 f"survives excluding {', '.join(decision.exclude_nodes)}; at most "
                 f"{self.config.checkpoint_wait_s:.0f} s); training goes on until then")
        return boundary

    def _boundary_reached(self, watch: _AttemptWatch) -> bool:
        """A pending failover (checked once a second) whose checkpoint boundary came, or whose wait is over: it
        becomes the decision that ends the attempt."""
        boundary = watch.boundary
        if boundary is None or time.monotonic() < boundary.next_check:
            return False
        boundary.next_check = time.monotonic() + 1.0
        newest = self._newest_restore(boundary.exclude)
        reached = newest is not None and (boundary.step_at_decision is None
                                          or newest.step > boundary.step_at_decision)
        if not (reached or time.monotonic() > boundary.deadline):
            return False
        watch.ending = (boundary.incident, boundary.at_boundary(newest, reached))
        self.say(f"checkpoint boundary: step {newest.step} is complete" if reached and newest
                 else f"no newer checkpoint within {self.config.checkpoint_wait_s:.0f} s: "
                      "failing over from the newest there is")
        return True

    def _agents_done(self, agents: list[TorchrunAgent], record: AttemptRecord, watch: _AttemptWatch) -> bool:
        """Every agent has exited: all 0 (the job completed), or a failure the engine has had finish_wait_s to
        attribute."""
        if not all(a.exit_code is not None for a in agents):
            return False
        if self._ended_ok(agents):
            record.completed = True
            watch.stop_reason = "end of job: every agent exited 0"
            if watch.boundary is not None:
                self.say("the job ended before the checkpoint boundary: no failover needed")
            return True
        watch.finished_at = watch.finished_at or time.monotonic()
        if time.monotonic() - watch.finished_at > self.config.finish_wait_s:
            watch.stop_reason = "the attempt failed and nothing was attributed"
            return True  # a failure the engine had time to see
        return False

    def _conclude(self, agents: list[TorchrunAgent], record: AttemptRecord,
                  watch: _AttemptWatch) -> tuple[Incident | None, Decision | None]:
        """The decision that ends the attempt, delivered; none when there is none, or when the job ends by itself
        within the grace after the incident."""
        if watch.ending is None:
            return None, None
        incident, decision = watch.ending
        if self._ends_by_itself(agents, incident):
            record.completed = True
            watch.stop_reason = "end of job: every agent exited 0"
            self.say("every agent exited 0 within the grace after the incident: the job had finished and "
                     "was tearing down; the incident is not acted on")
            return None, None
        self.deliverer.submit(decision)
        self.say(f"decision: {decision.action.value} ({decision.policy_rule}): {decision.reason}")
        watch.stop_reason = (f"teardown after incident {incident.incident_id} ({incident.incident_class.value}/"
                             f"{incident.cause.value}): decision {decision.action.value}")
        return watch.ending

    def _ended_ok(self, agents: Sequence[TorchrunAgent]) -> bool:
        return all(a.poll() == 0 and not a.stopped_by_us for a in agents)

    def _ends_by_itself(self, agents: list[TorchrunAgent], incident: Incident) -> bool:
        """Before acting on an incident: does the job end by itself, every agent exiting 0, within hang_grace_s?
        Asked after a hang incident that names no live stuck rank (the dumps show nobody stuck, or none came, or
        only ranks whose worker has exited: what a finished job tearing down slowly looks like too) and after any
        incident raised once no worker is left on any node (agents in torchrun's exit barrier, whose own store may
        already be gone). A real failure ends the wait as soon as an agent exits non-zero; a hang with a live
        culprit is acted on at once."""
        workers_gone = all(a.poll() is not None or (a.tracker is not None and not a.tracker.alive()) for a in agents)
        alive = {w.rank for a in agents if a.tracker is not None for w in a.tracker.alive() if w.rank is not None}
        # a hang naming no stuck rank, or naming only ranks whose process has already exited (a worker that
        # finished; one that failed makes its agent report it within the grace)
        teardown_like = incident.incident_class is IncidentClass.COLLECTIVE_HANG and not (set(incident.culprit_ranks)
                                                                                         & alive)
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
        """A worker of this attempt failed: torchrun reported its non-zero exit, or it wrote an error file (only an
        exception leaving the script does). Its agent runs with --max-restarts=0, so it exits non-zero too and the
        job cannot end by itself."""
        frame = self.follower.tail.frame("process_events")
        if frame is None or frame.empty or "exit_code" not in frame.columns:
            return False
        rows = frame[(frame["job_id"] == self.config.job_id) & (frame["attempt"] == self._current_attempt)]
        exits = rows[(rows["kind"] == "exit") & (rows["source"] != Source.SUPERVISOR)]["exit_code"].dropna()
        raised = (rows["kind"] == "error") & (rows["source"] == Source.ERROR_JSON)
        if "is_secondary" in rows.columns:
            raised &= ~rows["is_secondary"].fillna(False).astype(bool)
        return bool((exits != 0).any() or raised.any())

    def close(self) -> None:
        self.sink.close()
        self.deliverer.close()
        self.follower.close()


@dataclass
class _Boundary:
    """A slowdown's failover waiting for the next checkpoint boundary."""

    incident: Incident
    decision: Decision
    step_at_decision: int | None
    exclude: list[str]
    deadline: float
    next_check: float = 0.0

    def at_boundary(self, restore: Restore | None, reached: bool) -> Decision:
        """The decision as carried out: restoring from the checkpoint of the boundary."""
        if restore is None:
            return self.decision
        note = (f"carried out at the checkpoint boundary: restore {restore.tier} step {restore.step}" if reached
                else f"no newer checkpoint in time: restore {restore.tier} step {restore.step}")
        return dataclasses.replace(self.decision, restore=restore, reason=f"{self.decision.reason}; {note}")


class _Collecting:
    """The node-side collectors ticking on their own thread while an attempt runs. `news` is set when a tick
    stored a death or a GPU event: the watch loop looks at once, not at its next poll."""

    def __init__(self, collectors: list[CollectorAgent], after_tick: Callable[[], None], poll_s: float) -> None:
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

    ending: tuple[Incident, Decision] | None = None  # the decision that ends the attempt, with its incident
    boundary: _Boundary | None = None  # a slowdown's failover waiting for the next checkpoint boundary
    finished_at: float | None = None  # when every agent had exited, not all with 0
    stop_reason: str = "the attempt ran past its time limit"  # the reason the agents' stop signals carry


def is_slowdown(incident: Incident) -> bool:
    return incident.incident_class is IncidentClass.STRAGGLER or incident.cause is Cause.WORKLOAD_IMBALANCE


def keeps_running(incident: Incident, decision: Decision) -> bool:
    """A notify, or any decision on a slowdown but a failover: delivered, and the job keeps running."""
    return decision.action is Action.NOTIFY or (is_slowdown(incident) and decision.action is not Action.FAILOVER)


def signal_text(returncode: int) -> str:
    from faultlens.controller.supervisor.processes import signal_name

    return signal_name(-returncode)


def _int_or_none(value: object) -> int | None:
    try:
        return None if value is None or value != value else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def summary_rows(result: RunResult) -> list[dict[str, object]]:
    rows = []
    for record in result.attempts:
        incident, decision = record.incident, record.decision
        rows.append({
            "attempt": record.attempt, "nodes": ",".join(record.nodes), "fault": record.fault,
            "resumed": "-" if record.restored_step is None else f"step {record.restored_step} ({record.restored_tier})",
            "last_step": record.last_step,
            "incident": "-" if incident is None else f"{incident.incident_class.value}/{incident.cause.value}",
            "culprit": "-" if incident is None else (
                f"{','.join(incident.culprit_nodes)} r{','.join(map(str, incident.culprit_ranks))}"),
            "decision": "-" if decision is None else decision.action.value,
            "excluded": "-" if decision is None else ",".join(decision.exclude_nodes) or "-",
            "kept_running": ",".join(f"{d.action.value}:{d.incident_class.value}" for d in record.notices) or "-",
            "seconds": round(((record.ended or record.started) - record.started).total_seconds(), 1),
        })
    return rows


def write_summary(result: RunResult, path: Path) -> None:
    path.write_text(json.dumps({"outcome": result.outcome.value, "job_id": result.job_id,
                                "excluded": result.excluded, "attempts": summary_rows(result)}, indent=1,
                               default=str))
