"""Progress judged against the peers: is every rank of an attempt idle together?

A slow phase (a checkpoint save, an evaluation) gets a wide allowance because it takes what it
takes, and its peers wait for it in the next collective. The allowance is for a rank that is
working. Each rank's heartbeat carries its own work so far (collectors/training/heartbeat.py
RankUsage: CPU seconds of its process and of its DataLoader workers plus the time it spent blocked
in disk I/O, bytes its process read and wrote). When over the last `window_s` seconds no rank
completed or began a step, and no rank did work (CPU under `idle_cpu_share` of the window, fewer
than `idle_io_bytes` moved), the peers are blocked (in a collective or a barrier) and so is the rank
they wait for: the slow phase is no excuse. A rank still saving or evaluating moves its counters,
however slowly (a CPU hog slows it, it does not stop it), and keeps the allowance. Which rank the
others wait for is for the flight-recorder dumps to say (a peer blocked in a collective the late
rank has not reached).

Ranks without usage in their heartbeats (a writer from before it existed), with no beat as old as
the window, or whose beats stopped (a process gone or frozen) give no evidence: the allowance holds.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pandas as pd

from faultlens.attribution.hardware import as_datetime


@dataclass(frozen=True)
class IdleTogether:
    """Every live rank of an attempt idle over the same window: what was seen."""

    window_s: float
    ranks: int
    cpu_s: float  # the most CPU one rank used over the window
    io_bytes: int  # the most bytes one rank moved over the window
    text: str


def idle_together(
    beats: pd.DataFrame,
    observed: dt.datetime,
    window_s: float,
    idle_cpu_share: float,
    idle_io_bytes: int,
    slow_phases: tuple[str, ...] = (),
) -> IdleTogether | None:
    """The evidence that every live rank of `beats` (one attempt's heartbeats) sat idle and in
    place over the `window_s` seconds before `observed`, else None."""
    if beats.empty or window_s <= 0 or not {"cpu_s", "io_bytes"} <= set(beats.columns):
        return None
    start = observed - dt.timedelta(seconds=window_s)
    ordered = beats.assign(_ts=pd.to_datetime(beats["ts"], utc=True)).sort_values(
        ["_ts"], kind="stable")
    most_cpu, most_io, ranks = 0.0, 0, 0
    places: list[str] = []
    for rank, group in ordered.groupby("rank"):
        last = group.iloc[-1]
        if bool(pd.notna(last["closed"]) and last["closed"]):
            continue  # this rank steps no more (it ended): not a peer that waits
        known = group[group["cpu_s"].notna() & group["io_bytes"].notna()]
        before = known[known["_ts"] <= pd.Timestamp(start)]
        if before.empty or known.empty:
            return None  # not seen (with its usage) for the whole window
        first, newest = before.iloc[-1], known.iloc[-1]
        newest_ts = as_datetime(newest["_ts"])
        if newest_ts is None or newest_ts < start + dt.timedelta(seconds=window_s / 2):
            return None  # its beats stopped: gone or frozen, not seen idle
        if _place(first) != _place(newest):
            return None  # it began or completed a step in the window
        span = (newest_ts - as_datetime(first["_ts"])).total_seconds()  # type: ignore[operator]
        cpu = float(newest["cpu_s"]) - float(first["cpu_s"])
        moved = int(newest["io_bytes"]) - int(first["io_bytes"])
        if cpu >= idle_cpu_share * max(span, window_s) or moved >= idle_io_bytes:
            return None  # it works: a slow phase in progress, not a stop
        most_cpu, most_io, ranks = max(most_cpu, cpu), max(most_io, moved), ranks + 1
        places.append(_where(int(rank), newest, slow_phases))
    if ranks == 0:
        return None
    text = (
        f"every rank idle together for {window_s:.3g}s ({ranks} ranks, at most {most_cpu:.3f}s "
        f"CPU and {most_io} bytes each; idle: under {idle_cpu_share:g} of a core and "
        f"{idle_io_bytes} bytes): " + "; ".join(places[:8]) + ("; ..." if len(places) > 8 else "")
    )
    return IdleTogether(window_s, ranks, most_cpu, most_io, text)


def _place(beat: pd.Series) -> tuple[object, ...]:
    """Where a rank is: its last completed step, the step in progress, and its phase."""
    return tuple(
        None if pd.isna(beat.get(c)) else beat.get(c)
        for c in ("step", "current_step", "in_step", "phase")
    )


def _where(rank: int, beat: pd.Series, slow_phases: tuple[str, ...]) -> str:
    if bool(pd.notna(beat.get("in_step")) and beat.get("in_step")):
        phase = beat.get("phase")
        phase = phase if isinstance(phase, str) else "train"
        mark = " (untimed phase allowance withheld)" if phase in slow_phases else ""
        return f"rank {rank} in {phase} step {_int(beat.get('current_step'))}{mark}"
    return f"rank {rank} between steps after step {_int(beat.get('step'))}"


def _int(value: object) -> str:
    return "?" if value is None or pd.isna(value) else str(int(value))  # type: ignore[arg-type]
