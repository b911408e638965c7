"""Faults the demo training script can inject into itself, chosen per attempt by the supervisor.

The supervisor passes one fault to an attempt as JSON in FAULTLENS_DEMO_FAULT; the script applies it
only to the ranks it names, at the step it names. Without a supervisor (plain `torchrun
--max-restarts N`, which restarts the same job on the same nodes), FAULTLENS_DEMO_FAULTS holds a
JSON list indexed by torchrun's restart count (TORCHELASTIC_RESTART_COUNT), or by the supervisor's
attempt (FAULTLENS_ATTEMPT) when a supervisor set one; each item is one fault or a list of faults
for that restart. A fault with `"relative": true` counts its step from the step the attempt resumes
at. Kinds:

- straggler:  `rank` sleeps `extra_s` more in its forward section from `step` on (slowed compute),
  and writes
              `<FAULTLENS_DEMO_DIR>/gpu_hot-<node>` so the simulated NVML shows its GPU in thermal
              slowdown;
- hang:       `rank` skips the loss all_reduce at `step` and stays stuck outside any collective;
- sigkill:    `rank` SIGKILLs itself at `step` (it writes no flight-recorder dump, no error file);
- gpu_lost:   local rank 0 on `node` dies as a process does after its GPU fell off the bus (CUDA
  error); it first
              writes `<FAULTLENS_DEMO_DIR>/gpu_lost-<node>` so the supervisor's recorded NVML
              backend reports Xid 79 / GPU lost for that GPU at that moment; the other ranks die of
              the broken collectives;
- software:   every rank raises the same exception at `step` (a bug in the code: restarting cannot
  fix it); it
              first writes `<FAULTLENS_DEMO_DIR>/software_bug-a<attempt>-r<rank>` holding the time
              (epoch seconds);
- exception:  `rank` (every rank when none is named) raises ValueError(`message`) at `step`;
- agent_loss: at `step`, local rank 0 on `node` (or `rank`'s node) SIGKILLs its node's torchrun
  agent and nothing
              else: the workers, in their own sessions, train on;
- node_loss:  at `step`, the node's agent and every worker of it are SIGKILLed together (the node is
  gone).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from faultlens import environment

ENV_FAULT = environment.DEMO_FAULT.name
ENV_FAULTS = environment.DEMO_FAULTS.name
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_ATTEMPT = environment.ATTEMPT.name  # set by the supervisor (faultlens run): its attempt number


class FaultKind(StrEnum):
    NONE = "none"
    STRAGGLER = "straggler"
    HANG = "hang"
    SIGKILL = "sigkill"
    GPU_LOST = "gpu_lost"
    SOFTWARE = "software"
    EXCEPTION = "exception"
    AGENT_LOSS = "agent_loss"
    NODE_LOSS = "node_loss"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    step: int = 0
    rank: int | None = None
    node: str | None = None
    extra_s: float = 0.0
    relative: bool = False  # `step` counts from the step the attempt resumes at
    message: str = ""  # the exception text (exception)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, StrEnum) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, text: str | None) -> Fault:
        if not text:
            return cls(FaultKind.NONE)
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Fault:
        try:
            kind = FaultKind(doc.get("kind", "none"))
        except ValueError:
            kind = FaultKind.UNKNOWN
        return cls(
            kind=kind,
            step=int(doc.get("step", 0)),
            rank=doc.get("rank"),
            node=doc.get("node"),
            extra_s=float(doc.get("extra_s", 0.0)),
            relative=bool(doc.get("relative", False)),
            message=str(doc.get("message", "")),
        )

    def resolved(self, start_step: int) -> Fault:
        """The fault with an absolute step, for an attempt that starts at `start_step`."""
        return replace(self, step=start_step + self.step, relative=False) if self.relative else self

    def describe(self) -> str:
        where = (
            f"rank {self.rank}"
            if self.rank is not None
            else (f"node {self.node}" if self.node else "all ranks")
        )
        return {
            FaultKind.STRAGGLER: f"straggler: {where}'s GPU overheats, computes "
                                 f"{self.extra_s * 1000:.0f} ms "
                                 f"slower from step {self.step}",
            FaultKind.HANG: f"collective hang: {where} skips an all_reduce at step {self.step}",
            FaultKind.SIGKILL: f"crash: {where} is SIGKILLed at step {self.step}",
            FaultKind.GPU_LOST: f"Xid 79: a GPU of {where} falls off the bus at step {self.step}",
            FaultKind.SOFTWARE: "software bug: the same exception on every rank at step "
                                f"{self.step}",
            FaultKind.EXCEPTION: f"exception on {where} at step {self.step}",
            FaultKind.AGENT_LOSS: f"agent loss: the torchrun agent of {where} is SIGKILLed at step "
                                  f"{self.step}",
            FaultKind.NODE_LOSS: f"node loss: {where}'s agent and workers are SIGKILLed at step "
                                 f"{self.step}",
        }.get(self.kind, "no fault")


def faults_from_env(environ: Mapping[str, str] | None = None) -> tuple[Fault, ...]:
    """The faults of this attempt: FAULTLENS_DEMO_FAULT (from the supervisor), then the item of
    FAULTLENS_DEMO_FAULTS for torchrun's restart count (none past the end of the list). A malformed
    value raises ValueError naming it."""
    env = os.environ if environ is None else environ
    faults: list[Fault] = []
    try:
        single = Fault.from_json(environment.DEMO_FAULT.raw(env))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{ENV_FAULT}: expected a JSON fault object: {exc}") from None
    if single.kind is not FaultKind.NONE:
        faults.append(single)
    text = environment.DEMO_FAULTS.raw(env)
    if not text:
        return tuple(faults)
    try:
        restart = int(environment.ATTEMPT.get(env) or env.get(ENV_RESTART_COUNT, "0"))
        schedule = json.loads(text)
        if not isinstance(schedule, list):
            raise ValueError("not a list")
        item = schedule[restart] if 0 <= restart < len(schedule) else []
        items = item if isinstance(item, list) else [item]
        faults.extend(Fault.from_dict(doc) for doc in items if doc)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{ENV_FAULTS}: expected a JSON list (indexed by {ENV_RESTART_COUNT}) of "
                         "fault objects or "
                         f"lists of them: {exc}") from None
    return tuple(faults)
