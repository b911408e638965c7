"""SIGKILL a writer at random moments: no partial file is ever visible, and every row whose flush
had returned is read back exactly once."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from faultlens.attribution.reading.store import Store
from tests.conftest import REPO_ROOT

TRIALS = 50


class Zygote:
    """tests.sink_writer --zygote: forks one real writer process per trial (the imports are paid
    once).
    """

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sink_writer", "--zygote"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def run_and_kill(
        self, store: str, seed: int, job: str, ack: Path, delay: float, after_first_flush: bool
    ) -> int:
        """Start a writer, wait for it to be ready (and for its first flush), SIGKILL it after
        `delay` seconds; the number of rows its last returned flush had committed."""
        self.proc.stdin.write(f"{store} {seed} {job} {ack}\n")
        self.proc.stdin.flush()
        kind, pid = self.proc.stdout.readline().split()
        assert kind == "pid"
        want = 2 if after_first_flush else 1
        deadline = time.monotonic() + 60
        while len(_lines(ack)) < want:
            assert time.monotonic() < deadline, f"{job}: the writer never got ready"
            time.sleep(0.005)
        assert _lines(ack)[0] == "ready"
        time.sleep(delay)
        os.kill(int(pid), signal.SIGKILL)
        kind, status = self.proc.stdout.readline().split()
        assert (
            kind == "exit"
            and os.WIFSIGNALED(int(status))
            and os.WTERMSIG(int(status)) == signal.SIGKILL
        )
        committed = [int(line) for line in _lines(ack)[1:]]
        return committed[-1] if committed else 0

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _lines(path: Path) -> list[str]:
    """The complete lines of a file another process is writing (a line without its newline is not
    yet there).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return text.split("\n")[:-1]


def test_sigkill_never_leaves_partial_visible_files(tmp_path):
    rng = random.Random(20261130)
    store = tmp_path / "store"
    acknowledged = {}
    zygote = Zygote()
    checked: set[Path] = set()
    for trial in range(TRIALS):
        job = f"trial-{trial:02d}"
        acknowledged[job] = zygote.run_and_kill(
            str(store),
            seed=trial,
            job=job,
            ack=tmp_path / f"{job}.ack",
            delay=rng.uniform(0.0, 0.3),
            after_first_flush=trial % 2 == 1,
        )
        for path in store.rglob("*"):
            if path.is_file() and not path.name.startswith(".") and path not in checked:
                assert path.suffix == ".parquet", path
                pq.read_table(path)  # complete and readable; a partial file raises here
                checked.add(path)  # a visible segment never changes (it lands by an atomic rename)
    with Store(store) as reader:  # the whole store read once, not once per job
        table = reader.query("SELECT job_id, step FROM steps ORDER BY job_id, step")
    read: dict[str, list[int]] = {job: [] for job in acknowledged}
    for job, step in zip(table.column("job_id").to_pylist(), table.column("step").to_pylist(),
                         strict=True):
        read.setdefault(job, []).append(step)
    assert set(read) == set(acknowledged), "rows of a job that was never written"
    for job, committed in acknowledged.items():
        ids = read[job]
        assert len(ids) == len(set(ids)), f"{job}: a row was read twice"
        assert ids[:committed] == list(range(committed)), f"{job}: acknowledged rows missing"
        # rows of the flush the kill interrupted may have landed for some partitions (each
        # segment is atomic on its own), never rows that were not written
        assert all(i >= committed for i in ids[committed:])
    zygote.close()
    assert sum(acknowledged.values()) > 0
    assert sum(1 for c in acknowledged.values() if c > 0) >= TRIALS // 2
