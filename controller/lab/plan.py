"""The injection plan one scenario hands to its processes (a JSON file named by FAULTLENS_LAB_PLAN),
and the files the injected processes and the campaign runner share under FAULTLENS_LAB_DIR:

    pids/a<attempt>-<node>-r<rank>.json
        every training process at start: pid, its agent's pid, node, rank
    triggers/<fault>-a<attempt>.json
        a rank reached the step of an external fault: the runner acts on it
    gpu/<node>.fire
        a node's recorded GPU timeline jumps to its fault (supervisor side)
    injections.jsonl
        one line per injected fault: what, where, at which step, wall clock
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from faultlens import environment
from faultlens.collectors.store.atomic import atomic_write

ENV_PLAN = environment.LAB_PLAN.name
ENV_DIR = environment.LAB_DIR.name

# fault kinds carried out inside the training process (controller/lab/inject.py)
WORKER_KINDS = frozenset(
    {
        "exception",
        "signal",
        "abort",
        "stuck",
        "gil_hog",
        "oom",
        "gpu",
        "slow",
        "nan",
        "skip_collective",
        "slow_checkpoint",
        "loss_spike",
        "bitflip",
    }
)
# fault kinds carried out by the runner when a rank reaches the step (controller/lab/actions.py)
EXTERNAL_KINDS = frozenset({"external_signal", "node_loss", "agent_loss"})
# not tied to a step: started beside the job by the runner
AMBIENT_KINDS = frozenset({"cpu_hog"})
FAULT_KINDS = WORKER_KINDS | EXTERNAL_KINDS | AMBIENT_KINDS


@dataclass(frozen=True)
class FaultSpec:
    """One fault: what, where (global rank, node name, node position in the attempt, local rank or
    pipeline stage; none of them: every rank), at which step, in which attempts (None: every
    attempt)."""

    id: str
    kind: str
    step: int = 0
    rank: int | None = None
    node: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    stage: int | None = None
    attempts: tuple[int, ...] | None = (0,)
    until_step: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def applies_to_attempt(self, attempt: int) -> bool:
        return self.attempts is None or attempt in self.attempts

    def targets(self, *, rank: int, node: str | None, node_rank: int | None, local_rank: int,
                stage: int | None) -> bool:
        if self.rank is not None and rank != self.rank:
            return False
        if self.node is not None and node != self.node:
            return False
        if self.node_rank is not None and node_rank != self.node_rank:
            return False
        if self.local_rank is not None and local_rank != self.local_rank:
            return False
        return not (self.stage is not None and stage != self.stage)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["attempts"] = None if self.attempts is None else list(self.attempts)
        doc["params"] = dict(self.params)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FaultSpec:
        attempts = doc.get("attempts", [0])
        return cls(
            id=str(doc["id"]),
            kind=str(doc["kind"]),
            step=int(doc.get("step", 0)),
            rank=doc.get("rank"),
            node=doc.get("node"),
            node_rank=doc.get("node_rank"),
            local_rank=doc.get("local_rank"),
            stage=doc.get("stage"),
            attempts=None if attempts is None else tuple(int(a) for a in attempts),
            until_step=doc.get("until_step"),
            params=dict(doc.get("params") or {}),
        )


@dataclass(frozen=True)
class InjectionPlan:
    faults: tuple[FaultSpec, ...]
    gpu_timelines: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    nproc_per_node: int = 1

    def to_json(self) -> str:
        return json.dumps(
            {
                "faults": [f.to_dict() for f in self.faults],
                "gpu_timelines": dict(self.gpu_timelines),
                "nproc_per_node": self.nproc_per_node,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> InjectionPlan:
        doc = json.loads(text)
        return cls(
            faults=tuple(FaultSpec.from_dict(f) for f in doc.get("faults") or ()),
            gpu_timelines=dict(doc.get("gpu_timelines") or {}),
            nproc_per_node=int(doc.get("nproc_per_node", 1)),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InjectionPlan | None:
        path = environment.LAB_PLAN.get(environ)
        if not path:
            return None
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Atomically (rename) write a small JSON file."""
    atomic_write(path, json.dumps(doc), fsync=False)


def log_injection(
    lab_dir: Path,
    fault: FaultSpec,
    *,
    attempt: int | None,
    node: str | None,
    rank: int | None,
    step: int | None,
    by: str,
    detail: str = "",
    ts: float | None = None,
) -> None:
    """Append one line to injections.jsonl, flushed to disk before the fault is carried out."""
    line = json.dumps(
        {
            "fault": fault.id,
            "kind": fault.kind,
            "attempt": attempt,
            "node": node,
            "rank": rank,
            "step": step,
            "ts": time.time() if ts is None else ts,
            "by": by,
            "detail": detail,
        }
    )
    path = lab_dir / "injections.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_injections(lab_dir: Path) -> list[dict[str, Any]]:
    path = lab_dir / "injections.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    return rows
