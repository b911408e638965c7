"""Shared fixtures. Real artifacts live under tests/data/; torch-made artifacts are produced per
session.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import NamedTuple

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(__file__).resolve().parent / "data"


#: the repository's packages that the tests' subprocesses import (the CLI, workers, supervisors)
COMPILED_DIRS = ("faultlens", "collectors", "attribution", "controller", "tests")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Where Python writes no bytecode ($PYTHONDONTWRITEBYTECODE, -B), compile the repository's
    modules once: every `faultlens` subprocess of the session (CLI runs, supervisors, training
    workers) would otherwise compile them from source again (~0.3 CPU-s per CLI process). Python
    still reads the cached bytecode, and checks it against each source's size and mtime."""
    import compileall
    import sys

    if sys.flags.dont_write_bytecode:
        for name in COMPILED_DIRS:
            compileall.compile_dir(REPO_ROOT / name, quiet=2)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def utc_now() -> dt.datetime:
    return dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="session")
def torch_artifacts() -> dict[str, Path]:
    """Artifacts written by real torchrun jobs (torch, gloo, 4 ranks) for the scenarios of interface
    6: 'hang', 'mismatch', 'subgroup_hang', 'crash_exception', 'crash_sigkill', 'straggler' -> their
    directory (dumps/, logdir/, torchrun_stderr.txt, store/, meta.json; see
    tests/torch_jobs/harness.py). Generated once per cache key (a hash of the harness, the scripts
    and collectors it runs, and the torch version) under a file lock, so pytest-xdist workers share
    it; every use checks each scenario's outcome again and regenerates the ones that are not the
    expected one; $FAULTLENS_TORCH_ARTIFACTS moves the cache (default:
    $TMPDIR/faultlens-torch-artifacts-<uid>)."""
    pytest.importorskip("torch")
    from tests.torch_jobs.harness import cached_artifacts

    return cached_artifacts()


class DemoRun(NamedTuple):
    store: Path
    workdir: Path
    output: str


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One real `faultlens demo` run (torch DDP over gloo, five injected faults, ~80-110 s on 2
    cores) per test
    session: its store, its workdir and its console output. Under pytest-xdist the workers share one
    run (the first to take the lock makes it, the others wait and reuse it); a failed run fails
    every user with its output."""
    pytest.importorskip("torch")
    import fcntl
    import os
    import subprocess
    import sys

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "faultlens-demo"
    with open(shared / "faultlens-demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done, failed = root / "output.txt", root / "failed.txt"
        if not done.exists() and not failed.exists():
            root.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "80"}  # as in a log file
            try:
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "faultlens.controller.cli.main",
                        "demo",
                        "--store",
                        str(root / "store"),
                        "--workdir",
                        str(root / "work"),
                    ],
                    cwd=root,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                text, ok = proc.stdout[-6000:] + proc.stderr[-6000:], proc.returncode == 0
                (done if ok else failed).write_text(proc.stdout if ok else text)
            except subprocess.TimeoutExpired as exc:
                failed.write_text(f"the demo ran past 900 s: {exc}")
    if failed.exists():
        pytest.fail("faultlens demo failed:\n" + failed.read_text())
    return DemoRun(root / "store", root / "work", done.read_text())


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster for the session (tests/slurm_cluster.py: munge, slurmctld, 4 slurmd,
    an Alertmanager); skipped, with the reason, where the packages or root are missing; a cluster
    that should start and does not fails the tests that need it."""
    import shutil
    import tempfile

    from tests.slurm_cluster import ClusterUnavailable, missing_reason, start_cluster

    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    # its own directory, not pytest's rotating base directory (another session may prune that)
    directory = Path(tempfile.mkdtemp(prefix="faultlens-slurm-"))
    try:
        cluster = start_cluster(directory)
    except ClusterUnavailable as exc:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(str(exc))
    yield cluster
    cluster.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster):
    """The session's Slurm cluster with no job and every node idle."""
    slurm_cluster.reset()
    return slurm_cluster
