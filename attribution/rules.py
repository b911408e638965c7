"""Loading and validating the engine's rule files (rules/crash.yaml, rules/thresholds.yaml).

Rules are data: every file carries `format_version`, is validated with pydantic, and a bad file
fails fast with a RulesError naming the file, the key inside it and what was expected. The models
here are the only place the engine learns its thresholds and signatures from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from faultlens.attribution.incident import Cause
from faultlens.collectors.rule_loader import (
    RuleFileError,
    field_error,
    load_rule_file,
    read_document,
)
from faultlens.resources import rule_file, shipped_rule_file, shipped_rules_dir

# the packaged files; the loaders read faultlens.resources.rule_file(...) (FAULTLENS_RULES / --rules
# DIR first)
RULES_DIR = shipped_rules_dir()
CRASH_RULES_PATH = shipped_rule_file("crash.yaml")
THRESHOLDS_PATH = shipped_rule_file("thresholds.yaml")
SUPPORTED_FORMAT_VERSIONS = (1,)


class RulesError(RuleFileError):
    """A rule file is missing, unreadable or invalid: the message names the file, the key and the
    expectation.
    """


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def any_of(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex matching any of `patterns` (None for none)."""
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"a valid regular expression ({exc})") from None
    return value


# ---------------------------------------------------------------- crash.yaml


class CrashSignature(_Strict):
    """A known failure text: any of the regexes matching the primary failure gives `cause` with
    `confidence`.
    """

    id: str = Field(min_length=1)
    cause: Cause
    confidence: float = Field(ge=0.0, le=1.0)
    description: str = ""
    exception_type: str | None = None
    message: str | None = None
    traceback: str | None = None

    @field_validator("exception_type", "message", "traceback")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        return None if value is None else _check_regex(value)

    @model_validator(mode="after")
    def _has_pattern(self) -> CrashSignature:
        if not (self.exception_type or self.message or self.traceback):
            raise ValueError("at least one of exception_type, message, traceback")
        return self

    def matches(
        self, exception_type: str | None, message: str | None, traceback: str | None
    ) -> bool:
        for pattern, text in ((self.exception_type, exception_type), (self.message, message),
                              (self.traceback, traceback)):
            if pattern and text and re.search(pattern, text):
                return True
        return False


class HardwareWindow(_Strict):
    before_s: float = Field(ge=0.0)
    after_s: float = Field(ge=0.0)


class HardwareEventKind(_Strict):
    """A gpu_events kind that implicates hardware; for xid/sxid the XID catalog's component decides
    the cause.
    """

    kind: str = Field(min_length=1)
    cause: Cause | Literal["from_xid_catalog"]
    confidence: float = Field(ge=0.0, le=1.0)


class CrashRules(_Strict):
    format_version: int
    hardware_window: HardwareWindow
    hardware_event_kinds: tuple[HardwareEventKind, ...]
    xid_component_causes: dict[str, Cause | Literal["not_hardware"]]
    primary_signals: tuple[str, ...]
    termination_signals: tuple[str, ...]
    signal_notice_slack_s: float = Field(ge=0.0)
    # a node whose ranks said nothing while its torchrun agent still runs: how long to wait for the
    # agent's report (its workers' death) before reading the silence as a lost node
    silent_node_wait_s: float = Field(default=30.0, ge=0.0)
    # a Python exception's verdict waits this long for the other nodes' first reports (the same
    # exception there makes it the code's, not the node's)
    exception_peer_wait_s: float = Field(default=1.0, ge=0.0)
    secondary_patterns: tuple[str, ...]
    timeout_patterns: tuple[str, ...]
    # of the secondary texts, those that say the process was told to stop (a termination, not an
    # echo)
    termination_patterns: tuple[str, ...] = ()
    # texts of a rank that got a peer's message for another collective than it posted (a desync; the
    # rank that says so is a victim: attribution/detectors/desync.py)
    mismatch_patterns: tuple[str, ...] = ()
    # how long a reported mismatch with no rank apart yet waits for the ranks' last heartbeats
    # before it is reported without a culprit
    desync_wait_s: float = Field(default=3.0, ge=0.0)
    signatures: tuple[CrashSignature, ...]
    confidence: dict[str, float]
    evidence_limit: int = Field(ge=1)

    @field_validator(
        "secondary_patterns", "timeout_patterns", "termination_patterns", "mismatch_patterns"
    )
    @classmethod
    def _regexes(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            _check_regex(value)
        return values

    @field_validator("confidence")
    @classmethod
    def _confidences(cls, values: dict[str, float]) -> dict[str, float]:
        for key, value in values.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"confidence {key!r}: a number in [0, 1], got {value}")
        return values

    @model_validator(mode="after")
    def _unique_signature_ids(self) -> CrashRules:
        seen: set[str] = set()
        for signature in self.signatures:
            if signature.id in seen:
                raise ValueError(f"signature ids must be unique: {signature.id!r} appears twice")
            seen.add(signature.id)
        return self

    def conf(self, key: str, default: float = 0.5) -> float:
        return self.confidence.get(key, default)


