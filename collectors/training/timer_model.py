"""What a step timer's rows are made of: the step phases, who the rank is (RankIdentity, from
torchrun's environment), its place in the parallel layout, the timer's counts (TimerStats) and the
sink protocol it writes through. Imported by the training process: nothing beyond the standard
library and faultlens.environment."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from faultlens import environment

Clock = Callable[[], int]


class Phase(StrEnum):
    TRAIN = "train"
    EVAL = "eval"
    WARMUP = "warmup"
    CHECKPOINT = "checkpoint"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, value: str | Phase) -> Phase:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class RowSink(Protocol):
    """What the timer writes through: faultlens.collectors.store.sink.SegmentSink, or any object
    with these methods.
    """

    def write(self, table: str, data: Any) -> None: ...

    def flush(self, table: str | None = None) -> Any: ...

    def pending_rows(self, table: str | None = None) -> int: ...


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None


@dataclass(frozen=True)
class RankIdentity:
    """Who this training process is, as torchrun's environment tells it."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node: str | None = None
    hostname: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    cluster: str | None = None
    pid: int | None = None
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RankIdentity:
        """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID (or
        FAULTLENS_JOB_ID), FAULTLENS_ATTEMPT (a supervisor that restarts torchrun itself) or
        TORCHELASTIC_RESTART_COUNT, node from FAULTLENS_NODE or the hostname, FAULTLENS_CLUSTER."""
        env = os.environ if environ is None else environ
        hostname = socket.gethostname()
        values: dict[str, Any] = {
            "rank": _env_int(env, "RANK"),
            "local_rank": _env_int(env, "LOCAL_RANK"),
            "world_size": _env_int(env, "WORLD_SIZE"),
            "local_world_size": _env_int(env, "LOCAL_WORLD_SIZE"),
            "node": environment.NODE.get(env) or hostname,
            "hostname": hostname,
            "job_id": environment.JOB_ID.get(env) or env.get("TORCHELASTIC_RUN_ID") or None,
            "attempt": _env_int(env, environment.ATTEMPT.name)
            if environment.ATTEMPT.get(env)
            else _env_int(env, "TORCHELASTIC_RESTART_COUNT"),
            "cluster": environment.CLUSTER.get(env),
            "pid": os.getpid(),
        }
        values.update(overrides)
        return cls(**values)

    def columns(self) -> dict[str, Any]:
        """The identity columns every row carries."""
        return {
            "cluster": self.cluster,
            "node": self.node,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "gpu_index": self.gpu_index,
            "gpu_uuid": self.gpu_uuid,
            "pci_bus_id": self.pci_bus_id,
        }


@dataclass(frozen=True)
class ParallelCoords:
    """This rank's place in the parallel layout, when the training code declares it (straggler
    analysis uses it to tell one slow worker from a slow pipeline stage)."""

    dp_rank: int | None = None
    pp_rank: int | None = None
    tp_rank: int | None = None
    cp_rank: int | None = None
    ep_rank: int | None = None
    pp_size: int | None = None


@dataclass
class TimerStats:
    """What the timer did. Every completed step is written or counted: once close() has returned,
    steps == rows_written + dropped; dropped is the sum of the dropped_* counts and lost_at_close.
    """

    steps: int = 0
    rows_written: int = 0
    dropped: int = 0
    write_failures: int = 0
    errors: int = 0
    sections_outside_step: int = 0
    unknown_phases: int = 0
    heartbeat_failures: int = 0
    last_error: str | None = None
    # the oldest queued rows pushed out by new ones while the store was slow
    dropped_queue_full: int = 0
    dropped_refused: int = 0  # rows the sink refused (never buffered)
    dropped_no_store: int = 0  # rows of a timer without a store
    # rows still queued or in the sink's buffer when close() gave up (store slow or failing)
    lost_at_close: int = 0
    ranks_dropped: int = 0  # ranks rows (one per start) not written
