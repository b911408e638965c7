"""The numerics probe's rows of one attempt (collectors/training/numerics.py): every rank's
parameter digest every `every` steps, after the step's optimizer step. Data-parallel replicas of
one (tensor, pipeline) shard hold the same parameters, so their digests are equal (and equal at
the same step after a restore: the state is a function of the step); a rank whose parameters a
flipped bit changed (World.flips) differs from its first shown step on."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

from faultlens.collectors.store.schema import TABLES, ts_array
from faultlens.controller.lab.simulate.world import NS, Attempt

SHARD_BYTES = 1_680_000_000  # a 70B model's bf16 parameters over tp 8 x pp 4 (about 1.7 GB)
DIGEST_S = 1.1  # CRC-32 of the shard at 1.5 GB/s (docs/benchmarks.md "Numerics signals")


def digest_table(
    cluster: str,
    job_id: str,
    attempt: Attempt,
    every: int,
    flips: list[tuple[int, int, int]],
) -> pa.Table | None:
    """The attempt's digest rows (None when it has no digest step)."""
    at = [
        (s, e)
        for s, e in zip(attempt.steps.steps, attempt.steps.ends, strict=True)
        if s % every == 0
    ]
    if not at:
        return None
    flipped = {rank: step for number, rank, step in flips if number == attempt.number}
    rows: dict[str, list] = {name: [] for name in TABLES["numerics"].names}
    for step, end in at:
        for place in attempt.placement.ranks():
            shard = f"{step}:{place.pp_rank}:{place.tp_rank}"
            if place.rank in flipped and step >= flipped[place.rank]:
                shard += f":flip{place.rank}"
            gpu = place.gpu
            row = {
                "ts": end + int(DIGEST_S * NS) + place.rank * 1000,
                "cluster": cluster,
                "node": place.node.name,
                "job_id": job_id,
                "attempt": attempt.number,
                "rank": place.rank,
                "local_rank": place.local_rank,
                "gpu_index": gpu.index,
                "gpu_uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "step": step,
                "phase": "train",
                "loss": None,
                "grad_norm": None,
                "digest": f"crc32:{zlib.crc32(shard.encode()):08x}",
                "digest_bytes": SHARD_BYTES,
                "digest_s": DIGEST_S,
                "dp_rank": place.dp_rank,
                "tp_rank": place.tp_rank,
                "pp_rank": place.pp_rank,
                "batch": None,
            }
            for name in rows:
                rows[name].append(row.get(name))
    rows["ts"] = ts_array(np.asarray(rows["ts"], dtype=np.int64))  # type: ignore[assignment]
    return pa.table(rows, schema=TABLES["numerics"])
