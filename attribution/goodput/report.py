"""The goodput report's parts: sliding-window points, stretches, per-attempt and per-incident
accounts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from faultlens.attribution.goodput.buckets import Bucket
from faultlens.attribution.goodput.clock import NS_PER_S, datetime_of
from faultlens.attribution.goodput.timeline import Timeline

# ----------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class WindowPoint:
    end: dt.datetime
    ettr: float  # productive seconds in (end - window, end] / window


@dataclass(frozen=True)
class Stretch:
    start: dt.datetime
    end: dt.datetime
    seconds: float
    buckets: Mapping[Bucket, float]  # what the stretch was spent on (non-zero buckets only)


@dataclass(frozen=True)
class AttemptAccount:
    attempt: int
    start: dt.datetime | None
    first_step_start: dt.datetime | None
    last_step_end: dt.datetime | None
    first_step: int | None
    last_step: int | None
    resume_point: int | None  # the step a later attempt went back to (None: the last attempt)
    steps_kept: int
    steps_lost: int
    incident_id: str | None  # the incident that stopped this attempt (its first decision's)
    incident_class: str | None
    cause: str | None
    action: str | None
    # buckets inside [this attempt's start, the next attempt's start)
    seconds: Mapping[Bucket, float]


@dataclass(frozen=True)
class IncidentCost:
    incident_id: str
    attempt: int | None
    live: bool  # its decision was issued while the job ran (else: a batch pass afterwards)
    incident_class: str | None
    cause: str | None
    action: str | None
    lost_work_s: float
    # unproductive seconds from the attempt's last step end to the next attempt's first step
    downtime_s: float

    @property
    def total_s(self) -> float:
        return self.lost_work_s + self.downtime_s


@dataclass(frozen=True, eq=False)
class GoodputReport:
    job_id: str
    start: dt.datetime
    end: dt.datetime
    wall_s: float
    productive_s: float
    ettr: float
    # seconds per unproductive bucket; sums with productive_s to wall_s
    badput: Mapping[Bucket, float]
    steps_kept: int
    steps_lost: int
    window_s: float
    sliding: tuple[WindowPoint, ...]
    min_sliding_ettr: float | None
    longest_unproductive: Stretch | None
    attempts: tuple[AttemptAccount, ...]
    incidents: tuple[IncidentCost, ...]
    # incident and decision ids from a batch pass after the fact: not on the timeline
    offline: tuple[str, ...]
    timeline: Timeline = field(repr=False)

    def cumulative_ettr(self, points: int = 200) -> list[tuple[dt.datetime, float]]:
        """ETTR from the window's start up to `points` evenly spaced times: (time, productive /
        elapsed).
        """
        start, end = self.timeline.start_ns, self.timeline.end_ns
        times = np.linspace(start, end, max(points, 2)).astype(np.int64)[1:]
        productive = self.timeline.cumulative(Bucket.PRODUCTIVE, times)
        return [(datetime_of(int(t)), float(p) / ((int(t) - start) / NS_PER_S))
                for t, p in zip(times, productive, strict=True)]

    def to_dict(self, *, include_timeline: bool = False) -> dict[str, Any]:
        def iso(value: dt.datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        def buckets(values: Mapping[Bucket, float]) -> dict[str, float]:
            return {str(k): round(v, 6) for k, v in values.items()}

        result: dict[str, Any] = {
            "job_id": self.job_id,
            "start": iso(self.start),
            "end": iso(self.end),
            "wall_s": round(self.wall_s, 6),
            "productive_s": round(self.productive_s, 6),
            "ettr": round(self.ettr, 6),
            "badput_s": buckets(self.badput),
            "steps_kept": self.steps_kept,
            "steps_lost": self.steps_lost,
            "window_s": round(self.window_s, 6),
            "min_sliding_ettr": None
            if self.min_sliding_ettr is None
            else round(self.min_sliding_ettr, 6),
            "sliding": [{"end": iso(p.end), "ettr": round(p.ettr, 6)} for p in self.sliding],
            "longest_unproductive": None
            if self.longest_unproductive is None
            else {
                "start": iso(self.longest_unproductive.start),
                "end": iso(self.longest_unproductive.end),
                "seconds": round(self.longest_unproductive.seconds, 6),
                "buckets": buckets(self.longest_unproductive.buckets),
            },
            "attempts": [
                {
                    "attempt": a.attempt,
                    "start": iso(a.start),
                    "first_step_start": iso(a.first_step_start),
                    "last_step_end": iso(a.last_step_end),
                    "first_step": a.first_step,
                    "last_step": a.last_step,
                    "resume_point": a.resume_point,
                    "steps_kept": a.steps_kept,
                    "steps_lost": a.steps_lost,
                    "incident_id": a.incident_id,
                    "class": a.incident_class,
                    "cause": a.cause,
                    "action": a.action,
                    "seconds": buckets(a.seconds),
                }
                for a in self.attempts
            ],
            "incidents": [
                {
                    "incident_id": c.incident_id,
                    "attempt": c.attempt,
                    "live": c.live,
                    "class": c.incident_class,
                    "cause": c.cause,
                    "action": c.action,
                    "lost_work_s": round(c.lost_work_s, 6),
                    "downtime_s": round(c.downtime_s, 6),
                    "total_s": round(c.total_s, 6),
                }
                for c in self.incidents
            ],
            "offline": list(self.offline),
        }
        if include_timeline:
            result["timeline"] = [
                {"start": iso(datetime_of(s)), "end": iso(datetime_of(e)), "bucket": str(b)}
                for s, e, b in self.timeline.runs()]
        return result
