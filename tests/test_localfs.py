"""LocalFS lists a local store as fsspec's LocalFileSystem does (what the listing guard then
judges): files, FIFOs, dangling symlinks, symlinks to directories (entries, never descended),
directories named like segments, a symlink loop, a missing root, a root that is a symlink; and a
local path or file:// URL resolves to the root fsspec gives it, without importing fsspec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from faultlens.collectors.store.layout import _local_root, resolve_store
from faultlens.collectors.store.localfs import LocalFS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    base = tmp_path / "store"
    part = base / "steps" / "job=a" / "date=2026-11-30" / "node=n1"
    part.mkdir(parents=True)
    (part / "1-a.parquet").write_bytes(b"x")
    (part / ".tmp-2-b.parquet").write_bytes(b"")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "3-c.parquet").write_bytes(b"y")
    os.symlink(outside, part.parent / "node=n2")
    os.symlink(tmp_path / "nowhere.parquet", part / "4-d.parquet")
    os.mkfifo(part / "5-e.parquet")
    (part / "6-f.parquet").mkdir()
    (part / "6-f.parquet" / "inner").write_bytes(b"z")
    os.symlink("..", part / "loop")
    os.symlink(base, tmp_path / "link-to-store")
    return tmp_path


def test_find_lists_what_fsspec_lists(tree: Path):
    real = LocalFileSystem()
    for path in (
        tree / "store",
        tree / "store" / "steps",
        tree / "store" / "steps" / "job=a" / "date=2026-11-30" / "node=n2",
        tree / "link-to-store",
        tree / "missing",
        tree / "store" / "steps" / "job=a" / "date=2026-11-30" / "node=n1" / "1-a.parquet",
    ):
        assert LocalFS().find(str(path)) == real.find(str(path)), path


def test_local_roots_are_fsspecs(tmp_path: Path, monkeypatch):
    import fsspec

    monkeypatch.chdir(tmp_path)
    for url in (
        "store",
        "./store",
        "store/",
        ".",
        "a/../b",
        "x//y",
        f"file://{tmp_path}/s",
        "file://rel",
        "/abs/path/",
        "/",
    ):
        location = resolve_store(url, create=False) if url in ("/", ".") else None
        _, root = fsspec.core.url_to_fs(url)
        assert _local_root(url) == (root.rstrip("/") or "/"), url
        if location is not None:
            assert location.root == (root.rstrip("/") or "/")


def test_a_local_sql_imports_no_fsspec(tmp_path: Path):
    store = tmp_path / "store"
    store.mkdir()
    code = (
        "import sys\n"
        "from faultlens.controller.cli.main import main\n"
        "main(['sql', '--store', sys.argv[1], 'select 1'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 'rich')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(store)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    ).stdout
    assert out.strip().splitlines()[-1] == "[]", out
