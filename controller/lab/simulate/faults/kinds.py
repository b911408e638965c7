"""What a fault is: its mode, the target it hits, the outcome an injector reports, and the FaultKind
that names its class, cause, expected action and injector."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from faultlens.controller.lab.fault_labels import ExpectedAction, FaultLabel, LabelClass
from faultlens.controller.lab.simulate.world import World


class Mode(StrEnum):
    CRASH = "crash"  # processes exit; the job restarts
    HANG = "hang"  # progress stops; the watchdog (or a dead node) ends the attempt
    HEALTH = "health"  # a critical GPU health event, the job keeps running
    STRAGGLER = "straggler"  # something slows the job down for a while
    NUMERICS = "numerics"  # silent corruption: the job runs on until the supervisor stops it


@dataclass
class Target:
    """What a fault hits, chosen when it is prepared (the placement of the running attempt)."""

    t: int
    node: Any
    gpu: int
    rank: int
    onset: int | None = None
    until: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    label: FaultLabel
    # when the attempt's last process was gone (None: the job keeps running)
    down_ts: int | None = None
    exclude: str | None = None  # the node a supervisor takes out
    restart_delay_s: float = 0.0
    # a deterministic bug that fires again at the same step after a plain restart
    repeat: Target | None = None
    restore_before: int | None = None  # restore a checkpoint older than this (corruption)


Prepare = Callable[[World, np.random.Generator, int], Target]
Strike = Callable[[World, np.random.Generator, "FaultKind", Target], Outcome]


@dataclass(frozen=True)
class FaultKind:
    kind: str
    category: str
    weight: float
    mode: Mode
    label_class: LabelClass
    cause: str
    action: ExpectedAction
    strike: Strike
    prepare: Prepare | None = None
