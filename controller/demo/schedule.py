"""The demo's fault schedule: one fault per attempt, in the order the issue asks for, each placed a
few steps after the step the attempt resumes from."""

from __future__ import annotations

from collections.abc import Sequence

from faultlens.controller.demo.faults import Fault, FaultKind
from faultlens.controller.supervisor.run import AttemptFault

#: (kind, steps after the resume step, which rank) for attempts 0, 1, 2, ...
DEMO_FAULTS: tuple[tuple[FaultKind, int, int], ...] = (
    (FaultKind.STRAGGLER, 6, 3),
    (FaultKind.HANG, 6, 1),
    (FaultKind.SIGKILL, 6, 2),
    (FaultKind.GPU_LOST, 6, 2),
    (FaultKind.SOFTWARE, 5, 0),
)


def demo_fault(attempt: int, nodes: Sequence[str], start_step: int, nproc_per_node: int,
               straggler_extra_s: float = 0.25) -> AttemptFault:
    """The fault for `attempt` (none after the schedule ends)."""
    if attempt >= len(DEMO_FAULTS):
        return AttemptFault()
    kind, offset, rank = DEMO_FAULTS[attempt]
    step = start_step + offset
    node = nodes[rank // nproc_per_node]
    if kind is FaultKind.GPU_LOST:
        fault = Fault(kind, step=step, node=node)
        return AttemptFault(
            env={"FAULTLENS_DEMO_FAULT": fault.to_json()},
            gpu_node=node,
            gpu_local_rank=0,
            gpu_fault="lost",
            description=fault.describe(),
        )
    fault = Fault(kind, step=step, rank=None if kind is FaultKind.SOFTWARE else rank,
                  extra_s=straggler_extra_s if kind is FaultKind.STRAGGLER else 0.0)
    # a GPU that overheats and throttles: the slowdown shows in NVML too
    if kind is FaultKind.STRAGGLER:
        return AttemptFault(
            env={"FAULTLENS_DEMO_FAULT": fault.to_json()},
            gpu_node=node,
            gpu_local_rank=rank % nproc_per_node,
            gpu_fault="hot",
            description=fault.describe(),
        )
    return AttemptFault(env={"FAULTLENS_DEMO_FAULT": fault.to_json()}, description=fault.describe())
