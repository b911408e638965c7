"""The timeline: every instant of a job's wall time in exactly one bucket."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from faultlens.attribution.goodput.buckets import BUCKETS, PRIORITY, Bucket, GoodputError
from faultlens.attribution.goodput.clock import NS_PER_S

_INDEX = {bucket: i for i, bucket in enumerate(BUCKETS)}  # a bucket's label in Timeline.labels

# ---------------------------------------------------------------------------------------------- the
# timeline


@dataclass(frozen=True, eq=False)
class Timeline:
    """The window cut into elementary segments [bounds[i], bounds[i+1]) with one bucket each."""

    # int64 ns, strictly increasing, bounds[0] = window start, bounds[-1] = window end
    bounds: np.ndarray
    labels: np.ndarray  # int8 index into BUCKETS, len(bounds) - 1
    _cumulative: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def start_ns(self) -> int:
        return int(self.bounds[0])

    @property
    def end_ns(self) -> int:
        return int(self.bounds[-1])

    def seconds(self) -> dict[Bucket, float]:
        widths = np.diff(self.bounds).astype(np.float64) / NS_PER_S
        totals = np.bincount(self.labels, weights=widths, minlength=len(BUCKETS))
        return {bucket: float(totals[i]) for i, bucket in enumerate(BUCKETS)}

    def _cum(self, bucket: Bucket) -> np.ndarray:
        index = _INDEX[bucket]
        if index not in self._cumulative:
            widths = (np.where(self.labels == index, np.diff(self.bounds), 0).astype(np.float64)
                      / NS_PER_S)
            self._cumulative[index] = np.concatenate([[0.0], np.cumsum(widths)])
        return self._cumulative[index]

    def cumulative(self, bucket: Bucket, at_ns: np.ndarray | int) -> np.ndarray:
        """Seconds of `bucket` from the window's start up to each time in `at_ns` (clipped to the
        window).
        """
        t = np.clip(np.asarray(at_ns, dtype=np.int64), self.bounds[0], self.bounds[-1])
        cum = self._cum(bucket)
        i = np.clip(np.searchsorted(self.bounds, t, side="right") - 1, 0, len(self.labels) - 1)
        inside = (self.labels[i] == _INDEX[bucket]).astype(np.float64)
        return cum[i] + (t - self.bounds[i]).astype(np.float64) / NS_PER_S * inside

    def between(self, start_ns: int, end_ns: int) -> dict[Bucket, float]:
        """Seconds of every bucket inside [start_ns, end_ns] (clipped to the window)."""
        if end_ns <= start_ns:
            return {bucket: 0.0 for bucket in BUCKETS}
        ends = np.array([start_ns, end_ns], dtype=np.int64)
        return {bucket: float(np.diff(self.cumulative(bucket, ends))[0]) for bucket in BUCKETS}

    def runs(self) -> list[tuple[int, int, Bucket]]:
        """Maximal runs of one bucket: (start ns, end ns, bucket)."""
        if not len(self.labels):
            return []
        change = np.flatnonzero(np.diff(self.labels)) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change, [len(self.labels)]])
        return [(int(self.bounds[s]), int(self.bounds[e]), BUCKETS[int(self.labels[s])])
                for s, e in zip(starts, ends, strict=True)]


def _coverage(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which elementary segments of `bounds` lie inside at least one [start, end) interval."""
    n = len(bounds)
    if not len(starts):
        return np.zeros(n - 1, dtype=bool)
    opened = np.bincount(np.searchsorted(bounds, starts), minlength=n + 1)
    closed = np.bincount(np.searchsorted(bounds, ends), minlength=n + 1)
    return np.cumsum(opened - closed)[: n - 1] > 0


def build_timeline(intervals: Mapping[Bucket, tuple[np.ndarray, np.ndarray]], start_ns: int,
                   end_ns: int) -> Timeline:
    """Cut [start_ns, end_ns] by the intervals of every bucket; each segment takes the first bucket
    of PRIORITY that covers it, else UNKNOWN."""
    if end_ns <= start_ns:
        raise GoodputError("the window is empty (its end is not after its start)")
    clipped: dict[Bucket, tuple[np.ndarray, np.ndarray]] = {}
    points = [np.array([start_ns, end_ns], dtype=np.int64)]
    for bucket, (starts, ends) in intervals.items():
        s = np.clip(np.asarray(starts, dtype=np.int64), start_ns, end_ns)
        e = np.clip(np.asarray(ends, dtype=np.int64), start_ns, end_ns)
        keep = e > s
        clipped[bucket] = (s[keep], e[keep])
        points.extend((s[keep], e[keep]))
    bounds = np.unique(np.concatenate(points))
    labels = np.full(len(bounds) - 1, _INDEX[Bucket.UNKNOWN], dtype=np.int8)
    taken = np.zeros(len(bounds) - 1, dtype=bool)
    for bucket in PRIORITY:
        if bucket not in clipped:
            continue
        covered = _coverage(bounds, *clipped[bucket])
        fresh = covered & ~taken
        labels[fresh] = _INDEX[bucket]
        taken |= covered
    return Timeline(bounds=bounds, labels=labels)


