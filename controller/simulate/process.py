"""process_events rows as the job-side collectors write them (interface 3 of the helper brief): exceptions from
error.json with tracebacks and fingerprints, exits from torchrun's report (exit code, signal), and the survivors'
secondary echoes (NCCL remote errors, gloo "Connection closed by peer" and timeouts, NCCL watchdog timeouts,
SIGTERM from torchrun), marked is_secondary the way the collector's classifier marks them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controller.simulate.cluster import RankPlace

NCCL_VERSION = "2.21.5"
PREFIX = "/opt/megatron"
_TORCH = "/usr/local/lib/python3.11/site-packages/torch"

# The call path of a Megatron-style training step, outermost first: (file, line, function, source line).
TRAIN_FRAMES: tuple[tuple[str, int, str, str], ...] = (
    (f"{PREFIX}/pretrain_gpt.py", 288, "<module>", "pretrain("),
    (f"{PREFIX}/megatron/training/training.py", 386, "pretrain",
     "iteration, num_floating_point_operations_so_far = train("),
    (f"{PREFIX}/megatron/training/training.py", 1389, "train", "train_step(forward_step_func,"),
    (f"{PREFIX}/megatron/training/training.py", 764, "train_step", "losses_reduced = forward_backward_func("),
    (f"{PREFIX}/megatron/core/pipeline_parallel/schedules.py", 1401,
     "forward_backward_pipelining_without_interleaving", "output_tensor, num_tokens = forward_step("),
)
FORWARD_FRAMES = (
    (f"{PREFIX}/megatron/core/pipeline_parallel/schedules.py", 275, "forward_step",
     "output_tensor, loss_func = forward_step_func(data_iterator, model)"),
    (f"{PREFIX}/pretrain_gpt.py", 205, "forward_step", "output_tensor = model(tokens, position_ids, attention_mask,"),
    (f"{_TORCH}/nn/modules/module.py", 1773, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
    (f"{PREFIX}/megatron/core/transformer/transformer_layer.py", 412, "forward",
     "attention_output_with_bias = self.self_attention("),
)
COMM_FRAMES = (
    (f"{PREFIX}/megatron/core/distributed/param_and_grad_buffer.py", 368, "start_grad_sync",
     "self.grad_reduce_handle = torch.distributed.all_reduce("),
    (f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
    (f"{_TORCH}/distributed/distributed_c10d.py", 2806, "all_reduce", "work = group.allreduce([tensor], opts)"),
)
CKPT_FRAMES = (
    (f"{PREFIX}/megatron/training/training.py", 1466, "train",
     "save_checkpoint_and_time(iteration, model, optimizer,"),
    (f"{PREFIX}/megatron/training/checkpointing.py", 412, "save_checkpoint", "dist_checkpointing.save(state_dict,"),
    (f"{_TORCH}/distributed/checkpoint/filesystem.py", 470, "_write_files_from_queue",
     'with create_stream(file_name, "wb") as stream:'),
)
DATA_FRAMES = (
    (f"{PREFIX}/megatron/training/training.py", 1389, "train", "train_step(forward_step_func,"),
    (f"{PREFIX}/pretrain_gpt.py", 180, "get_batch", "batch = get_batch_on_this_tp_rank(data_iterator)"),
    (f"{PREFIX}/megatron/training/utils.py", 318, "get_batch_on_this_tp_rank", "data = next(data_iterator)"),
    (f"{_TORCH}/utils/data/dataloader.py", 733, "__next__", "data = self._next_data()"),
    (f"{PREFIX}/megatron/core/datasets/gpt_dataset.py", 242, "__getitem__",
     "text, document_ids = self._query_document_sample_shuffle_index(idx)"),
)

CUDA_TAIL = ("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
             "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
             "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def format_traceback(frames: Sequence[tuple[str, int, str, str]], exc_line: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        lines.append(f'  File "{file}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(exc_line)
    return "\n".join(lines)


_NUMBER_RE = re.compile(r"0x[0-9a-fA-F]+|\d+")
_LINE_RE = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


def fingerprint(exception_type: str, traceback: str) -> str:
    """Stable across ranks, nodes and attempts: the exception type and the frames (file and function, no line
    numbers, no addresses), not the message values that differ per rank."""
    frames = ";".join(f"{file}:{func}" for file, func in _LINE_RE.findall(traceback or ""))
    text = f"{exception_type}|{frames}"
    return hashlib.sha1(_NUMBER_RE.sub("N", text).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExceptionSpec:
    exception_type: str
    message: str
    frames: tuple[tuple[str, int, str, str], ...]
    kind: str = "exception"  # or "oom"

    @property
    def traceback(self) -> str:
        return format_traceback(self.frames, f"{self.exception_type}: {self.message}")

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.exception_type, self.traceback)


def cuda_error(text: str, frames: Sequence[tuple[str, int, str, str]] = TRAIN_FRAMES + FORWARD_FRAMES) -> ExceptionSpec:
    return ExceptionSpec("torch.AcceleratorError", f"CUDA error: {text}\n{CUDA_TAIL}", tuple(frames))


def nccl_error(reason: str, nccl_error_name: str, detail: str, last_error: str) -> ExceptionSpec:
    message = (f"NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, {reason} "
               f"(run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}\n"
               f"{nccl_error_name}: {detail}\nLast error:\n{last_error}")
    return ExceptionSpec("torch.distributed.DistBackendError", message, TRAIN_FRAMES + COMM_FRAMES)


class RowFactory:
    """Builds process_events rows with the identity columns of one job attempt."""

    def __init__(self, cluster: str, job_id: str) -> None:
        self.cluster = cluster
        self.job_id = job_id

    def _base(self, ts: int, place: RankPlace, attempt: int, pid: int) -> dict[str, Any]:
        return {"ts": ts, "cluster": self.cluster, "node": place.node.name, "job_id": self.job_id,
                "attempt": attempt, "rank": place.rank, "local_rank": place.local_rank,
                "gpu_index": place.gpu.index, "gpu_uuid": place.gpu.uuid, "pci_bus_id": place.gpu.pci_bus_id,
                "pid": pid}

    def start(self, ts: int, place: RankPlace, attempt: int, pid: int) -> dict[str, Any]:
        return {**self._base(ts, place, attempt, pid), "kind": "start", "source": "supervisor",
                "is_secondary": False}

    def exception(self, ts: int, place: RankPlace, attempt: int, pid: int, spec: ExceptionSpec, step: int | None,
                  error_file: str | None = None) -> dict[str, Any]:
        return {**self._base(ts, place, attempt, pid), "kind": spec.kind, "source": "error_json",
                "exception_type": spec.exception_type, "message": spec.message, "traceback": spec.traceback,
                "fingerprint": spec.fingerprint, "is_secondary": False, "step": step,
                "error_file": error_file or self.error_file(place, attempt)}

    def error_file(self, place: RankPlace, attempt: int) -> str:
        return f"/var/log/torchelastic/{self.job_id}/attempt_{attempt}/{place.local_rank}/error.json"

    def exit(self, ts: int, place: RankPlace, attempt: int, pid: int, *, exit_code: int, signal: str | None,
             secondary: bool, step: int | None = None) -> dict[str, Any]:
        if signal:
            message = f"Signal {-exit_code} ({signal}) received by PID {pid}"
        else:
            message = f"exitcode: {exit_code} (pid: {pid})"
        return {**self._base(ts, place, attempt, pid), "kind": "exit", "source": "torchrun_report",
                "exit_code": exit_code, "signal": signal, "message": message, "is_secondary": secondary,
                "step": step, "error_file": None if signal else self.error_file(place, attempt)}

    def comm_error(self, ts: int, place: RankPlace, attempt: int, pid: int, message: str, *, secondary: bool,
                   source: str = "stderr", step: int | None = None) -> dict[str, Any]:
        return {**self._base(ts, place, attempt, pid), "kind": "comm_error", "source": source,
                "message": message, "is_secondary": secondary, "step": step}

    def watchdog(self, ts: int, place: RankPlace, attempt: int, pid: int, *, seq: int, op: str, numel: int,
                 timeout_ms: int, ran_ms: int) -> dict[str, Any]:
        message = (f"[Rank {place.rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
                   f"OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {ran_ms} "
                   "milliseconds before timing out.")
        return {**self._base(ts, place, attempt, pid), "kind": "watchdog_timeout", "source": "stderr",
                "message": message, "is_secondary": True}


def gloo_closed_by_peer(peer_ip: str, port: int) -> str:
    return (f"RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
            f"[{peer_ip}]:{port}. This is typically caused by a remote worker crashing.")


def gloo_timeout(ms: int, op: str = "recv") -> str:
    return (f"RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
            f"{ms}ms for {op} operation to complete")


def nccl_remote_error(peer_ip: str, port: int, my_ip: str, hca: int) -> str:
    return (f"NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote process exited "
            f"or there was a network error, NCCL version {NCCL_VERSION}\nncclRemoteError: A call failed possibly due "
            "to a network error or a remote process exiting prematurely.\nLast error:\n"
            f"NET/IB : Got completion from peer {peer_ip}<{port}> with status=12 opcode=0 len=0 vendor err 129 "
            f"(Recv) localGid ::ffff:{my_ip} remoteGids::ffff:{peer_ip} hca mlx5_{hca}")


def nccl_async_event(hca: int, event: str) -> str:
    return f"NCCL WARN NET/IB : mlx5_{hca}:1 Got async event : {event}"
