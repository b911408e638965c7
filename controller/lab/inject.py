"""The in-process fault injector: loaded into every training process by the campaign's sitecustomize
(put on PYTHONPATH by the runner), so the user's script is not changed. It follows the step through
the project's step timer (its public hook, step_timer.add_hook) and fires the plan's faults at the
chosen rank, node, attempt and step:

    exception        raise `params.type` (default RuntimeError) with `params.message`
    signal           this process sends itself `params.signal` (SIGSEGV, SIGABRT, SIGKILL, ...)
    abort            os.abort()
    stuck            sleep `params.seconds` (default 3600) outside any collective
    gil_hog          a thread enters a C call that holds the GIL (catastrophic regex
                     backtracking) for good
    oom              raise torch.OutOfMemoryError with the CUDA caching allocator's message
    gpu              the node's recorded GPU timeline `params.timeline` fires
                     (gpu/<node>.fire); unless `params.die` is false, the process then fails
                     as CUDA does after it (`params.message`)
    slow             sleep `params.extra_s` in section `params.section` (default forward)
                     from `step` on
    nan              every module's output becomes NaN from `step` on (global forward hook):
                     the loss, the gradients and the weights go NaN as in a real divergence
    loss_spike       a corrupt batch: the model's input is scaled by `params.factor` (default
                     1000) at `step` (to until_step when given): the loss spikes, the
                     gradients with it
    bitflip          one bit (`params.bit`, default 30: a float32's top exponent bit; 22: the top
                     mantissa bit) of element `params.index` (default 0) of parameter `params.param`
                     (its place in model.parameters(), default 0) flips, as a hardware fault does:
                     `params.target` param: in the parameter, after this rank's optimizer step;
                     grad: in its gradient before the all_reduce (a tensor hook); activation: in
                     the output of leaf module `params.layer` (default 0: the model's first) of
                     this rank's forward; at `step`, every step to until_step when given
                     (repeatedly on the same GPU)
    skip_collective  the first `params.op` (default all_reduce) of group `params.group`
                     (world | sub) at `step` returns without running
    slow_checkpoint  TieredCheckpointer.save first spends `params.extra_s` writing to a slow disk
                     (1 MiB pieces, a pause after each; every rank that matches): a save that
                     works, slowly (a save that only sleeps reads as a stop when every rank idles)
    external_signal, node_loss, agent_loss: the rank writes triggers/<fault>-a<attempt>.json at
    `step` and
                     the runner carries the fault out from outside (controller/lab/actions.py)

Nothing here raises into the training process except the faults themselves.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

from faultlens import environment
from faultlens.controller.lab.plan import (
    EXTERNAL_KINDS,
    FaultSpec,
    InjectionPlan,
    log_injection,
    write_json,
)

log = logging.getLogger(__name__)

ONE_SHOT = (
    frozenset({"exception", "signal", "abort", "stuck", "gil_hog", "oom", "gpu"}) | EXTERNAL_KINDS
)
CUDA_LOST = ("CUDA error: unspecified launch failure\nCUDA kernel errors might be asynchronously "
             "reported at some "
             "other API call, so the stacktrace below might be incorrect.")
OOM_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 "
            "GiB of which "
            "1.19 GiB is free. Of the allocated memory 74.30 GiB is allocated by PyTorch, and 2.10 "
            "GiB is reserved "
            "by PyTorch but unallocated.")


class WorkerInjector:
    """The faults of one training process (one rank of one attempt)."""

    def __init__(
        self, plan: InjectionPlan, lab_dir: Path, environ: dict[str, str] | None = None
    ) -> None:
        env = os.environ if environ is None else environ
        self.plan = plan
        self.lab_dir = lab_dir
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.node = environment.NODE.raw(env)
        self.attempt = int(environment.ATTEMPT.raw(env) or "0")
        self.node_rank = int(env["GROUP_RANK"]) if env.get("GROUP_RANK", "").isdigit() else None
        self.step: int | None = None
        self.phase = "train"
        self.stage: int | None = None
        self.fired: set[str] = set()
        self.faults = tuple(f for f in plan.faults if f.applies_to_attempt(self.attempt))

    # ------------------------------------------------------------------ matching

    def _mine(self, fault: FaultSpec) -> bool:
        return fault.targets(
            rank=self.rank,
            node=self.node,
            node_rank=self.node_rank,
            local_rank=self.local_rank,
            stage=self.stage,
        )

    def _active(self, fault: FaultSpec) -> bool:
        """A continuous fault (slow, nan, slow_checkpoint) holds from its step to until_step."""
        if self.step is None or not self._mine(fault) or self.step < fault.step:
            return False
        return fault.until_step is None or self.step < fault.until_step

    def _log(self, fault: FaultSpec, detail: str = "") -> None:
        if fault.id not in self.fired:
            self.fired.add(fault.id)
            log_injection(
                self.lab_dir,
                fault,
                attempt=self.attempt,
                node=self.node,
                rank=self.rank,
                step=self.step,
                by="worker",
                detail=detail,
            )

    # ------------------------------------------------------------------ hooks

    def on_step(self, number: int, phase: str, parallel: Any) -> None:
        self.step, self.phase = int(number), str(phase)
        pp_rank = getattr(parallel, "pp_rank", None)
        self.stage = int(pp_rank) if pp_rank is not None else None
        if self.phase != "train":
            return
        for fault in self.faults:
            if (
                fault.kind in ONE_SHOT
                and fault.id not in self.fired
                and self.step == fault.step
                and self._mine(fault)
            ):
                self._fire(fault)

    def on_section(self, name: str) -> None:
        if self.phase != "train":
            return
        for fault in self.faults:
            if (
                fault.kind == "slow"
                and name == fault.params.get("section", "forward")
                and self._active(fault)
            ):
                self._log(fault, f"+{fault.params.get('extra_s', 0.1)} s in {name}")
                time.sleep(float(fault.params.get("extra_s", 0.1)))

    def on_checkpoint(self) -> None:
        for fault in self.faults:
            if fault.kind == "slow_checkpoint" and self._active(fault):
                self._log(fault, f"+{fault.params.get('extra_s', 5.0)} s per checkpoint")
                slow_disk_write(float(fault.params.get("extra_s", 5.0)))

    def spike_factor(self) -> float | None:
        """The output scale of an active loss_spike fault (one step unless until_step says more)."""
        if self.phase != "train" or self.step is None:
            return None
        for fault in self.faults:
            if fault.kind != "loss_spike" or not self._mine(fault) or self.step < fault.step:
                continue
            if self.step < (fault.until_step if fault.until_step is not None else fault.step + 1):
                return float(fault.params.get("factor", 1000.0))
        return None

    def flips(self, target: str) -> list[FaultSpec]:
        """The bitflip faults of `target` (param, grad) that fire at this step."""
        if self.phase != "train" or self.step is None:
            return []
        found = []
        for fault in self.faults:
            if fault.kind != "bitflip" or fault.params.get("target", "param") != target:
                continue
            if not self._mine(fault) or self.step < fault.step:
                continue
            if self.step < (fault.until_step if fault.until_step is not None else fault.step + 1):
                found.append(fault)
        return found

    def nan_active(self) -> bool:
        return self.phase == "train" and any(
            f.kind == "nan" and self._active(f) for f in self.faults
        )

    def skip(self, op: str, group: Any) -> bool:
        for fault in self.faults:
            if fault.kind != "skip_collective" or fault.id in self.fired or self.step != fault.step:
                continue
            if not self._mine(fault) or op != fault.params.get("op", "all_reduce"):
                continue
            if (fault.params.get("group", "world") == "world") != _is_world(group):
                continue
            self._log(fault, f"skipped {op} ({fault.params.get('group', 'world')} group)")
            return True
        return False

    # ------------------------------------------------------------------ the faults

    def _fire(self, fault: FaultSpec) -> None:
        kind, params = fault.kind, fault.params
        if kind in EXTERNAL_KINDS:
            # the runner logs the moment it acts; this line marks the step
            self._log(fault, "trigger")
            write_json(
                self.lab_dir / "triggers" / f"{fault.id}-a{self.attempt}.json",
                {
                    "fault": fault.id,
                    "pid": os.getpid(),
                    "agent_pid": os.getppid(),
                    "node": self.node,
                    "rank": self.rank,
                    "step": self.step,
                    "attempt": self.attempt,
                    "ts": time.time(),
                },
            )
            if params.get("wait_s"):
                time.sleep(float(params["wait_s"]))  # hold the step until the runner has acted
            return
        if kind == "gpu":
            self._log(fault, f"GPU timeline {params.get('timeline')}")
            write_json(
                self.lab_dir / "gpu" / f"{self.node}.fire",
                {"timeline": params.get("timeline"), "gpu": self.local_rank, "ts": time.time()},
            )
            if not params.get("die", True):
                return
            # the node's NVML source samples the failure first
            time.sleep(float(params.get("settle_s", 1.5)))
            raise RuntimeError(params.get("message", CUDA_LOST))
        self._log(fault)
        if kind == "exception":
            raise _exception(
                str(params.get("type", "RuntimeError")),
                str(params.get("message", "injected fault")),
            )
        if kind == "signal":
            os.kill(os.getpid(), getattr(signal, str(params.get("signal", "SIGSEGV"))))
            time.sleep(5.0)  # a stop or a caught signal: the process goes on from here
        elif kind == "abort":
            os.abort()
        elif kind == "stuck":
            time.sleep(float(params.get("seconds", 3600.0)))
        elif kind == "gil_hog":
            threading.Thread(target=_hold_gil, name="gil-hog", daemon=True).start()
            time.sleep(0.5)  # the hog takes the GIL; this thread stops at its next bytecode
        elif kind == "oom":
            import torch

            raise torch.OutOfMemoryError(str(params.get("message", OOM_TEXT)))


def _exception(type_name: str, message: str) -> BaseException:
    import builtins

    cls = getattr(builtins, type_name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = RuntimeError
    return cls(message)


def _hold_gil() -> None:
    """re's matcher holds the GIL for the whole match; this one backtracks for hours."""
    re.fullmatch(r"(a|aa)+$b", "a" * 64)