# ---------------------------------------------------------------- thresholds.yaml


class ProgressThresholds(_Strict):
    k: float = Field(gt=1.0)
    floor_s: float = Field(ge=0.0)
    startup_floor_s: float = Field(ge=0.0)
    recent_steps: int = Field(ge=1)
    min_baseline_steps: int = Field(ge=1)
    warmup_steps: int = Field(ge=0)
    baseline_phases: tuple[str, ...]
    slow_phases: tuple[str, ...]
    slow_phase_k: float = Field(gt=0.0)
    slow_phase_floor_s: float = Field(default=600.0, ge=0.0)
    idle_cpu_share: float = Field(default=0.02, gt=0.0, le=1.0)
    idle_io_bytes: int = Field(default=1_048_576, gt=0)


class ClockEventBit(_Strict):
    mask: int = Field(gt=0)
    name: str
    cause: Cause


class StragglerGpuThresholds(_Strict):
    clock_event_bits: tuple[ClockEventBit, ...]
    min_event_fraction: float = Field(ge=0.0, le=1.0)
    hot_temp_c: float
    temp_delta_c: float = Field(ge=0.0)
    clock_drop_ratio: float = Field(gt=0.0, le=1.0)


class OutlierThresholds(_Strict):
    min_nodes: int = Field(ge=4)
    chi2_quantile: float = Field(gt=0.5, lt=1.0)
    random_state: int = 0


class WhatIfThresholds(_Strict):
    microbatches: int | None = Field(default=None, ge=1)  # None: inferred from the step timings
    # the data-parallel sync from the ranks' observed arrivals at it (their end_ts: hosts' clocks
    # must agree); false: the pipeline model alone
    sync_arrivals: bool = True


class StragglerThresholds(_Strict):
    phases: tuple[str, ...]
    exclude_sections: tuple[str, ...] = ()
    vocabulary_files: tuple[str, ...] = ()
    replica_min_fraction: float = Field(default=0.75, gt=0.0, le=1.0)
    min_step_slowdown: float = Field(default=1.1, ge=1.0)
    moving_min_step_slowdown: float = Field(default=1.1, ge=1.0)
    noise_k: float = Field(default=2.0, ge=0.0)
    whatif: WhatIfThresholds = WhatIfThresholds()
    warmup_steps: int = Field(ge=0)
    window_steps: int = Field(ge=2)
    min_window_steps: int = Field(ge=2)
    persistence: float = Field(gt=0.0, le=1.0)
    # With two replicas a worker is compared with one partner only: either of two healthy ranks is
    # the slower one in about half the steps, so a pair needs this stronger persistence (a sign
    # test, not a majority)
    pairwise_persistence: float = Field(default=0.9, gt=0.0, le=1.0)
    peer_z: float = Field(gt=0.0)
    min_ratio: float = Field(gt=1.0)
    mad_floor_frac: float = Field(gt=0.0)
    min_group_size: int = Field(ge=2)
    self_baseline_steps: int = Field(ge=2)
    node_fraction: float = Field(gt=0.0, le=1.0)
    moving_min_step_fraction: float = Field(gt=0.0, le=1.0)
    moving_min_distinct_ranks: int = Field(ge=2)
    stage_min_ratio: float = Field(gt=1.0)
    gpu: StragglerGpuThresholds
    outliers: OutlierThresholds

    @model_validator(mode="after")
    def _window(self) -> StragglerThresholds:
        if self.min_window_steps > self.window_steps:
            raise ValueError(f"min_window_steps at most window_steps ({self.window_steps})")
        return self


