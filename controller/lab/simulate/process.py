"""process_events rows as the job-side collectors write them (interface 3 of the helper brief),
built by the process source's own functions (faultlens.collectors.sources.process_events) so
classification, secondary marking and fingerprints are exactly the collector's:

- an exception: one error.json row (torch's @record; its timestamp has whole seconds) and, from the
  node's torchrun failure report, an exit row and an error row (the report's `time` has whole
  seconds too; the failure with the earliest time on that node is its "Root Cause", which may be a
  survivor);
- a survivor stopped by torchrun: an exit row with SIGTERM (secondary, as the report parser marks
  it);
- a rank killed by the NCCL watchdog: the watchdog line on stderr (glog time, microseconds) and an
  exit with SIGABRT;
- error lines on stderr (NCCL errors, gloo "Connection closed by peer", gloo timeouts) as the stderr
  scanner keeps them; lines it does not recognise are not recorded.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from faultlens.collectors.artifacts.fingerprint import fingerprint, parse_traceback
from faultlens.collectors.sources.process_events import (
    EventContext,
    Source,
    error_row,
    exit_row,
    rows_from_stream,
    start_row,
)
from faultlens.collectors.sources.process_rules import load_process_rules
from faultlens.controller.lab.simulate.cluster import RankPlace

NCCL_VERSION = "2.21.5"
PREFIX = "/opt/megatron"
_TORCH = "/usr/local/lib/python3.11/site-packages/torch"

# The call path of a Megatron-style training step, outermost first: (file, line, function, source
# line).
TRAIN_FRAMES: tuple[tuple[str, int, str, str], ...] = (
    (f"{PREFIX}/pretrain_gpt.py", 288, "<module>", "pretrain("),
    (
        f"{PREFIX}/megatron/training/training.py",
        386,
        "pretrain",
        "iteration, num_floating_point_operations_so_far = train(",
    ),
    (f"{PREFIX}/megatron/training/training.py", 1389, "train", "train_step(forward_step_func,"),
    (
        f"{PREFIX}/megatron/training/training.py",
        764,
        "train_step",
        "losses_reduced = forward_backward_func(",
    ),
    (
        f"{PREFIX}/megatron/core/pipeline_parallel/schedules.py",
        1401,
        "forward_backward_pipelining_without_interleaving",
        "output_tensor, num_tokens = forward_step(",
    ),
)
FORWARD_FRAMES = (
    (f"{PREFIX}/megatron/core/pipeline_parallel/schedules.py", 275, "forward_step",
     "output_tensor, loss_func = forward_step_func(data_iterator, model)"),
    (f"{PREFIX}/pretrain_gpt.py", 205, "forward_step", "output_tensor = model(tokens, "
                                                       "position_ids, attention_mask,"),
    (f"{_TORCH}/nn/modules/module.py", 1773, "_wrapped_call_impl", "return self._call_impl(*args, "
                                                                   "**kwargs)"),
    (f"{PREFIX}/megatron/core/transformer/transformer_layer.py", 412, "forward",
     "attention_output_with_bias = self.self_attention("),
)
COMM_FRAMES = (
    (
        f"{PREFIX}/megatron/core/distributed/param_and_grad_buffer.py",
        368,
        "start_grad_sync",
        "self.grad_reduce_handle = torch.distributed.all_reduce(",
    ),
    (f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
    (
        f"{_TORCH}/distributed/distributed_c10d.py",
        2806,
        "all_reduce",
        "work = group.allreduce([tensor], opts)",
    ),
)
CKPT_FRAMES = (
    (
        f"{PREFIX}/megatron/training/training.py",
        1466,
        "train",
        "save_checkpoint_and_time(iteration, model, optimizer,",
    ),
    (
        f"{PREFIX}/megatron/training/checkpointing.py",
        412,
        "save_checkpoint",
        "dist_checkpointing.save(state_dict,",
    ),
    (
        f"{_TORCH}/distributed/checkpoint/filesystem.py",
        470,
        "_write_files_from_queue",
        'with create_stream(file_name, "wb") as stream:',
    ),
)
BARRIER_FRAMES = (
    (f"{PREFIX}/megatron/training/checkpointing.py", 397, "save_checkpoint",
     "torch.distributed.barrier(group=mpu.get_data_parallel_group_gloo())"),
    (f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
    (f"{_TORCH}/distributed/distributed_c10d.py", 4635, "barrier", "work.wait()"),
)
DATA_FRAMES = (
    (f"{PREFIX}/megatron/training/training.py", 1389, "train", "train_step(forward_step_func,"),
    (
        f"{PREFIX}/pretrain_gpt.py",
        180,
        "get_batch",
        "batch = get_batch_on_this_tp_rank(data_iterator)",
    ),
    (
        f"{PREFIX}/megatron/training/utils.py",
        318,
        "get_batch_on_this_tp_rank",
        "data = next(data_iterator)",
    ),
    (f"{_TORCH}/utils/data/dataloader.py", 733, "__next__", "data = self._next_data()"),
    (
        f"{PREFIX}/megatron/core/datasets/gpt_dataset.py",
        242,
        "__getitem__",
        "text, document_ids = self._query_document_sample_shuffle_index(idx)",
    ),
)

CUDA_TAIL = ("CUDA kernel errors might be asynchronously reported at some other API call, so the "
             "stacktrace below "
             "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
             "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


def format_traceback(frames: Sequence[tuple[str, int, str, str]], exc_line: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        lines.append(f'  File "{file}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(exc_line)
    return "\n".join(lines)


@dataclass(frozen=True)
class ExceptionSpec:
    exception_type: str
    message: str
    frames: tuple[tuple[str, int, str, str], ...]

    @property
    def traceback(self) -> str:
        return format_traceback(self.frames, f"{self.exception_type}: {self.message}")

    @property
    def fingerprint(self) -> str:
        """What the process source computes for this exception's error.json row."""
        parsed = parse_traceback(self.traceback)
        return fingerprint(
            self.exception_type, self.message, parsed.frames if parsed is not None else ()
        )


