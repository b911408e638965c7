"""Cost of the in-job numerics signals (collectors/training/numerics.py) on the training thread,
beside the bare step of a >= 100M-parameter model on the CPU, and the store volume they write.

    PYTHONPATH=. python -m bench.bench_numerics [--width 3200] [--layers 10] [--steps 3] [--write]

- bare step: forward, backward and an SGD step of an MLP of `layers` Linear(width, width) layers
  (10 x 3200: 102M parameters, 410 MB float32) on a batch of 8, no instrumentation.
- per step: the local gradient norm (NumericsProbe.local_grads, the sum of squares of every
  gradient) and the row (NumericsProbe.record without a digest), beside the bare step.
- per digest: NumericsProbe.digest over the parameters: CRC-32 (zlib, the default) against the
  hashlib digests a user would pick (blake2b, sha256), bytes hashed per second, same run.
- store volume: the numerics rows of one rank for a simulated day at one step a second and a
  digest every 100 steps, written through a SegmentSink into Parquet, bytes per rank-day.
Times are CPU seconds of this process (best of the runs), not wall: a shared machine's
wall clock measures its other work. Detection accuracy: bench/bench_numerics_accuracy.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import Figure, Section, emit, machine, write_section

TITLE = "Numerics signals: cost on the training thread and store volume"


def _model(width: int, layers: int):  # type: ignore[no-untyped-def]
    import torch

    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks)


def _best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    """The least CPU seconds (every thread of this process) of `repeat` calls."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def _per_tensor_norm(parameters) -> float:  # type: ignore[no-untyped-def]
    """The probe's local norm before: one reduction per gradient tensor (the anchor)."""
    import torch

    total = None
    for p in parameters:
        if p.grad is not None:
            norm = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32).double()
            total = norm * norm if total is None else total + norm * norm
    return float(total) if total is not None else 0.0


