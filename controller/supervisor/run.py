"""The reference supervisor: `faultlens run --nnodes N --nproc-per-node P [--spares S] -- train.py
ARGS`.

It runs a torchrun job as N simulated nodes on loopback (one torchrun agent each, own node name, own
local checkpoint tier), with the node-side collectors (process source over each agent's stderr and
--log-dir, a recorded NVML backend per node), the attribution engine following the store, and the
decision policy. On a failover decision it stops the attempt, excludes the culprit node(s) (taking
spares), writes the restore plan and starts the next attempt from it; on escalate it stops and
prints the decision for a human. A collective hang is confirmed by requesting flight-recorder dumps
from every rank (the trigger file the ranks poll) and analysing them.

What an action means here (docs/design.md "What an action means"):
- a notify, and any decision on a slowdown (straggler, workload imbalance) that is not a failover,
  is delivered and the job keeps running: a running job is never stopped for a slowdown;
- a failover of a slowdown waits (bounded) for the next checkpoint boundary: a complete checkpoint
  newer than the one there was at decision time, which survives the exclusion; then the attempt
  stops and restarts from it;
- a failover the supervisor carried out is marked applied (never delivered again by `faultlens
  deliver`);
- a job whose agents all exited 0 has ended: an incident raised while it tore down (a hang of a job
  that had finished) is not acted on; after a hang incident that names no stuck rank the job gets a
  short grace to end by itself first.

What the supervisor sees and does is telemetry (process_events, source supervisor): each node's
launch (start), each torchrun agent's exit (agent_exit), and every signal it sends, written before
it sends it (signal_sent). An agent that dies (node or agent loss) leaves its workers in their own
sessions: the supervisor kills them.

Here: the Supervisor (nodes, attempts, hang confirmation, failover); watching one attempt is
watch.py (AttemptWatcher, given a WatchInputs), the configuration, records and summary are
records.py; which decision keeps the job running or waits for a checkpoint boundary is the policy's
(attribution/policy/running.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

from faultlens import environment
from faultlens.attribution.decision import Action, Decision
from faultlens.attribution.detectors.hang import attach_stacks
from faultlens.attribution.detectors.progress import HangSuspect
from faultlens.attribution.engine import Engine
from faultlens.attribution.follow import Follower
from faultlens.attribution.incident import Incident
from faultlens.attribution.policy import DecisionPolicy, StoreHistory, load_policy
from faultlens.attribution.reading.store import Store
from faultlens.attribution.rules import load_thresholds
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.agent import NodeAgent as CollectorAgent
from faultlens.collectors.sources.nvml_source import NvmlSource
from faultlens.collectors.sources.process_events import ProcessSource
from faultlens.collectors.sources.pystack import capture_dump_dir_stacks
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.sink import SegmentSink
from faultlens.collectors.training.heartbeat import HeartbeatSource
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiers import Tier, TierKind
from faultlens.controller.delivery import Deliverer
from faultlens.controller.hooks.base import Hook
from faultlens.controller.restore import plan_restore, write_plan
from faultlens.controller.supervisor.agents import LaunchSpec, TorchrunAgent, free_port, start_agent
from faultlens.controller.supervisor.gpus import FaultClock, recorded_backend
from faultlens.controller.supervisor.preflight import JobError, check_command
from faultlens.controller.supervisor.processes import EventRecorder
from faultlens.controller.supervisor.records import (
    AttemptFault,
    AttemptRecord,
    Events,
    Outcome,
    RunConfig,
    RunResult,
    summary_rows,
    write_summary,
)
from faultlens.controller.supervisor.watch import URGENT_TABLES, AttemptWatcher, WatchInputs

__all__ = [
    "AttemptFault",
    "AttemptRecord",
    "Events",
    "Outcome",
    "RunConfig",
    "RunResult",
    "Supervisor",
    "summary_rows",
    "write_summary",
]

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self,
        config: RunConfig,
        *,
        hooks: Sequence[Hook] = (),
        faults: Callable[[int, Sequence[str], int], AttemptFault] | None = None,
        on_event: Events | None = None,
    ) -> None:
        self.config = config
        self.faults = faults or (lambda attempt, nodes, start_step: AttemptFault())
        self.say = on_event or (lambda text: log.info("%s", text))
        self.workdir = Path(config.workdir).resolve()
        self.pool = [f"{config.node_prefix}{i}" for i in range(config.nnodes + config.spares)]
        self.excluded: list[str] = []
        # a death or a GPU event lands at once (a decision waits on it); steps and samples every 0.5
        # s
        self.sink = SegmentSink(
            config.store, flush_rows=10_000, flush_age_s=0.5, write_through=URGENT_TABLES
        )
        thresholds = load_thresholds(config.thresholds_path) if config.thresholds_path else None
        self._current_dump_dir: Path | None = None
        self._current_trigger: Path | None = None
        self.current_attempt = 0
        self.engine = Engine(thresholds=thresholds, dump_requester=self._request_dumps)
        self.follower = Follower(config.store, job=config.job_id, engine=self.engine)
        self.catalog = CheckpointCatalog(self._tiers(), job_id=config.job_id)
        policy_config = load_policy(config.policy_path) if config.policy_path else None
        if config.assumed_remaining_s is not None:
            policy_config = policy_config or load_policy()
            policy_config = dataclasses.replace(
                policy_config,
                straggler=dataclasses.replace(
                    policy_config.straggler, remaining_s=float(config.assumed_remaining_s)
                ),
            )
        self.policy = DecisionPolicy(
            policy_config, history=StoreHistory(Store(config.store)), restore_chooser=self.catalog
        )
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
        tiers = [
            Tier(TierKind.LOCAL, str(self.node_dir(node) / "ckpt"), node=node) for node in self.pool
        ]
        return [*tiers, Tier(TierKind.DURABLE, str(self.durable_dir()))]

    # ------------------------------------------------------------------ hang confirmation

    def _request_dumps(self, suspect: HangSuspect) -> pa.Table | None:
        """Ask every rank of the current attempt for its flight-recorder dump, wait for them, store
        them.
        """
        if self._current_trigger is None or self._current_dump_dir is None:
            return None
        if suspect.attempt is not None and suspect.attempt != self.current_attempt:
            return None
        self.say(
            f"progress stopped ({suspect.detected_by}); requesting flight-recorder dumps from "
            "every rank"
        )
        self._current_trigger.write_text(str(time.time()))
        world = self.config.nnodes * self.config.nproc_per_node
        deadline = time.monotonic() + self.config.dump_wait_s
        while time.monotonic() < deadline:
            if len(list(self._current_dump_dir.glob("rank_*.pkl"))) >= world:
                break
            time.sleep(0.1)
        time.sleep(0.2)  # let a rank finishing its rename land
        try:
            dumps = read_dump_dir(
                self._current_dump_dir,
                identity=NodeIdentity(
                    node=None, job_id=self.config.job_id, attempt=self.current_attempt
                ),
            )
        except Exception as exc:  # the analysis goes on with what the store has
            self.say(f"cannot read the dumps: {exc}")
            return None
        table = dumps.table
        if table is not None and table.num_rows:
            self.sink.write("collectives", table)
            self.sink.flush("collectives")
            # where each rank is while the hang is live (py-spy, when installed): names a stuck
            # rank's frame
            table = attach_stacks(table, capture_dump_dir_stacks(self._current_dump_dir))
        return table

    # ------------------------------------------------------------------ one attempt

    def _choose_nodes(self) -> list[str] | None:
        healthy = [n for n in self.pool if n not in self.excluded]
        if len(healthy) < self.config.nnodes:
            return None
        return healthy[: self.config.nnodes]

    def _start_attempt(
        self, attempt: int, nodes: Sequence[str], plan_path: Path | None, fault: AttemptFault
    ) -> tuple[list[TorchrunAgent], list[CollectorAgent], Path]:
        attempt_dir = self.workdir / f"attempt-{attempt}"
        if attempt_dir.exists():
            shutil.rmtree(attempt_dir)
        (attempt_dir / "dumps").mkdir(parents=True)
        self._current_dump_dir = attempt_dir / "dumps"
        self._current_trigger = attempt_dir / "fr.trigger"
        self.current_attempt = attempt
        spec = LaunchSpec(
            script=tuple(self.config.script),
            nnodes=self.config.nnodes,
            nproc_per_node=self.config.nproc_per_node,
            master_port=free_port(),
            workdir=attempt_dir,
            env={
                "FAULTLENS_STORE": str(self.config.store),
                "FAULTLENS_JOB_ID": self.config.job_id,
                "FAULTLENS_ATTEMPT": str(attempt),
                "FAULTLENS_FR_DIR": str(attempt_dir / "dumps"),
                "FAULTLENS_FR_TRIGGER": str(self._current_trigger),
                "FAULTLENS_FR_STACK_TRACES": "0",
                "FAULTLENS_CKPT_DURABLE": str(self.durable_dir()),
                "FAULTLENS_DEMO_DIR": str(attempt_dir),
                **({"FAULTLENS_RESTORE_PLAN": str(plan_path)} if plan_path else {}),
                **(
                    {environment.TOTAL_STEPS.name: str(self.config.total_steps)}
                    if self.config.total_steps
                    else {}
                ),
                **fault.env,
            },
        )
        agents = []
        collectors = []
        for node_rank, node in enumerate(nodes):
            ckpt = self.node_dir(node) / "ckpt"
            ckpt.mkdir(parents=True, exist_ok=True)
            # the node's step timers' progress records
            heartbeats = attempt_dir / "heartbeats" / node
            agent = start_agent(
                spec,
                node,
                node_rank,
                {"FAULTLENS_CKPT_LOCAL": str(ckpt), "FAULTLENS_HEARTBEAT_DIR": str(heartbeats)},
                attempt=attempt,
            )
            agents.append(agent)
            identity = NodeIdentity(node=node, job_id=self.config.job_id, attempt=attempt)
            clock = FaultClock()
            faulty = fault.gpu_node == node and fault.gpu_fault is not None
            self.gpu_clocks[node] = clock
            self.gpu_markers[node] = (
                attempt_dir / f"gpu_{fault.gpu_fault}-{node}" if faulty else None
            )
            backend = recorded_backend(
                self.pool.index(node),
                self.config.nproc_per_node,
                clock,
                fault.gpu_local_rank if faulty else None,
                fault.gpu_fault if faulty else None,
            )
            process_source = ProcessSource(identity, paths=[agent.stderr_path, agent.log_dir])
            # the launch itself is telemetry: goodput counts an attempt's start-up from this row
            process_source.record_start(
                rank=None, local_rank=None, pid=agent.process.pid, attempt=attempt
            )
            sources = [
                process_source,
                HeartbeatSource(heartbeats, identity, min_interval_s=0.0, keepalive_s=0.5),
                NvmlSource(backend, NodeIdentity(node=node)),
            ]
            collectors.append(CollectorAgent(sources, self.sink, interval_s=self.config.poll_s))
        return agents, collectors, attempt_dir

    def fire_gpu_faults(self) -> None:
        for node, clock in self.gpu_clocks.items():
            marker = self.gpu_markers.get(node)
            if marker is not None and not clock.fired and marker.exists():
                clock.fire()
                self.say(
                    f"{node}: "
                    + (
                        "the driver reports Xid 79 (GPU has fallen off the bus)"
                        if marker.name.startswith("gpu_lost")
                        else "a GPU reports HW thermal slowdown (93 C, SM clock 1095 MHz)"
                    )
                )

    def _progress(self) -> int | None:
        frame = self.follower.tail.frame("steps")
        if frame is None or frame.empty:
            return None
        rows = frame[
            (frame["job_id"] == self.config.job_id) & (frame["attempt"] == self.current_attempt)
        ]
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
        error = check_command(self.config.script)
        if error is not None:  # nothing launched: the script's own problem, no node involved
            self._say_job_error(error, "the training script cannot run")
            return RunResult(
                Outcome.JOB_ERROR,
                self.config.job_id,
                attempts,
                self.excluded,
                self.config.store,
                job_error=error,
            )
        plan_path: Path | None = None
        restored: tuple[int | None, str | None] = (None, None)
        world = self.config.nnodes * self.config.nproc_per_node
        for attempt in range(self.config.max_attempts):
            nodes = self._choose_nodes()
            if nodes is None:
                self.say("not enough healthy nodes left: a human must add capacity")
                return RunResult(
                    Outcome.NO_CAPACITY,
                    self.config.job_id,
                    attempts,
                    self.excluded,
                    self.config.store,
                )
            fault = self.faults(attempt, nodes, 0 if restored[0] is None else restored[0] + 1)
            record = AttemptRecord(
                attempt,
                tuple(nodes),
                dt.datetime.now(dt.UTC),
                restored_step=restored[0],
                restored_tier=restored[1],
                fault=fault.description,
            )
            attempts.append(record)
            where = (
                f"from step {restored[0]} ({restored[1]})"
                if restored[0] is not None
                else "from scratch"
            )
            self.say(
                f"attempt {attempt}: starting on {', '.join(nodes)} {where}"
                + (f"; injected: {fault.description}" if fault.description else "")
            )
            agents, collectors, attempt_dir = self._start_attempt(attempt, nodes, plan_path, fault)
            incident, decision = self._watch(agents, collectors, attempt_dir, record, nodes)
            record.ended = dt.datetime.now(dt.UTC)
            record.exit_codes = {a.node: a.exit_code for a in agents}
            record.last_step = self._progress()
            if record.completed:
                self.say(f"attempt {attempt}: training completed")
                return RunResult(
                    Outcome.COMPLETED,
                    self.config.job_id,
                    attempts,
                    self.excluded,
                    self.config.store,
                )
            record.incident, record.decision = incident, decision
            if record.job_error is not None:
                self._say_job_error(
                    record.job_error,
                    f"attempt {attempt}: every node failed the same way before any step",
                )
                return RunResult(
                    Outcome.JOB_ERROR,
                    self.config.job_id,
                    attempts,
                    self.excluded,
                    self.config.store,
                    job_error=record.job_error,
                )
            if incident is None or decision is None:
                self.say(
                    f"attempt {attempt}: ended without an attributed incident (exit codes "
                    f"{record.exit_codes}); giving up"
                )
                return RunResult(
                    Outcome.GAVE_UP, self.config.job_id, attempts, self.excluded, self.config.store
                )
            if decision.action not in (Action.FAILOVER, Action.RESTART):
                # what the human is called for (data: printed literally)
                for item in decision.evidence[:2]:
                    self.say(f"evidence ({item.table}): {item.text}")
                self.say(
                    "escalated to a human; the job is stopped (decision "
                    f"{decision.decision_id}; its JSON: "
                    f"faultlens decisions --store {self.config.store} --job "
                    f"{self.config.job_id} --json)"
                )
                return RunResult(
                    Outcome.ESCALATED,
                    self.config.job_id,
                    attempts,
                    self.excluded,
                    self.config.store,
                )
            for node in decision.exclude_nodes:
                if node not in self.excluded:
                    self.excluded.append(node)
            # their local tiers are gone for every later restore too
            self.catalog.retire(self.excluded)
            plan = plan_restore(decision, self.catalog, world_size=world)
            plan_path = self.workdir / f"restore-plan-{attempt + 1}.json"
            if plan is not None:
                write_plan(plan, plan_path)
                restored = (plan.step, plan.tier)
            else:
                plan_path, restored = None, (None, None)
            start = (
                f"from step {restored[0]} ({restored[1]})"
                if restored[0] is not None
                else "from scratch"
            )
            if decision.action is Action.RESTART:
                self.say(f"restart in place: the same nodes, nothing excluded, {start}")
                note = f"applied by the supervisor: restarted in place on the same nodes {start}"
            else:
                note = (
                    f"applied by the supervisor: excluded {', '.join(decision.exclude_nodes)}; "
                    f"restart {start}"
                )
            self.deliverer.mark_applied(decision, note=note)
        return RunResult(
            Outcome.GAVE_UP, self.config.job_id, attempts, self.excluded, self.config.store
        )

    def _say_job_error(self, error: JobError, what: str) -> None:
        """A job error, said: what, the script's own error, where, and its stderr's tail."""
        self.say(f"job error (no node to blame): {what}: {error.error}")
        if error.path is not None:
            self.say(f"in {error.path}")
        for line in error.stderr:
            self.say(f"  | {line}")

    # ------------------------------------------------------------------ watching one attempt

    def _watch(
        self,
        agents: list[TorchrunAgent],
        collectors: list[CollectorAgent],
        attempt_dir: Path,
        record: AttemptRecord,
        nodes: Sequence[str],
    ) -> tuple[Incident | None, Decision | None]:
        """Watch one attempt until it completes, or an incident's decision ends it (returned, not
        yet applied), or it fails with nothing attributed (controller/supervisor/watch.py)."""
        watcher = AttemptWatcher(self._watch_inputs())
        return watcher.watch(agents, collectors, attempt_dir, record, nodes)

    def _watch_inputs(self) -> WatchInputs:
        """What the watcher of the current attempt is given: nothing else of the supervisor."""
        return WatchInputs(
            config=self.config,
            say=self.say,
            follower=self.follower,
            policy=self.policy,
            deliverer=self.deliverer,
            recorder=self.recorder,
            catalog=self.catalog,
            sink=self.sink,
            excluded=self.excluded,
            current_attempt=self.current_attempt,
            fire_gpu_faults=self.fire_gpu_faults,
        )

    def close(self) -> None:
        self.sink.close()
        self.deliverer.close()
        self.follower.close()
