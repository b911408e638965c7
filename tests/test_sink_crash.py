"""SIGKILL a writer at random moments: no partial file is ever visible, and every row whose flush had returned
is read back exactly once."""

import os
import random
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq

from faultlens.attribution.store import Store
from tests.conftest import REPO_ROOT

TRIALS = 50


def _run_and_kill(store: str, seed: int, job: str, delay: float, after_first_flush: bool) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.sink_writer", store, str(seed), job], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline().strip() == "ready"
    first = proc.stdout.readline().strip() if after_first_flush else ""
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    committed = [int(line) for line in (first + "\n" + out).split()]
    return committed[-1] if committed else 0


def test_sigkill_never_leaves_partial_visible_files(tmp_path):
    rng = random.Random(20261130)
    store = tmp_path / "store"
    acknowledged = {}
    for trial in range(TRIALS):
        job = f"trial-{trial:02d}"
        acknowledged[job] = _run_and_kill(str(store), seed=trial, job=job, delay=rng.uniform(0.0, 0.3),
                                        after_first_flush=trial % 2 == 1)
        for path in store.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                assert path.suffix == ".parquet", path
                pq.read_table(path)  # complete and readable; a partial file raises here
    with Store(store) as reader:
        for job, committed in acknowledged.items():
            ids = reader.query("SELECT step FROM steps WHERE job_id = ? ORDER BY step", [job]).column(0).to_pylist()
            assert len(ids) == len(set(ids)), f"{job}: a row was read twice"
            assert ids[:committed] == list(range(committed)), f"{job}: acknowledged rows missing"
            # rows of the flush the kill interrupted may have landed for some partitions (each segment is
            # atomic on its own), never rows that were not written
            assert all(i >= committed for i in ids[committed:])
    assert sum(acknowledged.values()) > 0
    assert sum(1 for c in acknowledged.values() if c > 0) >= TRIALS // 2
