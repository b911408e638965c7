"""Shared fixtures. Real artifacts live under tests/data/; torch-made artifacts are produced per session."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(__file__).resolve().parent / "data"


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
    """Artifacts written by real torchrun jobs (torch, gloo, 4 ranks) for the scenarios of interface 6: 'hang',
    'mismatch', 'subgroup_hang', 'crash_exception', 'crash_sigkill', 'straggler' -> their directory (dumps/,
    logdir/, torchrun_stderr.txt, store/, meta.json; see tests/torch_jobs/harness.py). Generated once per cache
    key (a hash of the scripts, collectors and torch version) under a file lock, so pytest-xdist workers share
    it; $FAULTLENS_TORCH_ARTIFACTS moves the cache (default: $TMPDIR/faultlens-torch-artifacts-<uid>)."""
    pytest.importorskip("torch")
    from tests.torch_jobs.harness import cached_artifacts

    return cached_artifacts()
