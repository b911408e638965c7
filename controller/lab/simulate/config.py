"""Simulation settings: cluster shape, duration, seed, telemetry volume and fault rates.

All times are simulated. Defaults describe a large LLM pre-training job (tensor parallel inside a
node, pipeline stages across nodes, data parallel replicas) with failures accelerated well beyond
the Llama 3 rate, so that a simulated day holds enough faults to measure attribution: the *mix*
follows the Llama 3 table, the *rate* is `faults_per_day`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from faultlens.controller.lab.simulate.kind_names import KIND_NAMES
from faultlens.errors import FaultlensError


class ConfigError(ValueError, FaultlensError):
    """A simulation setting is out of range: the message names the setting and the expectation."""


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 16
    gpus_per_node: int = 8
    hours: float = 24.0
    seed: int = 0
    start: dt.datetime = dt.datetime(2026, 1, 5, 0, 0, 0, tzinfo=dt.UTC)
    cluster: str = "sim-cluster"
    job_id: str | None = None  # default: "pretrain-<seed>"
    # pipeline stages; default: 4, 2 or 1, whichever divides the node count
    pp_size: int | None = None
    # replacement nodes the supervisor can take; default: enough for every fault
    spare_nodes: int | None = None
    # telemetry volume
    step_seconds: float = 6.0  # mean training step time: sets the number of step rows
    sample_seconds: float = 10.0  # NVML sampling interval of the node agents
    # flight-recorder entries kept per rank in a dump (active + recent history)
    dump_entries_per_rank: int = 24
    # job behaviour
    checkpoint_every_steps: int = 500
    eval_every_steps: int = 1000
    # slow steps after every (re)start: compilation, autotuning, allocator warm-up
    warmup_steps: int = 5
    # NCCL watchdog timeout: how long a hang lasts before the ranks abort
    nccl_timeout_s: float = 600.0
    # a dump request arrives when no step completed for k x step time
    hang_dump_after_steps: float = 2.0
    # fault and noise rates (events per simulated day, whole cluster)
    faults_per_day: float = 24.0
    stragglers_per_day: float = 4.0
    benign_per_day: float = 40.0
    # inject these fault kinds in this order (cycling) at faults_per_day instead of drawing from the
    # Llama 3 mix
    fault_sequence: tuple[str, ...] = ()
    # the in-job numerics probe: every rank's parameter digest every this many steps (0: off; the
    # sdc_param_flip kind needs it)
    numerics_every: int = 0

    def __post_init__(self) -> None:
        def positive(name: str, value: float) -> None:
            if not value > 0:
                raise ConfigError(f"{name}: expected a positive number, got {value!r}")

        if self.nodes < 2:
            raise ConfigError(f"nodes: expected at least 2, got {self.nodes}")
        if not 1 <= self.gpus_per_node <= 16:
            raise ConfigError(f"gpus_per_node: expected 1..16, got {self.gpus_per_node}")
        for name in (
            "hours",
            "step_seconds",
            "sample_seconds",
            "nccl_timeout_s",
            "hang_dump_after_steps",
        ):
            positive(name, getattr(self, name))
        for name in ("faults_per_day", "stragglers_per_day", "benign_per_day"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: expected zero or more, got {getattr(self, name)!r}")
        if self.step_seconds < 0.5:
            raise ConfigError(f"step_seconds: expected at least 0.5, got {self.step_seconds}")
        if self.sample_seconds < 1:
            raise ConfigError(f"sample_seconds: expected at least 1, got {self.sample_seconds}")
        if self.pp_size is not None and (self.pp_size < 1 or self.nodes % self.pp_size):
            raise ConfigError(f"pp_size: expected a divisor of nodes ({self.nodes}), got "
                              f"{self.pp_size}")
        if self.start.tzinfo is None:
            raise ConfigError("start: expected a timestamp with a time zone")
        if self.fault_sequence:
            unknown = [k for k in self.fault_sequence if k not in KIND_NAMES]
            if unknown:
                raise ConfigError(f"fault_sequence: unknown fault kind {unknown[0]!r}; expected "
                                  "one of "
                                  f"{', '.join(sorted(KIND_NAMES))}")
        if self.numerics_every < 0:
            raise ConfigError(f"numerics_every: expected zero or more, got {self.numerics_every}")
        if "sdc_param_flip" in self.fault_sequence and not self.numerics_every:
            raise ConfigError("fault_sequence: sdc_param_flip needs numerics_every (the digests "
                              "that show it)")
        if self.dump_entries_per_rank < 4:
            raise ConfigError("dump_entries_per_rank: expected at least 4, got "
                              f"{self.dump_entries_per_rank}")

    @property
    def job(self) -> str:
        return self.job_id or f"pretrain-{self.seed}"

    @property
    def pipeline_stages(self) -> int:
        if self.pp_size is not None:
            return self.pp_size
        for stages in (4, 2):
            if self.nodes % stages == 0 and self.nodes // stages >= 2:
                return stages
        return 1

    @property
    def start_ns(self) -> int:
        return int(self.start.timestamp()) * 1_000_000_000 + self.start.microsecond * 1000

    @property
    def end_ns(self) -> int:
        return self.start_ns + int(self.hours * 3600 * 1e9)