def cuda_error(
    text: str, frames: Sequence[tuple[str, int, str, str]] = TRAIN_FRAMES + FORWARD_FRAMES
) -> ExceptionSpec:
    return ExceptionSpec(
        "torch.AcceleratorError", f"CUDA error: {text}\n{CUDA_TAIL}", tuple(frames)
    )


def nccl_error(reason: str, nccl_error_name: str, detail: str, last_error: str) -> ExceptionSpec:
    message = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
               f"{reason} "
               f"(run with NCCL_DEBUG=INFO for details), NCCL version {NCCL_VERSION}\n"
               f"{nccl_error_name}: {detail}\nLast error:\n{last_error}")
    return ExceptionSpec("torch.distributed.DistBackendError", message, TRAIN_FRAMES + COMM_FRAMES)


NS = 1_000_000_000


def whole_seconds(ts: int) -> int:
    """torchrun's report `time` and error.json `timestamp` carry whole seconds."""
    return ts - ts % NS


class RowFactory:
    """Builds process_events rows of one job with the process source's row functions."""

    def __init__(self, cluster: str, job_id: str) -> None:
        self.cluster = cluster
        self.job_id = job_id
        self.rules = load_process_rules()

    def _context(self, place: RankPlace, attempt: int) -> EventContext:
        return EventContext(
            node=place.node.name, cluster=self.cluster, job_id=self.job_id, attempt=attempt
        )

    def start(self, ts: int, place: RankPlace, attempt: int, pid: int) -> dict[str, Any]:
        return start_row(
            self._context(place, attempt),
            ts,
            source=Source.SUPERVISOR,
            rank=place.rank,
            local_rank=place.local_rank,
            pid=pid,
        )

    def error_file(self, place: RankPlace, attempt: int) -> str:
        run_dir = f"/var/log/torchelastic/{self.job_id}_r7x2k9qa"
        return f"{run_dir}/attempt_{attempt}/{place.local_rank}/error.json"

    def exception(
        self, ts: int, place: RankPlace, attempt: int, pid: int, spec: ExceptionSpec
    ) -> dict[str, Any]:
        """The error.json row of a rank that raised."""
        parsed = parse_traceback(spec.traceback)
        return error_row(
            self._context(place, attempt),
            whole_seconds(ts),
            source=Source.ERROR_JSON,
            exception_type=spec.exception_type,
            message=spec.message,
            traceback=spec.traceback,
            parsed=parsed,
            rules=self.rules,
            rank=place.rank,
            local_rank=place.local_rank,
            error_file=self.error_file(place, attempt),
        )

    def report(
        self,
        ts: int,
        place: RankPlace,
        attempt: int,
        pid: int,
        *,
        exit_code: int,
        signal: str | None,
        spec: ExceptionSpec | None,
        root_cause: bool,
    ) -> list[dict[str, Any]]:
        """The rows of one failure in the node's torchrun report: the exit, and the error when it
        has a traceback.
        """
        common = {
            "rank": place.rank,
            "local_rank": place.local_rank,
            "pid": pid,
            "reported_root_cause": root_cause,
            "error_file": self.error_file(place, attempt) if spec is not None else None,
        }
        context = self._context(place, attempt)
        when = whole_seconds(ts)
        if spec is not None:
            last_line = spec.traceback.strip().splitlines()[-1].strip()
        else:
            last_line = f"Signal {-exit_code} ({signal}) received by PID {pid}"
        rows = [
            exit_row(
                context,
                when,
                source=Source.TORCHRUN_REPORT,
                exit_code=exit_code,
                signal=signal,
                is_secondary=signal == "SIGTERM",
                message=last_line,
                **common,
            )
        ]
        if spec is not None:
            parsed = parse_traceback(spec.traceback)
            rows.append(
                error_row(
                    context,
                    when,
                    source=Source.TORCHRUN_REPORT,
                    exception_type=parsed.exception_type,
                    message=parsed.message,
                    traceback=spec.traceback,
                    parsed=parsed,
                    rules=self.rules,
                    **common,
                )
            )
        return rows

    def stderr(self, ts: int, place: RankPlace, attempt: int, text: str,
               origin: str = "ProcessGroupNCCL.cpp:1640") -> list[dict[str, Any]]:
        """A message on the rank's stderr (glog-stamped first line, in the node's local time,
        continuation lines bare), as the process source's stderr scanner turns it into rows (none
        when it recognises nothing)."""
        moment = dt.datetime.fromtimestamp(ts / NS).astimezone()
        head, *rest = text.splitlines()
        stamp = (f"E{moment:%m%d %H:%M:%S}.{moment.microsecond:06d} {1000 + place.local_rank} "
                 f"{origin}] ")
        return rows_from_stream(
            [stamp + head, *rest],
            self._context(place, attempt),
            rank=place.rank,
            local_rank=place.local_rank,
            fallback_ts=ts,
            rules=self.rules,
        )

    def watchdog_line(
        self, rank: int, *, seq: int, op: str, numel: int, timeout_ms: int, ran_ms: int
    ) -> str:
        return (f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective operation "
                "timeout: "
                f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
                f"Timeout(ms)={timeout_ms}) "
                f"ran for {ran_ms} milliseconds before timing out.")


def gloo_closed_by_peer(peer_ip: str, port: int) -> str:
    return ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
            "closed by peer "
            f"[{peer_ip}]:{port}. This is typically caused by a remote worker crashing.")


def gloo_timeout(ms: int, op: str = "recv") -> str:
    return ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
            "Timed out waiting "
            f"{ms}ms for {op} operation to complete")


def nccl_remote_error(peer_ip: str, port: int, my_ip: str, hca: int) -> str:
    """What a survivor's NCCL watchdog thread logs when a peer's connection fails."""
    return ("Process group watchdog thread terminated with exception: NCCL error: remote process "
            "exited "
            f"or there was a network error, NCCL version {NCCL_VERSION}\nncclRemoteError: A call "
            "failed possibly due "
            "to a network error or a remote process exiting prematurely.\nLast error:\n"
            f"NET/IB : Got completion from peer {peer_ip}<{port}> with status=12 opcode=0 len=0 "
            "vendor err 129 "
            f"(Recv) localGid ::ffff:{my_ip} remoteGids::ffff:{peer_ip} hca mlx5_{hca}")


def nccl_async_event(hca: int, event: str) -> str:
    return f"NCCL WARN NET/IB : mlx5_{hca}:1 Got async event : {event}"
