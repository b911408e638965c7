"""Restore choice latency: faultlens' lazy choice (scan listings and manifests, verify checksums
only of the files the chosen restore reads, newest step first) side by side with eager verification
(checksum every checkpoint in every tier, then pick), which is what a user scripting "find the
newest good checkpoint" would write.

Scenario: 2 local tiers (one per node), 1 durable tier; N steps of R ranks of S bytes each; the
newest step is incomplete on the durable tier and the node holding half the ranks is excluded, so
the choice must skip both.

    PYTHONPATH=. python bench/bench_restore_choice.py [--steps 8] [--ranks 32] [--shard-kib 512]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import emit, machine
from faultlens.controller.checkpoints import CheckpointCatalog, Tier, TierKind
from faultlens.controller.checkpoints.manifest import Manifest, ShardFile


def build(root: Path, steps: int, ranks: int, shard_bytes: int) -> list[Tier]:
    half = ranks // 2
    layout = {
        "node-0": (root / "node-0", range(0, half)),
        "node-1": (root / "node-1", range(half, ranks)),
        "durable": (root / "durable", range(ranks)),
    }
    payload = os.urandom(shard_bytes)
    for step in range(1, steps + 1):
        for name, (tier_root, tier_ranks) in layout.items():
            if name != "durable" and step < steps - 1:
                continue  # local tiers keep the two newest steps
            directory = tier_root / f"step-{step:08d}"
            directory.mkdir(parents=True)
            files = []
            for rank in tier_ranks:
                data = payload[:-8] + rank.to_bytes(4, "little") + step.to_bytes(4, "little")
                (directory / f"rank_{rank}.pt").write_bytes(data)
                files.append(
                    ShardFile(rank, f"rank_{rank}.pt", len(data), hashlib.sha256(data).hexdigest())
                )
            if name == "durable" and step == steps:
                continue  # the newest durable copy never committed
            (directory / "manifest.json").write_bytes(Manifest(step, ranks, tuple(files)).to_json())
    return [
        Tier(TierKind.LOCAL, str(root / "node-0"), "node-0"),
        Tier(TierKind.LOCAL, str(root / "node-1"), "node-1"),
        Tier(TierKind.DURABLE, str(root / "durable")),
    ]


def lazy(tiers: list[Tier]) -> tuple[float, int]:
    start = time.perf_counter()
    choice = CheckpointCatalog(tiers).choose(exclude_nodes=["node-1"])
    return time.perf_counter() - start, choice.step


def eager(tiers: list[Tier]) -> tuple[float, int]:
    start = time.perf_counter()
    catalog = CheckpointCatalog(tiers)
    entries = catalog.scan()
    for entry in entries:
        catalog.verify(entry)
    choice = catalog.choose(exclude_nodes=["node-1"], entries=entries)
    return time.perf_counter() - start, choice.step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--shard-kib", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tiers = build(Path(tmp), args.steps, args.ranks, args.shard_kib * 1024)
        total = sum(f.stat().st_size for f in Path(tmp).rglob("rank_*.pt"))
        results = {}
        for name, fn in (("faultlens_lazy", lazy), ("eager_verify_all", eager)):
            times, step = [], None
            for _ in range(args.repeat):
                elapsed, step = fn(tiers)
                times.append(elapsed)
            results[name] = {"median_s": round(statistics.median(times), 4), "chosen_step": step}
    emit("restore_choice", {"steps": args.steps, "ranks": args.ranks, "shard_kib": args.shard_kib,
                            "bytes_in_tiers": total, "results": results, "machine": machine(),
                            "speedup": round(results["eager_verify_all"]["median_s"]
                                             / results["faultlens_lazy"]["median_s"], 1)})


if __name__ == "__main__":
    main()
