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
