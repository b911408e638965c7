"""Real torch jobs for the numerics tests: the campaign's DDP script (controller/lab/jobs/
ddp_train.py, gloo on the CPU, deterministic seeds) with its in-job numerics signals on, `world`
ranks started as torchrun starts them (one process per rank, one rank per node: node-<rank>, or the
nodes given), faults through the campaign's injector (sitecustomize), a restore plan handed over as
the supervisor hands it (FAULTLENS_RESTORE_PLAN)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from faultlens import environment
from faultlens.controller.checkpoints.catalog import CheckpointCatalog
from faultlens.controller.checkpoints.tiers import Tier, TierKind
from faultlens.controller.lab.plan import FaultSpec, InjectionPlan
from faultlens.controller.lab.runner import SITE_DIR
from faultlens.controller.lab.scenarios import REPO_ROOT

SCRIPT = REPO_ROOT / "controller" / "lab" / "jobs" / "ddp_train.py"
STEPS = 24
EVERY = 4  # digest, local and durable checkpoint every 4 steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(
    root: Path,
    job: str,
    world: int,
    faults: Sequence[FaultSpec] = (),
    *,
    attempt: int = 0,
    nodes: Sequence[str] | None = None,
    plan: Path | None = None,
    steps: int = STEPS,
    seed: int = 0,
    batch: int = 32,
    args: Sequence[str] = (),
    timeout_s: float = 900,
) -> Path:
    """Run one attempt of the job under `root` (store, checkpoints, lab dir); returns root."""
    lab = root / "lab"
    lab.mkdir(parents=True, exist_ok=True)
    plan_file = lab / f"plan-{attempt}.json"
    plan_file.write_text(InjectionPlan(tuple(faults), {}, 1).to_json())
    nodes = list(nodes) if nodes is not None else [f"node-{r}" for r in range(world)]
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAULTLENS_")}
        env.update(
            PYTHONPATH=f"{SITE_DIR}{os.pathsep}{REPO_ROOT}",
            RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE="1",
            GROUP_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            FAULTLENS_STORE=str(root / "store"),
            FAULTLENS_JOB_ID=job,
            FAULTLENS_ATTEMPT=str(attempt),
            FAULTLENS_NODE=nodes[rank],
            FAULTLENS_CKPT_LOCAL=str(root / f"ckpt-{nodes[rank]}"),
            FAULTLENS_CKPT_DURABLE=str(root / "durable"),
            FAULTLENS_HEARTBEAT_DIR="",
            FAULTLENS_LAB_DIR=str(lab),
            FAULTLENS_LAB_PLAN=str(plan_file),
        )
        if plan is not None:
            env[environment.RESTORE_PLAN.name] = str(plan)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(SCRIPT),
                    "--steps",
                    str(steps),
                    "--compute-s",
                    "0",
                    "--ckpt-every",
                    str(EVERY),
                    "--durable-every",
                    str(EVERY),
                    "--flush-s",
                    "0.5",
                    "--numerics-every",
                    str(EVERY),
                    "--seed",
                    str(seed),
                    "--batch",
                    str(batch),
                    *args,
                ],
                env=env,
                cwd=root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, err[-3000:]
    return root


def injected(root: Path) -> list[dict]:
    path = root / "lab" / "injections.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def catalog(root: Path, job: str, nodes: Sequence[str]) -> CheckpointCatalog:
    tiers = [Tier(TierKind.LOCAL, str(root / f"ckpt-{n}"), node=n) for n in nodes]
    return CheckpointCatalog([*tiers, Tier(TierKind.DURABLE, str(root / "durable"))], job_id=job)
