"""In-job numerics signals, opt-in beside the step timer: one `numerics` row per rank per step with
the rank's own loss, the norm of its local gradients before the gradient all_reduce, and every
`digest_every` steps a digest of its parameter shard after the optimizer step.

    timer = StepTimer.from_env(...)
    probe = NumericsProbe(timer, digest_every=50, parallel=timer.parallel)  # norm_every=1
    ddp.register_comm_hook(None, probe.comm_hook)   # DDP: the local norm, then the usual all_reduce
    for n, batch in enumerate(loader):
        with timer.step(n) as step:
            loss = ...; loss.backward()
            # no DDP (own gradient all_reduce): probe.local_grads(model.parameters()) before it
            optimizer.step()
            step.loss = loss.item()
        probe.record(n, loss=loss, module=model)

Data-parallel replicas hold identical parameters after every optimizer step, so their digests are
equal; the comparison is central (attribution/detectors/numerics.py), the loop adds no collective.
The digest is CRC-32 chained over the tensors' bytes (zlib; any single flipped bit changes it) or
any hashlib name (`hasher="blake2b"`). Rows go through the timer's writer thread
(StepTimer.queue_row), flushed at the timer's interval, except two rows that are written at once
(the timer's flush, on a thread of its own, so the training thread does not wait for it): the
first row (the store learns that the attempt runs the probe) and the first row whose own loss or
gradient norm is not finite (where a NaN began reaches the store about when the heartbeats' every-
rank NaN does, which the detector holds for it: docs/design.md "Numerics"). Nothing here raises
into the training loop: errors are counted and logged.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TABLE = "numerics"


@dataclass
class NumericsStats:
    rows: int = 0
    digests: int = 0
    digest_bytes: int = 0
    digest_s: float = 0.0
    errors: int = 0
    last_error: str | None = None
    urgent_flushes: int = 0


class NumericsProbe:
    """The numerics signals of one rank, written through `timer` (a StepTimer)."""

    def __init__(
        self,
        timer: Any,
        *,
        digest_every: int = 100,
        norm_every: int = 1,
        parallel: Any = None,
        hasher: str = "crc32",
        wall_clock: Any = time.time_ns,
    ) -> None:
        self.timer = timer
        self.digest_every = max(0, int(digest_every))
        # the local gradient norm on every norm_every-th step only (its cost divided by it; a
        # corruption must then last norm_every x outlier_steps steps to be localized)
        self.norm_every = max(1, int(norm_every))
        self._next = 0  # the step the gradients now gathered belong to (the last record's + 1)
        self.parallel = parallel if parallel is not None else getattr(timer, "parallel", None)
        self.hasher = hasher
        self.stats = NumericsStats()
        self._wall = wall_clock
        self._sq: Any = None  # sum of squares of the local gradients of the current step
        self._first_row = True
        self._nonfinite_seen = False
        if hasher != "crc32":
            hashlib.new(hasher)  # an unknown name fails here, at setup, not in the loop

    # -- gradients, before the all_reduce
    @property
    def comm_hook(self) -> Any:
        """A DDP communication hook (ddp.register_comm_hook(None, probe.comm_hook)): adds the
        bucket's local gradients to this step's norm, then all-reduces them as DDP does by default
        (`state` is the process group, None: the default one)."""
        import torch
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(state: Any, bucket: Any) -> Any:
            try:
                if self._due():
                    self._add(bucket.buffer())
            except Exception as exc:
                self._error("grad norm", exc)
            return allreduce_hook(state, bucket)

        # DDP checks the annotations themselves (this module's are strings)
        hook.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        return hook

    def local_grads(self, parameters: Iterable[Any]) -> None:
        """The local gradients of `parameters` (call before your own gradient all_reduce): one
        multi-tensor norm per device and dtype (torch's foreach kernels, as clip_grad_norm_
        uses), not one reduction per tensor."""
        try:
            if not self._due():
                return
            import torch

            groups: dict[tuple[Any, Any], list[Any]] = {}
            for p in parameters:
                grad = getattr(p, "grad", None)
                if grad is None:
                    continue
                if grad.is_sparse:
                    self._add(grad.coalesce().values())
                else:
                    groups.setdefault((grad.device, grad.dtype), []).append(grad.detach())
            for (_, dtype), grads in groups.items():
                norms = torch._foreach_norm(grads, 2, dtype=_accumulate(dtype))
                self._add_squares(torch.stack(norms).double().square().sum())
        except Exception as exc:
            self._error("grad norm", exc)

    def _due(self) -> bool:
        return self.norm_every <= 1 or self._next % self.norm_every == 0

    def _add(self, grad: Any) -> None:
        import torch

        # a reduction, no temporary the size of the gradient; float64 accumulation of the squares
        norm = torch.linalg.vector_norm(grad.detach(), dtype=_accumulate(grad.dtype)).double()
        self._add_squares(norm * norm)

    def _add_squares(self, value: Any) -> None:
        self._sq = value if self._sq is None else self._sq + value

    # -- the row of one step
    def record(
        self,
        step: int,
        *,
        loss: Any = None,
        module: Any = None,
        batch: Any = None,
        phase: str = "train",
    ) -> None:
        """The step's row: the rank's loss, the local gradient norm gathered since the last
        record, and (every digest_every steps, `module` given) the digest of its parameters."""
        try:
            sq, self._sq = self._sq, None
            self._next = int(step) + 1
            row: dict[str, Any] = {
                "ts": self._wall(),
                "step": int(step),
                "phase": str(phase),
                "loss": _scalar(loss),
                "grad_norm": math.sqrt(s) if (s := _scalar(sq)) is not None and s >= 0 else s,
                "batch": None if batch is None else str(batch),
            }
            for name in ("dp_rank", "tp_rank", "pp_rank"):
                row[name] = getattr(self.parallel, name, None)
            if module is not None and self.digest_every and int(step) % self.digest_every == 0:
                digest, size, seconds = self.digest(module)
                row.update(digest=digest, digest_bytes=size, digest_s=seconds)
            self.timer.queue_row(TABLE, row)
            self.stats.rows += 1
            bad = any(_nonfinite(row[c]) for c in ("loss", "grad_norm"))
            if self._first_row or (bad and not self._nonfinite_seen):
                self._first_row = False
                self._nonfinite_seen = self._nonfinite_seen or bad
                self._flush_soon()
        except Exception as exc:
            self._error("record", exc)

    def _flush_soon(self) -> None:
        """Write what the timer holds now, from a thread of its own (at most twice a process)."""
        flush = getattr(self.timer, "flush", None)
        if flush is None:
            return
        self.stats.urgent_flushes += 1
        threading.Thread(
            target=flush, kwargs={"timeout_s": 5.0}, name="faultlens-numerics-flush", daemon=True
        ).start()

    def digest(self, module: Any) -> tuple[str, int, float]:
        """(hex digest, bytes hashed, seconds) of the parameters of `module` (a torch module, or
        an iterable of tensors), in their order."""
        start = time.perf_counter()
        params = module.parameters() if hasattr(module, "parameters") else module
        size = 0
        if self.hasher == "crc32":
            crc = 0
            for tensor in params:
                data = _bytes(tensor)
                crc = zlib.crc32(data, crc)
                size += len(data)
            text = f"crc32:{crc:08x}"
        else:
            h = hashlib.new(self.hasher)
            for tensor in params:
                data = _bytes(tensor)
                h.update(data)
                size += len(data)
            text = f"{self.hasher}:{h.hexdigest()}"
        seconds = time.perf_counter() - start
        self.stats.digests += 1
        self.stats.digest_bytes += size
        self.stats.digest_s += seconds
        return text, size, seconds

    def _error(self, what: str, exc: BaseException) -> None:
        self.stats.errors += 1
        self.stats.last_error = f"{what}: {type(exc).__name__}: {exc}"
        if self.stats.errors <= 10:
            log.warning("numerics: %s", self.stats.last_error)


def _accumulate(dtype: Any) -> Any:
    """The dtype a norm of `dtype` values is computed in: float32, float64 for float64."""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def _bytes(tensor: Any) -> memoryview:
    """The tensor's bytes (a device tensor is copied to the host first)."""
    t = tensor.detach()
    if getattr(t, "device", None) is not None and t.device.type != "cpu":
        t = t.cpu()
    import torch

    flat = t.contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def _nonfinite(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)


def _scalar(value: Any) -> float | None:
    if value is None:
        return None
    try:
        if hasattr(value, "detach"):
            value = value.detach().double().sum().item()
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


__all__ = ["TABLE", "NumericsProbe", "NumericsStats"]
