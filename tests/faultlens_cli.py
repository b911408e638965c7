"""The `faultlens` command line as the tests run it: one argument list for `faultlens run` and the
store read-backs the run tests share (decisions, job state, last steps).

    proc, seconds = faultlens_run(tmp_path, "job", [str(SCRIPT), "--steps", "12"])
    proc = subprocess.run(run_command(tmp_path, nnodes=1, nproc=2, command=["train.py"]), ...)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from faultlens.attribution.reading.store import Store
from tests.conftest import REPO_ROOT


def cli(*args: str) -> list[str]:
    """The argument list of `faultlens ARGS...` run by this interpreter."""
    return [sys.executable, "-m", "faultlens.controller.cli.main", *args]


def cli_env(columns: int = 200, job_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a `faultlens` subprocess: this one, the job's own (job_env), the repo on
    PYTHONPATH and a console `columns` wide."""
    return {**os.environ, **(job_env or {}), "PYTHONPATH": str(REPO_ROOT), "COLUMNS": str(columns)}


def run_command(
    tmp_path: Path,
    *,
    nnodes: int,
    nproc: int,
    command: Sequence[str],
    job: str | None = None,
    spares: int | None = None,
    options: Sequence[str] = (),
) -> list[str]:
    """`faultlens run` of `command` with its store and workdir under tmp_path (options: more of
    run's own options; job and spares only when given)."""
    args = [
        "run",
        "--store",
        str(tmp_path / "store"),
        "--workdir",
        str(tmp_path / "work"),
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
    ]
    if spares is not None:
        args += ["--spares", str(spares)]
    if job is not None:
        args += ["--job", job]
    return cli(*args, *options, "--", *command)


def faultlens_run(
    tmp_path: Path,
    job: str,
    command: list[str],
    nnodes: int = 2,
    nproc: int = 2,
    spares: int = 0,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess, float]:
    """`faultlens run` of `command` in tmp_path (env: the job's own), and its wall seconds."""
    started = time.monotonic()
    proc = subprocess.run(
        run_command(
            tmp_path, nnodes=nnodes, nproc=nproc, command=command, job=job, spares=spares,
            options=options,
        ),
        cwd=tmp_path,
        env=cli_env(job_env=env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, time.monotonic() - started


def decisions(store_dir: Path, job: str) -> list[dict]:
    """Each decision of the job once, its latest delivery status."""
    with Store(store_dir) as store:
        return store.query(
            "SELECT decision_id, arg_max(action, ts) AS action, arg_max(exclude_nodes, ts) AS "
            "exclude_nodes, arg_max(delivery_status, ts) AS status, min(attempt) AS attempt, "
            "arg_max(restore_step, ts) AS restore_step, min(ts) AS first "
            "FROM decisions WHERE job_id = ? GROUP BY decision_id ORDER BY first",
            [job],
        ).to_pylist()


def job_state(store_dir: Path, job: str) -> str:
    """What `faultlens jobs --json` says of the job."""
    proc = subprocess.run(
        cli("jobs", "--store", str(store_dir), "--json", "--no-ettr"),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {row["job_id"]: row["state"] for row in json.loads(proc.stdout)}[job]


def last_steps(store_dir: Path, job: str) -> dict[int, int]:
    """The last training step of each rank of the job."""
    with Store(store_dir) as store:
        rows = store.query(
            "SELECT rank, max(step) AS last FROM steps WHERE job_id = ? AND phase = 'train' "
            "GROUP BY rank",
            [job],
        ).to_pylist()
    return {r["rank"]: r["last"] for r in rows}
