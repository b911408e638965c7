"""Faults the demo training script can inject into itself, chosen per attempt by the supervisor.

The supervisor passes one fault to an attempt as JSON in FAULTLENS_DEMO_FAULT; the script applies it only to the
ranks it names, at the step it names. Kinds:

- straggler:  `rank` sleeps `extra_s` more in its forward section from `step` on (slowed compute), and writes
              `<FAULTLENS_DEMO_DIR>/gpu_hot-<node>` so the simulated NVML shows its GPU in thermal slowdown;
- hang:       `rank` skips the loss all_reduce at `step` and stays stuck outside any collective;
- sigkill:    `rank` SIGKILLs itself at `step` (it writes no flight-recorder dump, no error file);
- gpu_lost:   local rank 0 on `node` dies as a process does after its GPU fell off the bus (CUDA error); it first
              writes `<FAULTLENS_DEMO_DIR>/gpu_lost-<node>` so the supervisor's recorded NVML backend reports
              Xid 79 / GPU lost for that GPU at that moment; the other ranks die of the broken collectives;
- software:   every rank raises the same exception at `step` (a bug in the code: restarting cannot fix it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    NONE = "none"
    STRAGGLER = "straggler"
    HANG = "hang"
    SIGKILL = "sigkill"
    GPU_LOST = "gpu_lost"
    SOFTWARE = "software"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    step: int = 0
    rank: int | None = None
    node: str | None = None
    extra_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps({k: (v.value if isinstance(v, StrEnum) else v) for k, v in asdict(self).items()})

    @classmethod
    def from_json(cls, text: str | None) -> Fault:
        if not text:
            return cls(FaultKind.NONE)
        doc: dict[str, Any] = json.loads(text)
        try:
            kind = FaultKind(doc.get("kind", "none"))
        except ValueError:
            kind = FaultKind.UNKNOWN
        return cls(kind=kind, step=int(doc.get("step", 0)), rank=doc.get("rank"), node=doc.get("node"),
                   extra_s=float(doc.get("extra_s", 0.0)))

    def describe(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else (f"node {self.node}" if self.node else "all ranks")
        return {
            FaultKind.STRAGGLER: f"straggler: {where}'s GPU overheats, computes {self.extra_s * 1000:.0f} ms "
                                 f"slower from step {self.step}",
            FaultKind.HANG: f"collective hang: {where} skips an all_reduce at step {self.step}",
            FaultKind.SIGKILL: f"crash: {where} is SIGKILLed at step {self.step}",
            FaultKind.GPU_LOST: f"Xid 79: a GPU of {where} falls off the bus at step {self.step}",
            FaultKind.SOFTWARE: f"software bug: the same exception on every rank at step {self.step}",
        }.get(self.kind, "no fault")
