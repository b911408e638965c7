"""The restore point a failover chose for a Slurm job, kept beside the hook's state: written by
the Slurm hook before it requeues the job, read by the launcher into the training environment
(FAULTLENS_RESTORE_TIER / _STEP / _URI)."""

from __future__ import annotations

import json
from pathlib import Path

from faultlens import environment


def restore_path(state_dir: str | Path, job: str) -> Path:
    """Where the failover's restore point for faultlens job `job` is kept."""
    return Path(state_dir) / "restore" / f"{job}.json"


def read_restore(state_dir: str | Path, job: str) -> dict[str, str]:
    """The restore point as environment variables (empty when there is none)."""
    try:
        data = json.loads(restore_path(state_dir, job).read_text())
    except (OSError, ValueError):
        return {}
    env = {
        environment.RESTORE_TIER.name: data.get("tier"),
        environment.RESTORE_STEP.name: data.get("step"),
        environment.RESTORE_URI.name: data.get("uri"),
        environment.RESTORE_DECISION.name: data.get("decision_id"),
    }
    return {key: str(value) for key, value in env.items() if value not in (None, "")}
