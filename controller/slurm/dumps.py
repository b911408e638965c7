"""Flight-recorder dumps of a Slurm job's ranks, asked for by `faultlens serve` when progress stops
(the hang detector's dump requester). `faultlens slurm node` gives every rank of an attempt one
trigger file and one dump directory under the job's work directory (shared by the nodes):

    <work_dir>/<job>/attempt-<N>/fr.trigger    the ranks' FlightRecorderTrigger polls it
    <work_dir>/<job>/attempt-<N>/dumps/        rank_<R>.pkl|json, written when it is touched

so the service, given the same work directory (`faultlens serve --fr-root`), touches the trigger
of the suspect's attempt, waits for the dumps and stores them (the collectives table) for the hang
analysis. A job with no such directory (not started by `faultlens slurm run`) gets no request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def attempt_dir(work_dir: str | Path, job_id: str, attempt: int) -> Path:
    """One attempt's directory of a job under the work directory (the node logs, the dumps)."""
    return Path(work_dir) / job_id / f"attempt-{attempt}"


def trigger_path(work_dir: str | Path, job_id: str, attempt: int) -> Path:
    return attempt_dir(work_dir, job_id, attempt) / "fr.trigger"


def dump_dir(work_dir: str | Path, job_id: str, attempt: int) -> Path:
    return attempt_dir(work_dir, job_id, attempt) / "dumps"


class SlurmDumpRequester:
    """A dump requester over every Slurm job of the store (attribution/detectors/progress)."""

    def __init__(self, store: str, work_dir: str | Path, *, wait_s: float = 10.0) -> None:
        self.store = store
        self.work_dir = Path(work_dir)
        self.wait_s = wait_s

    def __call__(self, suspect: Any) -> Any:
        job, attempt = suspect.job_id, suspect.attempt
        if not job or attempt is None or not attempt_dir(self.work_dir, job, attempt).is_dir():
            return None
        from faultlens.controller.cli.attribution_cmds import DumpRequester

        request = DumpRequester(
            self.store,
            dump_dir(self.work_dir, job, attempt),
            trigger=trigger_path(self.work_dir, job, attempt),
            wait_s=self.wait_s,
        )
        return request(suspect)
