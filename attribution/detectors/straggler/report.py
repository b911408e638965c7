"""The straggler detector's types: one attempt's step scores, the job's remaining time, one finding;
the shared constants."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from faultlens.attribution.detectors.straggler.decompose import Decomposition
from faultlens.attribution.detectors.straggler.layout import Layout
from faultlens.attribution.detectors.straggler.whatif import WhatIf
from faultlens.attribution.incident import Evidence

SYSTEMIC_MIN_NODES = 3
MAX_PEER_NODES = 63  # peers whose GPU samples are compared with the culprit's
UNKNOWN_SHARE_REPORTED = 0.02  # unknown sections holding at least this share of step time are named
# the data-parallel sync: collectives across replicas whose waiting is a replica's slack behind the
# slowest one
SYNC_OPS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})


@dataclass(frozen=True)
class StepScores:
    """Per-step, per-rank scores of one attempt (frames: index step, columns rank)."""

    compute: pd.DataFrame  # own-work seconds
    # worker ratio: compute / the same place in the other replicas (or own history)
    ratio: pd.DataFrame
    flagged: pd.DataFrame  # worker slow this step (bool)
    sections: dict[str, pd.DataFrame]  # own-work section -> seconds
    layout: Layout
    parts: Decomposition
    step_s: np.ndarray  # observed step time per step (median over ranks)
    start_ts: pd.Series  # per step: earliest start
    end_ts: pd.Series  # per step: latest end
    comm_sections: dict[str, str] = field(default_factory=dict)  # comm section -> collective kind
    # unknown section -> share of step time
    unknown_sections: dict[str, float] = field(default_factory=dict)
    # seconds in data-parallel sync collectives (SYNC_OPS), where timed
    sync: pd.DataFrame | None = None
    ends: pd.DataFrame | None = None  # each rank's step end, epoch seconds (where sync is timed)
    # the job's remaining time, from the length it declares (None: unknown)
    remaining: Remaining | None = None

    @property
    def group_kind(self) -> str:
        return self.parts.comparison


@dataclass(frozen=True)
class Remaining:
    """The job's remaining run time: the steps it declares it will run (the ranks rows' total_steps,
    which the step timer writes from StepTimer(total_steps=), $FAULTLENS_TOTAL_STEPS or `faultlens
    run --total-steps`) less the steps done, times the recent step time (the median of the last
    window's steps, the slowdown included)."""

    seconds: float
    total_steps: int
    last_step: int
    step_s: float

    def details(self) -> dict[str, float | int]:
        return {"remaining_s": round(self.seconds, 3), "total_steps": self.total_steps,
                "remaining_from_step": self.last_step, "remaining_step_s": round(self.step_s, 6)}


def remaining_time(ranks_table: pd.DataFrame, attempt: int | None, last_step: int,
                   recent_step_s: float) -> Remaining | None:
    """The job's remaining time from its declared total_steps (the ranks rows of `attempt`, else of
    the job; ranks that disagree: the least), or None when nothing declares it or the step time is
    unknown."""
    if ranks_table is None or ranks_table.empty or "total_steps" not in ranks_table.columns:
        return None
    rows = ranks_table
    if attempt is not None and "attempt" in rows.columns and (rows["attempt"] == attempt).any():
        rows = rows[rows["attempt"] == attempt]
    declared = pd.to_numeric(rows["total_steps"], errors="coerce")
    declared = declared[declared > 0]
    if declared.empty or not np.isfinite(recent_step_s) or recent_step_s <= 0:
        return None
    total = int(declared.min())
    left = max(0, total - int(last_step) - 1)  # steps numbered from 0: the last one is total - 1
    return Remaining(left * float(recent_step_s), total, int(last_step), float(recent_step_s))


@dataclass
class StragglerFinding:
    """One detected slowdown before it becomes an incident."""

    kind: str  # rank, stage, replica, moving, systemic
    step: int  # the step at which it was first persistent
    ranks: list[int]
    key: str
    window: list[int] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    whatif: WhatIf | None = None
    where: dict = field(default_factory=dict)  # stage / replica / nodes of a systemic finding


def ranks_text(ranks: list[int]) -> str:
    return f"{ranks[:8]}{'...' if len(ranks) > 8 else ''}"
