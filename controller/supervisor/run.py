"""The reference supervisor: `faultlens run --nnodes N --nproc-per-node P [--spares S] -- train.py ARGS`.

It runs a torchrun job as N simulated nodes on loopback (one torchrun agent each, own node name, own local
checkpoint tier), with the node-side collectors (process source over each agent's stderr and --log-dir, a
recorded NVML backend per node), the attribution engine following the store, and the decision policy. On a
failover decision it stops the attempt, excludes the culprit node(s) (taking spares), writes the restore plan
and starts the next attempt from it; on escalate it stops and prints the decision for a human. A collective
hang is confirmed by requesting flight-recorder dumps from every rank (the trigger file the ranks poll) and
analysing them.
"""

from __future__ import annotations

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

from attribution.decision import Action, Decision
from attribution.engine import Engine, Follower
from attribution.incident import Incident
from attribution.policy import DecisionPolicy, StoreHistory, load_policy
from attribution.progress import HangSuspect
from attribution.rules import load_thresholds
from attribution.store import Store
from collectors.agent import NodeAgent as CollectorAgent
from collectors.flight_recorder import read_dump_dir
from collectors.heartbeat import HeartbeatSource
from collectors.nvml_source import NvmlSource
from collectors.process_events import ProcessSource
from collectors.sink import SegmentSink
from collectors.source import NodeIdentity
from controller.checkpoints.catalog import CheckpointCatalog
from controller.checkpoints.tiers import Tier, TierKind
from controller.delivery import Deliverer
from controller.hooks.base import Hook
from controller.restore import plan_restore, write_plan
from controller.supervisor.agents import LaunchSpec, TorchrunAgent, free_port, start_agent, stop_agents
from controller.supervisor.gpus import FaultClock, recorded_backend

log = logging.getLogger(__name__)


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
        self.sink = SegmentSink(config.store, flush_rows=10_000, flush_age_s=0.5)
        thresholds = load_thresholds(config.thresholds_path) if config.thresholds_path else None
        self._current_dump_dir: Path | None = None
        self._current_trigger: Path | None = None
        self._current_attempt = 0
        self.engine = Engine(thresholds=thresholds, dump_requester=self._request_dumps)
        self.follower = Follower(config.store, job=config.job_id, engine=self.engine)
        self.catalog = CheckpointCatalog(self._tiers(), job_id=config.job_id)
        policy_config = load_policy(config.policy_path) if config.policy_path else None
        self.policy = DecisionPolicy(policy_config, history=StoreHistory(Store(config.store)),
                                     restore_chooser=self.catalog)
        self.deliverer = Deliverer(config.store, list(hooks))
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
                               **fault.env})
        agents = []
        collectors = []
        for node_rank, node in enumerate(nodes):
            ckpt = self.node_dir(node) / "ckpt"
            ckpt.mkdir(parents=True, exist_ok=True)
            heartbeats = attempt_dir / "heartbeats" / node  # the node's step timers' progress records
            agent = start_agent(spec, node, node_rank, {"FAULTLENS_CKPT_LOCAL": str(ckpt),
                                                        "FAULTLENS_HEARTBEAT_DIR": str(heartbeats)})
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
        attempts: list[AttemptRecord] = []
        plan_path: Path | None = None
        restored: tuple[int | None, str | None] = (None, None)
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
            incident = self._watch(agents, collectors, attempt_dir, record)
            record.incident = incident
            record.ended = dt.datetime.now(dt.UTC)
            record.exit_codes = {a.node: a.exit_code for a in agents}
            record.last_step = self._progress()
            if incident is None:
                if all(a.exit_code == 0 for a in agents):
                    self.say(f"attempt {attempt}: training completed")
                    return RunResult(Outcome.COMPLETED, self.config.job_id, attempts, self.excluded,
                                     self.config.store)
                self.say(f"attempt {attempt}: ended without an attributed incident (exit codes "
                         f"{record.exit_codes}); giving up")
                return RunResult(Outcome.GAVE_UP, self.config.job_id, attempts, self.excluded, self.config.store)
            decision = self.policy.decide(incident, job_nodes=nodes)
            self.deliverer.submit(decision)
            record.decision = decision
            self.say(f"decision: {decision.action.value} ({decision.policy_rule}): {decision.reason}")
            if decision.action is not Action.FAILOVER:
                self.say("escalated to a human; the job is stopped:\n" + decision.to_json())
                return RunResult(Outcome.ESCALATED, self.config.job_id, attempts, self.excluded, self.config.store)
            for node in decision.exclude_nodes:
                if node not in self.excluded:
                    self.excluded.append(node)
            plan = plan_restore(decision, self.catalog, world_size=self.config.nnodes * self.config.nproc_per_node)
            plan_path = self.workdir / f"restore-plan-{attempt + 1}.json"
            if plan is not None:
                write_plan(plan, plan_path)
                restored = (plan.step, plan.tier)
            else:
                plan_path, restored = None, (None, None)
        return RunResult(Outcome.GAVE_UP, self.config.job_id, attempts, self.excluded, self.config.store)

    def _watch(self, agents: list[TorchrunAgent], collectors: list[CollectorAgent], attempt_dir: Path,
               record: AttemptRecord) -> Incident | None:
        stop = threading.Event()

        def collect() -> None:
            while not stop.is_set():
                for collector in collectors:
                    collector.tick()
                self._fire_gpu_faults()
                stop.wait(self.config.poll_s)

        thread = threading.Thread(target=collect, name="faultlens-collectors", daemon=True)
        thread.start()
        started = time.monotonic()
        incident: Incident | None = None
        finished_at: float | None = None
        try:
            while time.monotonic() - started < self.config.attempt_timeout_s:
                for agent in agents:
                    agent.poll()
                for found in self.follower.poll_once():
                    if found.attempt in (None, record.attempt) and found.job_id == self.config.job_id:
                        incident = incident or found
                        self.say(f"incident: {found.incident_class.value} / {found.cause.value} on "
                                 f"{', '.join(found.culprit_nodes) or '?'} ranks {list(found.culprit_ranks)} "
                                 f"({found.rule}, confidence {found.confidence:.2f})")
                if incident is not None:
                    break
                if all(a.exit_code is not None for a in agents):
                    finished_at = finished_at or time.monotonic()
                    if all(a.exit_code == 0 for a in agents) or time.monotonic() - finished_at > 6.0:
                        break  # clean finish, or a failure the engine had time to see
                time.sleep(self.config.poll_s)
        finally:
            stop_agents(agents)
            stop.set()
            thread.join(timeout=10)
            for collector in collectors:
                collector.tick()  # the last lines the agents wrote as they stopped
            self.sink.flush()
        return incident

    def close(self) -> None:
        self.sink.close()
        self.deliverer.close()
        self.follower.close()


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
            "seconds": round(((record.ended or record.started) - record.started).total_seconds(), 1),
        })
    return rows


def write_summary(result: RunResult, path: Path) -> None:
    path.write_text(json.dumps({"outcome": result.outcome.value, "job_id": result.job_id,
                                "excluded": result.excluded, "attempts": summary_rows(result)}, indent=1,
                               default=str))