class HealthThresholds(_Strict):
    kinds: tuple[str, ...]
    recovery_actions: tuple[int, ...]
    leave_xid_kinds: tuple[str, ...]
    leave_scopes: tuple[Literal["gpu", "node"], ...]
    settle_s: float = Field(ge=0.0)


class EngineThresholds(_Strict):
    poll_interval_s: float = Field(gt=0.0)
    crash_settle_s: float = Field(ge=0.0)
    progress_check_s: float = Field(gt=0.0)
    straggler_check_s: float = Field(gt=0.0)
    retain_s: float = Field(gt=0.0)
    max_rows_per_table: int = Field(ge=1000)


class LossThresholds(_Strict):
    """NaN/Inf loss is always an incident; a spike is one when the step's loss (mean over its ranks)
    is at least spike_factor x the median of the previous window_steps steps (after
    min_history_steps); null: no spike rule."""

    spike_factor: float | None = Field(default=None, gt=1.0)
    window_steps: int = Field(default=20, ge=2)
    min_history_steps: int = Field(default=10, ge=2)
    # a spike is back to normal (an observation, no incident) when one of the next recover_steps
    # steps' loss is below recover_factor x the median; when none is, the loss diverged
    recover_steps: int = Field(default=3, ge=1)
    recover_factor: float = Field(default=3.0, gt=1.0)
    # a rank whose local gradient norm is at least grad_outlier_factor x its data-parallel peers'
    # median (or not finite while theirs are) is an outlier; outlier_steps such steps of one rank
    # in one attempt are a corruption that persists (fewer: an observation)
    grad_outlier_factor: float = Field(default=10.0, gt=1.0)
    outlier_steps: int = Field(default=2, ge=1)
    # a NaN/Inf loss on every rank (the all_reduce spreads one rank's) waits up to this long after
    # its first signal for the numerics probe's rows of that step, which say where it began
    nonfinite_settle_s: float = Field(default=5.0, ge=0.0)


class Thresholds(_Strict):
    format_version: int
    progress: ProgressThresholds
    straggler: StragglerThresholds
    health: HealthThresholds
    engine: EngineThresholds
    loss: LossThresholds = LossThresholds()


# ---------------------------------------------------------------- loading

_M = TypeVar("_M", bound=BaseModel)


def load_rules_file(path: str | Path, model: type[_M]) -> _M:
    """Read YAML at `path` and validate it against `model`; RulesError names the file, key and
    expectation.
    """
    return load_rule_file(
        path, model, error=RulesError, versions=SUPPORTED_FORMAT_VERSIONS, prepare=_with_base
    )


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _with_base(path: Path, document: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """`extends: other.yaml` (relative to this file): this document's keys override the base
    document's, deeply, so a variant (the demo's short hang floor, say) states only what differs."""
    base_name = document.pop("extends", None)
    if base_name is None:
        return document
    if not isinstance(base_name, str) or depth > 4:
        raise field_error(str(path), ["extends"], "expected the name of one rule file, got "
                                                  f"{base_name!r}", RulesError)
    base_path = path.parent / base_name
    base = read_document(base_path, error=RulesError)
    if not isinstance(base, dict):
        raise field_error(
            str(base_path), [], f"expected a mapping, got {type(base).__name__}", RulesError
        )
    return _merge(_with_base(base_path, base, depth + 1), document)


def load_crash_rules(path: str | Path | None = None) -> CrashRules:
    """rules/crash.yaml (or `path`), validated."""
    return load_rules_file(path or rule_file("crash.yaml"), CrashRules)


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """rules/thresholds.yaml (or `path`), validated."""
    return load_rules_file(path or rule_file("thresholds.yaml"), Thresholds)