def _is_world(group: Any) -> bool:
    if group is None:
        return True
    try:
        import torch.distributed as dist

        return (
            group is dist.GroupMember.WORLD or dist.get_world_size(group) == dist.get_world_size()
        )
    except Exception:
        return False


# ---------------------------------------------------------------------- installing the hooks

_INJECTOR: WorkerInjector | None = None
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "all_gather_object",
    "all_to_all",
    "reduce",
    "gather",
    "scatter",
)


def install_worker(plan: InjectionPlan, lab_dir: Path) -> WorkerInjector:
    global _INJECTOR
    injector = _INJECTOR = WorkerInjector(plan, lab_dir)
    write_json(
        lab_dir / "pids" / f"a{injector.attempt}-{injector.node}-r{injector.rank}.json",
        {
            "pid": os.getpid(),
            "agent_pid": os.getppid(),
            "node": injector.node,
            "rank": injector.rank,
            "local_rank": injector.local_rank,
            "attempt": injector.attempt,
            "ts": time.time(),
        },
    )
    if not injector.faults:
        return injector
    _patch_timer(injector)
    _patch_checkpointer(injector)
    _patch_distributed(injector)
    if any(f.kind in ("nan", "loss_spike") for f in injector.faults):
        _patch_modules(injector)
    if any(f.kind == "bitflip" for f in injector.faults):
        _patch_bitflips(injector)
    return injector


