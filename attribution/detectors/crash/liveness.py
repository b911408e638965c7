"""What the ranks' own progress says about a failure: which ranks closed their step timer, which
were still alive after it, when they last completed a step, and the step a rank died in."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from faultlens.attribution.detectors.crash.rows import row_value
from faultlens.attribution.hardware import as_datetime
from faultlens.attribution.reading.telemetry import Telemetry


def closed_ranks(heartbeats: pd.DataFrame, attempt: int | None) -> dict[int, dt.datetime]:
    """rank -> when its step timer closed (its first heartbeat that says so) in `attempt`: the rank
    ended its training loop itself (after the last step, or unwinding from an error of its own)."""
    if heartbeats.empty or "closed" not in heartbeats.columns or "rank" not in heartbeats.columns:
        return {}
    rows = heartbeats[heartbeats["closed"].fillna(False).astype(bool) & heartbeats["rank"].notna()]
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    if rows.empty:
        return {}
    first = rows.groupby("rank")["ts"].min()
    return {
        int(rank): ts
        for rank, ts in ((r, as_datetime(t)) for r, t in first.items())
        if ts is not None
    }


def alive_after(heartbeats: pd.DataFrame, attempt: int | None, ranks: list[int],
                after: dt.datetime) -> list[int]:
    """Ranks whose heartbeat shows them running (not closed) after `after`."""
    if heartbeats.empty or not ranks:
        return []
    rows = heartbeats[heartbeats["rank"].isin(ranks) & (heartbeats["ts"] > after)]
    if attempt is not None:
        rows = rows[rows["attempt"] == attempt]
    if "closed" in rows.columns:
        rows = rows[~rows["closed"].fillna(False).astype(bool)]
    return sorted(int(r) for r in rows["rank"].dropna().unique())


def last_progress(
    telemetry: Telemetry, attempt: int | None, ranks: list[int]
) -> dt.datetime | None:
    """When any of `ranks` last completed a step in `attempt` (heartbeats and step rows)."""
    times = []
    for frame, column in ((telemetry.heartbeats, "step_ts"), (telemetry.steps, "end_ts")):
        if frame.empty or column not in frame.columns:
            continue
        rows = frame[frame["rank"].isin(ranks)]
        if attempt is not None:
            rows = rows[rows["attempt"] == attempt]
        value = rows[column].max() if not rows.empty else None
        if value is not None and value is not pd.NaT and value == value:
            times.append(as_datetime(value))
    times = [t for t in times if t is not None]
    return max(times) if times else None


def death_step(telemetry: Telemetry, attempt: int | None, rank: int | None) -> int | None:
    """The step a rank was in when it failed: the heartbeat's step in progress, else one past its
    last completed step (heartbeat or step rows) of that attempt."""
    if rank is None:
        return None
    candidates = []
    beats = telemetry.heartbeats
    if not beats.empty:
        rows = beats[beats["rank"] == rank]
        if attempt is not None:
            rows = rows[rows["attempt"] == attempt]
        if not rows.empty:
            latest = rows.sort_values(["ts", "steps"], kind="stable").iloc[-1]
            current, last = row_value(latest, "current_step"), row_value(latest, "step")
            if bool(row_value(latest, "in_step")) and current is not None:
                candidates.append(int(current))
            elif last is not None:
                candidates.append(int(last) + 1)
    from_rows = _failure_step(telemetry.steps, attempt, rank)
    if from_rows is not None:
        candidates.append(from_rows)
    # nothing of its own survived (a kill loses unflushed rows): synchronous peers' progress
    if not candidates:
        peers = telemetry.steps if attempt is None or telemetry.steps.empty else \
            telemetry.steps[telemetry.steps["attempt"] == attempt]
        if not peers.empty and peers["step"].notna().any():
            candidates.append(int(peers["step"].max()) + 1)
    return max(candidates) if candidates else None


def _failure_step(steps: pd.DataFrame, attempt: int | None, rank: int | None) -> int | None:
    """The step a rank was in when it failed: one past the last step any rank of the attempt
    completed (synchronous
    training: no rank completes a step the failed one never finished; the failed rank's own last
    rows may never have been flushed, a SIGKILL loses its step timer's buffer)."""
    if steps.empty or rank is None or "step" not in steps.columns:
        return None
    rows = steps
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    if "phase" in rows.columns:
        rows = rows[rows["phase"].astype(object).fillna("train") != "checkpoint"]
    if rows.empty or rows["step"].dropna().empty:
        return None
    return int(rows["step"].max()) + 1
