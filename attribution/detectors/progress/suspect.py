"""A hang suspect (the job stopped making progress) and the default dump-set analyzer."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from faultlens.attribution.incident import Evidence, Incident


@dataclass(frozen=True)
class HangSuspect:
    """A job attempt that stopped making progress or reported collective timeouts."""

    job_id: str | None
    attempt: int | None
    since: dt.datetime  # the last progress (or the first timeout report)
    detected_by: str  # "progress" or "watchdog"
    last_step: int | None
    stalled_for_s: float | None
    threshold_s: float | None
    evidence: tuple[Evidence, ...]

    @property
    def incident_id(self) -> str:
        return Incident.make_id("collective_hang", self.job_id, self.attempt, self.last_step)


DumpRequester = Callable[[HangSuspect], pa.Table | None]
HangAnalyzer = Callable[[pa.Table, Sequence[int] | None], Any]


def default_analyzer() -> HangAnalyzer:
    from faultlens.attribution.detectors.hang import analyze_collectives

    return analyze_collectives