class TimerHook:
    """The injector on the step timer's public hook (collectors/training/step_timer.py
    `add_hook`): every step's begin and every section's entry, after the timer's own
    bookkeeping, so a sleep fired here counts in that step and section."""

    def __init__(self, injector: WorkerInjector) -> None:
        self.injector = injector

    def step_begun(self, timer: Any, number: int, phase: str) -> None:
        self.injector.on_step(number, phase, timer.parallel)

    def section_entered(self, timer: Any, name: str) -> None:
        self.injector.on_section(name)


def _patch_timer(injector: WorkerInjector) -> None:
    from faultlens.collectors.training import step_timer

    step_timer.add_hook(TimerHook(injector))


def _patch_checkpointer(injector: WorkerInjector) -> None:
    from faultlens.controller.checkpoints import tiered

    save = tiered.TieredCheckpointer.save

    def _save(self, step, state, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("force") or self.due(step) or self.durable_due(step):
            injector.on_checkpoint()
        return save(self, step, state, **kwargs)

    tiered.TieredCheckpointer.save = _save


def _patch_distributed(injector: WorkerInjector) -> None:
    if not any(f.kind == "skip_collective" for f in injector.faults):
        return
    import torch.distributed as dist

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def wrapper(*args, _original=original, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            if injector.skip(_name, kwargs.get("group")):
                return None
            return _original(*args, **kwargs)

        setattr(dist, name, wrapper)


def _patch_modules(injector: WorkerInjector) -> None:
    import torch

    def poison(module, inputs, output):  # type: ignore[no-untyped-def]
        if isinstance(output, torch.Tensor) and module.training and injector.nan_active():
            for fault in injector.faults:
                if fault.kind == "nan":
                    injector._log(fault, "outputs become NaN")
            return output * float("nan")
        return None

    depth = [0]  # module calls in progress: the outermost one is the model's forward

    def corrupt(module, inputs):  # type: ignore[no-untyped-def]
        depth[0] += 1
        factor = injector.spike_factor() if depth[0] == 1 and module.training else None
        if factor is None or not inputs or not isinstance(inputs[0], torch.Tensor):
            return None
        for fault in injector.faults:
            if fault.kind == "loss_spike":
                injector._log(fault, f"batch x{factor:g}")
        return (inputs[0] * factor, *inputs[1:])

    def leave(module, inputs, output):  # type: ignore[no-untyped-def]
        depth[0] = max(0, depth[0] - 1)
        return None

    torch.nn.modules.module.register_module_forward_hook(poison)
    if any(f.kind == "loss_spike" for f in injector.faults):
        torch.nn.modules.module.register_module_forward_pre_hook(corrupt)
        torch.nn.modules.module.register_module_forward_hook(leave)


def flip_bit(tensor: Any, index: int, bit: int) -> None:
    """Flip bit `bit` of element `index` of `tensor` (flattened) in place."""
    import torch

    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    width = 8 * tensor.element_size()
    mask = 1 << (bit % width)
    if mask >= 1 << (width - 1):
        mask -= 1 << width  # the sign bit, as a signed integer of that width
    with torch.no_grad():
        flat = tensor.view(-1).view(ints)
        flat[index % flat.numel()] ^= mask


def _patch_bitflips(injector: WorkerInjector) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer, args, kwargs):  # type: ignore[no-untyped-def]
        for fault in injector.flips("param"):
            params = [p for g in optimizer.param_groups for p in g["params"]]
            target = params[int(fault.params.get("param", 0)) % len(params)]
            bit, index = int(fault.params.get("bit", 30)), int(fault.params.get("index", 0))
            flip_bit(target.data, index, bit)
            injector._log(fault, f"parameter {fault.params.get('param', 0)}[{index}] bit {bit}")
        return None

    hooked = [False]  # the first module called in training mode is the model (outermost)

    def on_forward(module, inputs):  # type: ignore[no-untyped-def]
        if hooked[0] or not module.training:
            return None
        params = list(module.parameters())
        if not params:
            return None
        hooked[0] = True
        for fault in injector.faults:
            if fault.kind != "bitflip" or fault.params.get("target", "param") != "grad":
                continue
            param = params[int(fault.params.get("param", 0)) % len(params)]

            def corrupt(grad, _fault=fault):  # type: ignore[no-untyped-def]
                if _fault not in injector.flips("grad"):
                    return None
                grad = grad.clone()
                bit, index = int(_fault.params.get("bit", 30)), int(_fault.params.get("index", 0))
                flip_bit(grad, index, bit)
                injector._log(_fault, f"gradient of parameter {_fault.params.get('param', 0)}"
                                      f"[{index}] bit {bit}, before the all_reduce")
                return grad

            param.register_hook(corrupt)
        _hook_activations(injector, module)
        return None

    register_optimizer_step_post_hook(after_step)
    torch.nn.modules.module.register_module_forward_pre_hook(on_forward)


def _hook_activations(injector: WorkerInjector, model: Any) -> None:
    """The activation bit flips: a forward hook on the chosen leaf module of `model` that flips
    one bit of its output in the forward of the fault's steps (the rest of the output, and the
    gradient through it, unchanged)."""
    import torch

    leaves = [m for m in model.modules() if not list(m.children())]
    for fault in injector.faults:
        if fault.kind != "bitflip" or fault.params.get("target") != "activation" or not leaves:
            continue
        layer = int(fault.params.get("layer", 0))
        module = leaves[layer % len(leaves)]

        def corrupt(module, inputs, output, _fault=fault, _layer=layer):  # type: ignore[no-untyped-def]
            if not isinstance(output, torch.Tensor) or not module.training:
                return None
            if _fault not in injector.flips("activation"):
                return None
            bit, index = int(_fault.params.get("bit", 30)), int(_fault.params.get("index", 0))
            flipped = output.detach().clone()
            flip_bit(flipped, index, bit)
            mask = torch.zeros(output.numel(), dtype=torch.bool)
            mask[index % output.numel()] = True
            injector._log(_fault, f"activation of layer {_layer}[{index}] bit {bit}")
            return torch.where(mask.view(output.shape).to(output.device), flipped, output)

        module.register_forward_hook(corrupt)


def install_from_env() -> None:
    """The sitecustomize entry: a training process under a campaign gets its injector; nothing else
    changes.
    """
    lab = environment.LAB_DIR.get()
    if not lab:
        return
    try:
        if "RANK" in os.environ and "LOCAL_RANK" in os.environ:
            plan = InjectionPlan.from_env()
            if plan is not None:
                install_worker(plan, Path(lab))
        elif not environment.NODE.is_set() and environment.LAB_SUPERVISOR.raw() == "1":
            from faultlens.controller.lab.nvml import install_supervisor_gpus

            plan = InjectionPlan.from_env()
            if plan is not None:
                install_supervisor_gpus(plan, Path(lab))
    except Exception as exc:  # the campaign's own failure must show, but never as the job's failure
        log.warning("faultlens lab: injector not installed: %s", exc)
        with Path(lab, "injector-errors.log").open("a") as handle:
            handle.write(f"{os.getpid()}: {type(exc).__name__}: {exc}\n")


def slow_disk_write(seconds: float, piece: int = 1 << 20, pause_s: float = 0.25) -> None:
    """A save to a slow disk: `piece` bytes written, then a pause, for `seconds` (a scratch file,
    removed after)."""
    import tempfile

    end = time.monotonic() + seconds
    data = b"\0" * piece
    with tempfile.TemporaryFile() as scratch:
        while time.monotonic() < end:
            scratch.write(data)
            scratch.flush()
            scratch.seek(0)
            time.sleep(min(pause_s, max(0.0, end - time.monotonic())))
