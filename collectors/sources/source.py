"""The Source protocol every node-side signal source implements, and the identity rows carry.

A source is a small class whose system boundary (NVML backend, /dev/kmsg path, dump directory,
clock) is passed to its constructor. `poll()` returns what it saw since the last call as record
batches keyed by table name; it never raises (collectors log, count and go on); `close()` releases
what it holds.

`faultlens collect` builds its sources by name through the source registry (registry.py), each from
a SourceInputs that carries this identity; the built-in ones are registered in builtin.py.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa

from faultlens import environment


@runtime_checkable
class Source(Protocol):
    name: str

    def poll(self) -> Mapping[str, pa.RecordBatch]:
        """Rows observed since the last poll, by table name (may be empty)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class NodeIdentity:
    """Who is reporting: written into the identity columns of every row a source emits."""

    node: str
    cluster: str | None = None
    job_id: str | None = None
    attempt: int | None = None

    @classmethod
    def from_env(cls, node: str | None = None) -> NodeIdentity:
        """Node name from FAULTLENS_NODE or the hostname; job and attempt from torchrun's
        environment.
        """
        attempt = environment.ATTEMPT.get() or os.environ.get("TORCHELASTIC_RESTART_COUNT")
        return cls(
            node=node or environment.NODE.get() or socket.gethostname(),
            cluster=environment.CLUSTER.raw(),
            job_id=environment.JOB_ID.get() or os.environ.get("TORCHELASTIC_RUN_ID"),
            attempt=int(attempt) if attempt and attempt.isdigit() else None,
        )

    def columns(self) -> dict[str, object]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "job_id": self.job_id,
            "attempt": self.attempt,
        }
