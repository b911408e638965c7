"""What the supervisor is given and what it returns: the run's configuration (RunConfig), the fault
injected into an attempt (AttemptFault), each attempt's record (AttemptRecord), the run's result
(RunResult, Outcome) and its JSON summary (summary_rows, write_summary)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from faultlens.attribution.decision import Decision
from faultlens.attribution.incident import Incident
from faultlens.controller.supervisor.preflight import JobError


class Outcome(StrEnum):
    COMPLETED = "completed"
    ESCALATED = "escalated"
    NO_CAPACITY = "no_capacity"
    GAVE_UP = "gave_up"
    # the job could not start: its script is missing or broken, or every node failed the same way
    # before any step (no node to blame)
    JOB_ERROR = "job_error"
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
    # after a hang naming no stuck rank: time for a job only tearing down to end itself
    hang_grace_s: float = 15.0
    # a slowdown's failover waits at most this for the next checkpoint boundary
    checkpoint_wait_s: float = 120.0
    # after every agent exited with a failure: time for the engine to attribute it
    finish_wait_s: float = 6.0
    # a crash before any step waits at most this for every node's start to be known (the same
    # error on every node is a job error)
    start_hold_s: float = 10.0
    # the job's declared length (FAULTLENS_TOTAL_STEPS for the step timer)
    total_steps: int | None = None
    # the remaining run time the slowdown policy assumes for a job that declares no length (None:
    # the policy file's)
    assumed_remaining_s: float | None = None


@dataclass(frozen=True)
class AttemptFault:
    """What the caller injects into one attempt: env for the ranks, and which node's GPU fails with
    it.
    """

    env: dict[str, str] = field(default_factory=dict)
    gpu_node: str | None = None  # the node whose simulated GPU fails with the fault
    gpu_local_rank: int = 0
    # "lost" (Xid 79) or "hot" (thermal slowdown); fires on <workdir>/gpu_<fault>-<node>
    gpu_fault: str | None = None
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
    # decisions delivered while the job kept running
    notices: list[Decision] = field(default_factory=list)
    completed: bool = False
    # the job's own error when it could not start (no node to blame)
    job_error: JobError | None = None


@dataclass
class RunResult:
    outcome: Outcome
    job_id: str
    attempts: list[AttemptRecord]
    excluded: list[str]
    store: str
    # the job's own error (outcome job_error): its script, or the same error on every node at start
    job_error: JobError | None = None


Events = Callable[[str], None]


def summary_rows(result: RunResult) -> list[dict[str, object]]:
    rows = []
    for record in result.attempts:
        incident, decision = record.incident, record.decision
        rows.append(
            {
                "attempt": record.attempt,
                "nodes": ",".join(record.nodes),
                "fault": record.fault,
                "resumed": "-"
                if record.restored_step is None
                else f"step {record.restored_step} ({record.restored_tier})",
                "last_step": record.last_step,
                "incident": "-"
                if incident is None
                else f"{incident.incident_class.value}/{incident.cause.value}",
                "culprit": "-"
                if incident is None
                else (
                    f"{','.join(incident.culprit_nodes)} "
                    f"r{','.join(map(str, incident.culprit_ranks))}"
                ),
                "decision": "-" if decision is None else decision.action.value,
                "excluded": "-" if decision is None else ",".join(decision.exclude_nodes) or "-",
                "kept_running": ",".join(
                    f"{d.action.value}:{d.incident_class.value}" for d in record.notices
                )
                or "-",
                "seconds": round(
                    ((record.ended or record.started) - record.started).total_seconds(), 1
                ),
            }
        )
    return rows


def write_summary(result: RunResult, path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "outcome": result.outcome.value,
                "job_id": result.job_id,
                "job_error": None if result.job_error is None else result.job_error.error,
                "excluded": result.excluded,
                "attempts": summary_rows(result),
            },
            indent=1,
            default=str,
        )
    )
