"""A small tiered checkpointer for training loops: every `every_local` steps each rank writes its
shard to the node's local tier; every `every_durable` steps the shards are copied to the durable
tier (and, when configured, to a peer replica) by a background thread, so the training loop only
pays for the local write.

A checkpoint never looks complete before it is: each rank writes its shard, then a small commit
marker (`_commit/rank_<r>.json`); the committer (local rank 0 for a node's local and peer
directories, global rank 0 for the durable one) waits for every expected marker and only then writes
`manifest.json`, atomically, last. A rank that dies midway leaves a directory without a manifest,
which the catalog reports as incomplete and never restores. Ranks coordinate through the files only:
no collective is called from the background thread.

Collector rule: the checkpointer runs inside the training process, so background failures are logged
and kept in `errors`, never raised into the loop. `save()` itself raises only if the local write
fails (the caller asked for a checkpoint and did not get one).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import os
import posixpath
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import fsspec

from faultlens.controller.checkpoints.directory import COMMIT_DIR, STEP_DIR_RE
from faultlens.controller.checkpoints.fsutil import atomic_write, is_local
from faultlens.controller.checkpoints.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardFile,
    parse_manifest,
)

log = logging.getLogger(__name__)


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def shard_name(rank: int) -> str:
    return f"rank_{rank}.pt"


def _torch_save(state: Any, handle: BinaryIO) -> None:
    import torch

    torch.save(state, handle)


@dataclass(frozen=True)
class _Target:
    kind: str  # local, peer, durable
    url: str
    expected_ranks: int  # markers the committer waits for
    committer: bool  # does this rank write the manifest here
    storage_options: tuple[tuple[str, Any], ...] = ()

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.url, **dict(self.storage_options))
        return fs, root.rstrip("/") or "/"


class TieredCheckpointer:
    def __init__(
        self,
        *,
        local: str,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int | None = None,
        local_world_size: int | None = None,
        durable: str | None = None,
        peer: str | None = None,
        every_local: int = 1,
        every_durable: int = 5,
        keep_local: int = 2,
        node: str | None = None,
        job_id: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        serialize: Callable[[Any, BinaryIO], None] = _torch_save,
        commit_timeout_s: float = 120.0,
        poll_s: float = 0.05,
    ) -> None:
        if every_local < 1 or every_durable < 1:
            raise ValueError("every_local and every_durable must be >= 1")
        self.rank = rank
        self.world_size = world_size
        self.local_rank = rank if local_rank is None else local_rank
        self.local_world_size = world_size if local_world_size is None else local_world_size
        self.every_local = every_local
        self.every_durable = every_durable
        self.keep_local = keep_local
        self.node = node
        self.job_id = job_id
        self.serialize = serialize
        self.commit_timeout_s = commit_timeout_s
        self.poll_s = poll_s
        options = tuple(sorted((storage_options or {}).items()))
        node_committer = self.local_rank == 0
        self.local = _Target("local", local, self.local_world_size, node_committer)
        self.peer = (
            _Target("peer", peer, self.local_world_size, node_committer, options) if peer else None
        )
        self.durable = (
            _Target("durable", durable, world_size, rank == 0, options) if durable else None
        )
        self.errors: list[str] = []
        self.committed: list[tuple[str, int]] = []  # (tier kind, step) manifests this rank wrote
        self._captured: dict[int, dt.datetime] = {}  # step -> when save() took this rank's state
        self._queue: queue.Queue[tuple[str, _Target | None, int, threading.Event | None] | None] = (
            queue.Queue()
        )
        self._worker = threading.Thread(
            target=self._run, name=f"faultlens-ckpt-rank{rank}", daemon=True
        )
        self._worker.start()

    @classmethod
    def from_env(
        cls, local: str, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> TieredCheckpointer:
        """Rank layout from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE).
        """
        env = os.environ if environ is None else environ
        return cls(
            local=local,
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", env.get("RANK", 0))),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))),
            **kwargs,
        )

    # --- the training-loop side
    # --------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every_local == 0

    def durable_due(self, step: int) -> bool:
        return (
            step > 0
            and step % self.every_durable == 0
            and (self.durable is not None or self.peer is not None)
        )

    def save(self, step: int, state: Any, *, force: bool = False) -> bool:
        """Write this rank's shard for `step` if a checkpoint is due (or `force`); copies to the
        other tiers happen in the background. Returns whether a checkpoint was written."""
        replicate = self.durable_due(step)
        if not (force or self.due(step) or replicate):
            return False
        # when this rank's state was taken, whatever tier copies it
        self._captured[step] = dt.datetime.now(dt.UTC)
        # bounded: only steps whose copies may still be running matter
        for old in sorted(self._captured)[:-64]:
            del self._captured[old]
        buffer = io.BytesIO()
        self.serialize(state, buffer)
        data = buffer.getvalue()
        self._write_shard(self.local, step, data)
        self._queue.put(("commit", self.local, step, None))
        if replicate or force:
            for target in (self.peer, self.durable):
                if target is not None:
                    self._queue.put(("replicate", target, step, None))
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background work queued so far is done (or `timeout`); True when done."""
        done = threading.Event()
        self._queue.put(("barrier", None, 0, done))
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        self.wait(timeout)
        self._queue.put(None)
        self._worker.join(timeout)

    # --- files
    # ----------------------------------------------------------------------------------------------

    def _dir(self, target: _Target, step: int) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = target.filesystem()
        return fs, f"{root}/{step_dir_name(step)}"

    def _write_shard(self, target: _Target, step: int, data: bytes) -> None:
        fs, directory = self._dir(target, step)
        name = shard_name(self.rank)
        fs.makedirs(directory, exist_ok=True)
        atomic_write(fs, f"{directory}/{name}", data)
        captured = self._captured.get(step)
        marker = {
            "rank": self.rank,
            "path": name,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "node": self.node,
            "captured_at": captured.isoformat() if captured else None,
        }
        atomic_write(
            fs, f"{directory}/{COMMIT_DIR}/rank_{self.rank}.json", json.dumps(marker).encode()
        )

    # --- the background side
    # -----------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is None:
                return
            kind, target, step, event = task
            try:
                if event is not None:
                    event.set()
                elif kind == "commit" and target is not None:
                    if target.committer:
                        self._commit(target, step)
                        if target.kind == "local":
                            self._prune_local()
                elif kind == "replicate" and target is not None:
                    self._replicate(target, step)
                    if target.committer:
                        self._commit(target, step)
            except Exception as exc:  # never into the training loop
                message = (f"{kind} {target.kind if target else ''} step {step}: "
                           f"{type(exc).__name__}: {exc}")
                log.warning("tiered checkpointer rank %s: %s", self.rank, message)
                self.errors.append(message)

    def _replicate(self, target: _Target, step: int) -> None:
        """Copy this rank's local shard to `target` (streamed: a multipart upload on object stores),
        then write its marker with the size and sha256 recorded when the shard was written locally.
        The copy is verified against that sha256 when a restore reads it."""
        local_fs, local_dir = self._dir(self.local, step)
        name = shard_name(self.rank)
        source = f"{local_dir}/{name}"
        marker = json.loads(local_fs.cat_file(f"{local_dir}/{COMMIT_DIR}/rank_{self.rank}.json"))
        fs, directory = self._dir(target, step)
        fs.makedirs(directory, exist_ok=True)
        if is_local(local_fs):
            fs.put_file(source, f"{directory}/{name}")
        else:
            fs.pipe_file(f"{directory}/{name}", local_fs.cat_file(source))
        atomic_write(
            fs, f"{directory}/{COMMIT_DIR}/rank_{self.rank}.json", json.dumps(marker).encode()
        )

    def _commit(self, target: _Target, step: int) -> None:
        """Wait for every expected rank's marker, then write the manifest (last, atomically)."""
        fs, directory = self._dir(target, step)
        deadline = time.monotonic() + self.commit_timeout_s
        markers: dict[int, dict[str, Any]] = {}
        while True:
            fs.invalidate_cache(f"{directory}/{COMMIT_DIR}")
            try:
                names = [
                    posixpath.basename(p) for p in fs.ls(f"{directory}/{COMMIT_DIR}", detail=False)
                ]
            except FileNotFoundError:
                names = []
            for name in names:
                if name.startswith("rank_") and name.endswith(".json"):
                    rank = int(name[5:-5]) if name[5:-5].isdigit() else None
                    if rank is not None and rank not in markers:
                        markers[rank] = json.loads(fs.cat_file(f"{directory}/{COMMIT_DIR}/{name}"))
            if len(markers) >= target.expected_ranks:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{target.kind} step {step}: {len(markers)} of "
                                   f"{target.expected_ranks} ranks "
                                   f"committed within {self.commit_timeout_s}s; the checkpoint "
                                   "stays incomplete")
            time.sleep(self.poll_s)
        files = tuple(ShardFile(m["rank"], m["path"], int(m["bytes"]), m["sha256"])
                      for _, m in sorted(markers.items()))
        node = self.node if target.kind != "durable" else None
        # the checkpoint is as old as the state it holds (the last rank's capture), not as its copy:
        # a durable copy finished after a fault still holds the state of before it
        captured = [
            dt.datetime.fromisoformat(m["captured_at"])
            for m in markers.values()
            if m.get("captured_at")
        ]
        manifest = Manifest(
            step=step,
            world_size=self.world_size,
            files=files,
            created_at=max(captured) if len(captured) == len(markers) else dt.datetime.now(dt.UTC),
            node=node,
            job_id=self.job_id,
        )
        atomic_write(fs, f"{directory}/{MANIFEST_NAME}", manifest.to_json())
        self.committed.append((target.kind, step))

    def _prune_local(self) -> None:
        """Keep the newest `keep_local` committed local checkpoints. A step still waiting for its
        durable copy is kept (another rank may still be reading its shard); the manifest goes first
        so a half-deleted directory never looks complete."""
        if self.keep_local <= 0:
            return
        fs, root = self.local.filesystem()
        try:
            children = [p.rstrip("/") for p in fs.ls(root, detail=False)]
        except FileNotFoundError:
            return
        committed = []
        for path in children:
            match = STEP_DIR_RE.match(posixpath.basename(path))
            if match and fs.exists(f"{path}/{MANIFEST_NAME}"):
                committed.append((int(match.group(1)), path))
        committed.sort(reverse=True)
        for step, path in committed[self.keep_local:]:
            if self.durable_due(step) and not self._durable_committed(step):
                continue
            fs.rm(f"{path}/{MANIFEST_NAME}")
            fs.rm(path, recursive=True)

    def _durable_committed(self, step: int) -> bool:
        target = self.durable or self.peer
        if target is None:
            return True
        fs, directory = self._dir(target, step)
        try:
            parse_manifest(fs.cat_file(f"{directory}/{MANIFEST_NAME}"), directory)
        except (OSError, ValueError):
            return False
        return True

