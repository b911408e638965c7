"""The software injectors: bugs on every rank, on one pipeline stage, with an application Xid, in a
dependency, and a data-dependent OOM; a deterministic bug fires again at the same step after a plain
restart."""

from __future__ import annotations

import numpy as np

from faultlens.controller.lab.simulate import process as proc
from faultlens.controller.lab.simulate import xid as xids
from faultlens.controller.lab.simulate.faults.endings import crash
from faultlens.controller.lab.simulate.faults.kinds import FaultKind, Outcome, Target
from faultlens.controller.lab.simulate.faults.pieces import add_xid, make_label
from faultlens.controller.lab.simulate.world import NS, World

SOFTWARE_BUGS: tuple[proc.ExceptionSpec, ...] = (
    proc.ExceptionSpec(
        "IndexError", "index 8192 is out of bounds for dimension 0 with size 8192", proc.DATA_FRAMES
    ),
    proc.ExceptionSpec(
        "RuntimeError",
        "The size of tensor a (4096) must match the size of tensor "
        "b (4097) at "
        "non-singleton dimension 1",
        proc.TRAIN_FRAMES + proc.FORWARD_FRAMES,
    ),
    proc.ExceptionSpec(
        "AttributeError",
        "'NoneType' object has no attribute 'main_grad'",
        proc.TRAIN_FRAMES + proc.COMM_FRAMES[:1],
    ),
    proc.ExceptionSpec("KeyError", "'attention_mask'", proc.DATA_FRAMES[:3]),
    proc.ExceptionSpec(
        "ValueError",
        "Expected input batch_size (2) to match target batch_size (1).",
        proc.TRAIN_FRAMES + proc.FORWARD_FRAMES[:2],
    ),
    proc.ExceptionSpec(
        "TypeError",
        "unsupported operand type(s) for *: 'NoneType' and 'float'",
        proc.TRAIN_FRAMES[:4],
    ),
)
DEPENDENCY_BUGS: tuple[proc.ExceptionSpec, ...] = (
    proc.ExceptionSpec("OSError", "[Errno 5] Input/output error: "
                                  "'/checkpoints/pretrain/iter_0004000/__3_1.distcp'",
                       proc.CKPT_FRAMES),
    proc.ExceptionSpec("OSError", "[Errno 122] Disk quota exceeded", proc.CKPT_FRAMES),
)
STAGE_BUG = proc.ExceptionSpec(
    "RuntimeError",
    "Expected all tensors to be on the same device, but found at least two "
    "devices, cuda:7 and cpu!",
    (
        *proc.TRAIN_FRAMES,
        (
            f"{proc.PREFIX}/megatron/core/models/gpt/gpt_model.py",
            301,
            "compute_language_model_loss",
            "loss = tensor_parallel.vocab_parallel_cross_entropy(logits, labels)",
        ),
    ),
)


def _software(
    world: World,
    rng: np.random.Generator,
    kind: FaultKind,
    target: Target,
    ranks: list[int],
    spec: proc.ExceptionSpec,
    *,
    notes: str = "",
    app_xid: int | None = None,
    label_ranks: tuple[int, ...] = (),
) -> Outcome:
    attempt = world.current
    t = target.t
    step = attempt.steps.step_at(t)
    primaries = [(r, spec, t + int(rng.uniform(0.0, 0.5) * NS)) for r in ranks]
    if app_xid is not None:
        for r, _, ts in primaries:
            place = attempt.placement.place(r)
            pid = attempt.pid(r)
            line = (xids.xid13(pid, "python3") if app_xid == 13 else
                    xids.xid31(pid, "python3", int(rng.integers(1 << 40, 1 << 46))))
            add_xid(
                world,
                rng,
                ts - int(rng.uniform(0.01, 0.2) * NS),
                place.node,
                place.local_rank,
                line,
            )
    down = crash(world, rng, t, primaries)
    repeat_of = target.extra.get("repeat_of")
    label = make_label(
        world,
        kind,
        target,
        nodes=(),
        ranks=label_ranks,
        gpus=(),
        end=down,
        step=step,
        notes=notes,
        repeat_of=repeat_of,
        extra={"fingerprint": spec.fingerprint},
    )
    repeat = None
    if repeat_of is None and rng.random() < 0.4:
        # a plain supervisor restarts once; the bug is deterministic and fires again at the same
        # step
        repeat = Target(
            0,
            target.node,
            target.gpu,
            target.rank,
            extra={
                **target.extra,
                "repeat_of": label.fault_id,
                "step": step,
                "spec": spec,
                "ranks": ranks,
                "app_xid": app_xid,
                "label_ranks": label_ranks,
                "notes": notes,
            },
        )
        delay = float(rng.uniform(60, 180))
    else:
        delay = float(rng.uniform(1800, 5400))  # a human reads the escalation and ships a fix
    return Outcome(label, down_ts=down, exclude=None, restart_delay_s=delay, repeat=repeat)


def _replay(world, rng, kind, target) -> Outcome | None:
    extra = target.extra
    if "spec" not in extra:
        return None
    return _software(world, rng, kind, target, extra["ranks"], extra["spec"], notes=extra["notes"],
                     app_xid=extra["app_xid"], label_ranks=extra["label_ranks"])


def strike_software_all(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    spec = SOFTWARE_BUGS[int(rng.integers(0, len(SOFTWARE_BUGS)))]
    return _software(
        world,
        rng,
        kind,
        target,
        list(range(world.current.placement.world_size)),
        spec,
        notes="same exception on every rank",
    )


def strike_software_app_xid(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    spec = proc.cuda_error("an illegal memory access was encountered")
    return _software(
        world,
        rng,
        kind,
        target,
        list(range(world.current.placement.world_size)),
        spec,
        app_xid=13 if rng.random() < 0.5 else 31,
        notes="a kernel bug: application Xid on every GPU",
    )


def strike_software_stage(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    placement = world.current.placement
    last = placement.pp_size - 1
    ranks = [r for r in range(placement.world_size) if int(placement.stage_of_rank()[r]) == last]
    return _software(world, rng, kind, target, ranks, STAGE_BUG, notes="bug in the loss: last "
                                                                       "pipeline stage only")


def strike_dependency(world, rng, kind, target):
    replay = _replay(world, rng, kind, target)
    if replay is not None:
        return replay
    spec = DEPENDENCY_BUGS[int(rng.integers(0, len(DEPENDENCY_BUGS)))]
    return _software(
        world,
        rng,
        kind,
        target,
        list(range(world.current.placement.world_size)),
        spec,
        notes="checkpoint storage failure",
    )


def strike_oom(world, rng, kind, target):
    """A data-dependent CUDA OOM on one rank (a long-sequence batch): software, no node to blame."""
    attempt = world.current
    place = attempt.placement.place(target.rank)
    free = float(rng.uniform(0.3, 2.5))
    spec = proc.ExceptionSpec(
        "torch.OutOfMemoryError",
        f"CUDA out of memory. Tried to allocate {rng.uniform(2, 8):.2f} GiB. GPU "
        f"{place.local_rank} has a total "
        f"capacity of 79.11 GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, "
        "this process has "
        f"{79.11 - free:.2f} GiB memory in use. Of the allocated memory {rng.uniform(68, 74):.2f} "
        "GiB is allocated by "
        "PyTorch, and 3.10 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large "
        "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        proc.TRAIN_FRAMES + proc.FORWARD_FRAMES)
    out = _software(
        world,
        rng,
        kind,
        target,
        [target.rank],
        spec,
        notes="out of memory on one rank",
        label_ranks=(target.rank,),
    )
    out.repeat = None
    return out