def _ddp_hook_cost(model, x, steps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(bare DDP step, DDP step with the probe's communication hook) in CPU seconds, one process
    group of one rank over gloo (the all_reduce a copy): what the hook adds to a DDP step."""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from faultlens.collectors.training.numerics import NumericsProbe

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        found = []
        for hooked in (False, True):
            ddp = DistributedDataParallel(model)
            if hooked:
                probe = NumericsProbe(_Rows(), digest_every=0)
                ddp.register_comm_hook(None, probe.comm_hook)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-6)

            def step(ddp=ddp, optimizer=optimizer) -> None:  # type: ignore[no-untyped-def]
                optimizer.zero_grad(set_to_none=True)
                ddp(x).pow(2).mean().backward()
                optimizer.step()

            step()
            found.append(_best(step, steps))
            del ddp, optimizer
        return found[0], found[1]
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Rows:
    """A timer stand-in that only queues (the writer thread's work is off the training thread)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def queue_row(self, table: str, row: dict) -> None:
        self.rows.append(row)


def measure(width: int, layers: int, steps: int) -> dict:
    import torch

    from faultlens.collectors.training.numerics import NumericsProbe

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = _model(width, layers)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(8, width)

    def bare() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        optimizer.step()

    bare()  # warm
    step_s = _best(bare, steps)
    probe = NumericsProbe(_Rows(), digest_every=0)
    norm_s = _best(lambda: probe.local_grads(model.parameters()), steps)
    per_tensor_s = _best(lambda: _per_tensor_norm(model.parameters()), steps)
    ddp_bare_s, ddp_hook_s = _ddp_hook_cost(model, x, steps)
    record_s = _best(lambda: probe.record(1, loss=1.0), 50)
    hashers = {}
    for name in ("crc32", "blake2b", "sha256"):
        p = NumericsProbe(_Rows(), hasher=name)
        size = p.digest(model)[1]
        hashers[name] = (_best(lambda p=p: p.digest(model), steps), size)
    return {
        "params": params,
        "step_s": step_s,
        "norm_s": norm_s,
        "per_tensor_s": per_tensor_s,
        "ddp_bare_s": ddp_bare_s,
        "ddp_hook_s": ddp_hook_s,
        "threads": torch.get_num_threads(),
        "record_s": record_s,
        "hashers": hashers,
    }


def store_volume(steps: int = 86_400, digest_every: int = 100) -> dict:
    import random

    from faultlens.collectors.store.sink import SegmentSink

    rng = random.Random(0)  # noisy values, as a real loss and gradient norm are (no easy runs)
    start = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1e9)
    with tempfile.TemporaryDirectory() as root:
        sink = SegmentSink(root, flush_rows=20_000, flush_age_s=3600.0)
        identity = {
            "cluster": "c",
            "node": "node-0",
            "job_id": "job",
            "attempt": 0,
            "rank": 0,
            "local_rank": 0,
            "gpu_index": 0,
            "gpu_uuid": "GPU-0",
            "pci_bus_id": None,
        }
        rows = []
        for step in range(steps):
            row = {
                **identity,
                "ts": start + step * 1_000_000_000,
                "step": step,
                "phase": "train",
                "loss": 2.0 + 1.0 / (1 + step) + rng.gauss(0.0, 0.05),
                "grad_norm": abs(rng.gauss(1.0, 0.2)),
                "dp_rank": 0,
                "tp_rank": 0,
                "pp_rank": 0,
                "batch": str(step),
            }
            if step % digest_every == 0:
                row.update(
                    digest=f"crc32:{(step * 2654435761) & 0xFFFFFFFF:08x}",
                    digest_bytes=410_000_000,
                    digest_s=0.5,
                )
            rows.append(row)
            if len(rows) == 20_000:
                sink.write("numerics", rows)
                rows = []
        if rows:
            sink.write("numerics", rows)
        sink.flush()
        size = sum(f.stat().st_size for f in Path(root).rglob("*.parquet"))
    return {"rows": steps, "bytes": size}


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except Exception:
        return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=3200)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--load", default="", help="the machine's load, for the notes")
    args = parser.parse_args()
    m = measure(args.width, args.layers, args.steps)
    volume = store_volume()
    result = {**m, "volume": volume, "machine": machine()}
    emit("numerics", result)
    if not args.write:
        return
    commit, date = _commit(), dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    load = f", {args.load}" if args.load else ""
    step_ms = m["step_s"] * 1e3
    crc_s, size = m["hashers"]["crc32"]
    figures = [
        Figure(
            "bare training step (forward, backward, SGD; batch 8)",
            f"{step_ms:.0f} ms",
            commit=commit,
            date=date,
        ),
        Figure(
            "local gradient norm per step, own all_reduce (local_grads: foreach norms)",
            f"{m['norm_s'] * 1e3:.1f} ms",
            "<= 5% of the step",
            f"bare step {step_ms:.0f} ms",
            f"{m['norm_s'] / m['step_s'] * 100:.1f}% of the step",
            commit,
            date,
        ),
        Figure(
            "local gradient norm per step: foreach against one reduction per tensor (before)",
            f"{m['norm_s'] * 1e3:.1f} ms",
            "-",
            f"per tensor {m['per_tensor_s'] * 1e3:.1f} ms",
            f"{m['per_tensor_s'] / m['norm_s']:.2f}x",
            commit,
            date,
        ),
        Figure(
            "DDP step with the probe's communication hook (world 1, gloo)",
            f"{m['ddp_hook_s'] * 1e3:.0f} ms",
            "<= 5% over the bare DDP step",
            f"bare DDP step {m['ddp_bare_s'] * 1e3:.0f} ms",
            f"{(m['ddp_hook_s'] / m['ddp_bare_s'] - 1) * 100:+.1f}%",
            commit,
            date,
        ),
        Figure(
            "numerics row per step (training thread)",
            f"{m['record_s'] * 1e6:.1f} µs",
            commit=commit,
            date=date,
        ),
    ]
    for name in ("blake2b", "sha256"):
        other_s, _ = m["hashers"][name]
        figures.append(
            Figure(
                f"parameter digest, {size / 1e6:.0f} MB ({m['params'] / 1e6:.0f}M parameters)",
                f"crc32 {crc_s:.2f} s ({size / crc_s / 1e9:.2f} GB/s)",
                "-",
                f"hashlib {name} {other_s:.2f} s ({size / other_s / 1e9:.2f} GB/s)",
                f"{other_s / crc_s:.2f}x",
                commit,
                date,
            )
        )
    figures.append(
        Figure(
            "digest every 100 steps, per step (training thread)",
            f"{crc_s / 100 * 1e3:.1f} ms",
            "< 5% of the step",
            f"bare step {step_ms:.0f} ms",
            f"{crc_s / 100 / m['step_s'] * 100:.1f}% of the step",
            commit,
            date,
        )
    )
    figures.append(
        Figure(
            "store volume per rank-day (1 step/s, a digest every 100 steps)",
            f"{volume['bytes'] / 1e6:.2f} MB ({volume['bytes'] / volume['rows']:.1f} B/row)",
            commit=commit,
            date=date,
        )
    )
    section = Section(
        TITLE,
        "faultlens NumericsProbe (CRC-32 digest) vs the bare step and hashlib's blake2b/sha256.",
        ("PYTHONPATH=. python -m bench.bench_numerics --write",),
        tuple(figures),
        (
            f"CPU seconds of the process (all {m['threads']} threads), best of the runs, on "
            f"{machine()['cpu']} ({machine()['cores']} cores, shared with other work{load}); "
            "the digest of a GPU tensor adds its copy to the host. A norm every N steps "
            "(NumericsProbe(norm_every=N)) divides the norm's cost by N; a corruption must then "
            "last N x outlier_steps steps to be localized.",
        ),
    )
    write_section(Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md", section)


if __name__ == "__main__":
    main()
