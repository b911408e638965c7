"""The node task's heartbeat reader: the ranks' progress records into the job's store.

Every rank's step timer keeps a heartbeat record in shared memory
(collectors/training/heartbeat.py); under `faultlens run` the supervisor reads them into the
heartbeats table, and progress is judged from the ranks' own stamps there, never from when step
rows happen to be flushed. On Slurm the node task (`faultlens slurm node`, the node's agent for
the job's life) does the same for its node: the ranks get a heartbeat directory of their own
(`<heartbeat dir>/slurm-<Slurm job>-a<attempt>-<node>`: nodes that share a machine never read each
other's records), and a thread reads it into the store for as long as the task lives. A node that
is lost takes its reader with it: its ranks' heartbeats stop together, the crash rules' evidence
that the node went silent while its peers lived on.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from faultlens import environment

#: seconds between reads of the directory, and between a rank's rows while it only stays alive
POLL_S = 1.0


def beats_dir(env: Mapping[str, str], slurm_job: str, attempt: int, node: str) -> Path | None:
    """The ranks' heartbeat directory on this node; None when the job turned heartbeats off (an
    empty FAULTLENS_HEARTBEAT_DIR)."""
    configured = environment.HEARTBEAT_DIR.raw(env)
    if configured == "":
        return None
    from faultlens.collectors.training.heartbeat import default_dir

    root = Path(configured) if configured else default_dir()
    return root / f"slurm-{slurm_job}-a{attempt}-{node}"


class BeatsReader:
    """Reads one heartbeat directory into the store in a daemon thread until stop()."""

    def __init__(self, directory: Path, store: str, node: str, job_id: str, attempt: int) -> None:
        from faultlens.collectors.sources.agent import NodeAgent
        from faultlens.collectors.sources.source import NodeIdentity
        from faultlens.collectors.store.sink import SegmentSink
        from faultlens.collectors.training.heartbeat import HeartbeatSource

        self.directory = directory
        identity = NodeIdentity(node=node, job_id=job_id, attempt=attempt)
        source = HeartbeatSource(directory, identity, min_interval_s=0.0, keepalive_s=POLL_S)
        sink = SegmentSink(store, flush_rows=10_000, flush_age_s=POLL_S / 2)
        self.agent = NodeAgent([source], sink, interval_s=POLL_S)
        self.thread = threading.Thread(target=self.agent.run, name="faultlens-beats", daemon=True)

    def start(self) -> BeatsReader:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop reading (the last rows flushed) and remove the directory's records."""
        self.agent.stop()
        self.thread.join(timeout=30)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.directory)


def start_reader(
    directory: Path | None, store: str | None, node: str, job_id: str, attempt: int
) -> BeatsReader | None:
    """A started reader, or None (no store, heartbeats off, or it cannot start: one line, the job
    runs on)."""
    if directory is None or not store:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return BeatsReader(directory, store, node, job_id, attempt).start()
    except Exception as exc:  # the job's own run matters more than its heartbeats
        print(f"faultlens slurm: {node}: heartbeats not read: {exc}", file=sys.stderr, flush=True)
        return None
