"""The lifecycle the supervisor records (process_events rows of source "supervisor"): when it began
stopping an attempt (its teardown: whatever fails from then on is a termination, not a crash), the
torchrun agents it started and saw exit, and the agents lost to a signal it did not send."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd

from faultlens.attribution.detectors.crash.rows import attempt_keys, row_value, signal_of
from faultlens.attribution.hardware import as_datetime
from faultlens.collectors.sources.process_events import Source

TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGKILL"})


def teardown_starts(events: pd.DataFrame) -> dict[tuple[Any, Any], pd.Timestamp]:
    """(job or "", attempt or -1) -> when the supervisor began stopping that attempt (its first
    signal_sent row with a stopping signal)."""
    if events.empty or "kind" not in events.columns:
        return {}
    sent = events[events["kind"] == "signal_sent"]
    if sent.empty:
        return {}
    if "signal" in sent.columns:
        names = (
            sent["signal"]
            .astype(object)
            .map(
                lambda v: (
                    None
                    if v is None or v is pd.NA or v != v
                    else (
                        str(v).upper()
                        if str(v).upper().startswith("SIG")
                        else f"SIG{str(v).upper()}"
                    )
                )
            )
        )
        sent = sent[names.isin(TEARDOWN_SIGNALS) | names.isna()]
    if sent.empty:
        return {}
    return sent.groupby(attempt_keys(sent))["ts"].min().to_dict()


def in_teardown(events: pd.DataFrame, signal: pd.Series) -> pd.Series:
    """Rows at or after the start of their attempt's teardown by the supervisor (see
    at_or_after)."""
    starts = teardown_starts(events)
    if not starts:
        return pd.Series(False, index=events.index)
    return at_or_after(events, starts) & (events["kind"] != "signal_sent")


def stamped_in_whole_seconds(source: Any, ts: Any) -> bool:
    """One row's time has only whole-second resolution (see _whole_seconds)."""
    stamp = pd.to_datetime(ts, utc=True, errors="coerce")
    return source in Source.WHOLE_SECONDS and not pd.isna(stamp) and stamp == stamp.floor("s")


def _whole_seconds(events: pd.DataFrame) -> pd.Series:
    """Rows whose time has only whole-second resolution: of a source that stamps whole seconds
    (Source.WHOLE_SECONDS), stamped on a whole second."""
    if events.empty or "source" not in events.columns:
        return pd.Series(False, index=events.index)
    stamps = pd.to_datetime(events["ts"], utc=True, errors="coerce")
    return (events["source"].isin(Source.WHOLE_SECONDS) & stamps.notna()
            & (stamps == stamps.dt.floor("s"))).astype(bool)


def at_or_after(events: pd.DataFrame, starts: dict[tuple[Any, Any], pd.Timestamp]) -> pd.Series:
    """Rows at or after the start of their attempt's teardown (`starts`, see teardown_starts), each
    compared at the resolution of its own time: a row stamped to the whole second happened somewhere
    in that second, so it is at or after the start when its second is the start's second or later
    (torch's error file of an echo written 0.2 s after the supervisor's SIGTERM reads .000, before
    it)."""
    keys = attempt_keys(events)
    start = keys.map(lambda key: starts.get(key))
    second = start.map(lambda value: None if value is None else pd.Timestamp(value).floor("s"))
    start = start.where(~_whole_seconds(events), second)
    return (start.notna() & (events["ts"] >= start.where(start.notna(), events["ts"]))).astype(bool)


def lost_agents(
    events: pd.DataFrame,
) -> dict[tuple[Any, Any], list[tuple[str, dt.datetime, str, str]]]:
    """(job or "", attempt or -1) -> [(node, ts, signal, text)] of torchrun agents that died by a
    signal before the supervisor began stopping the attempt (the supervisor's agent_exit rows)."""
    if events.empty or "kind" not in events.columns:
        return {}
    exits = events[events["kind"] == "agent_exit"]
    if exits.empty:
        return {}
    starts = teardown_starts(events)
    found: dict[tuple[Any, Any], list[tuple[str, dt.datetime, str, str]]] = {}
    keys = attempt_keys(exits)
    for index, row in exits.iterrows():
        signal = signal_of(row)
        node = row_value(row, "node")
        ts = as_datetime(row["ts"])
        if signal is None or node is None or ts is None:
            continue
        key = keys.loc[index]
        start = starts.get(key)
        if start is not None and row["ts"] >= start:
            continue  # the supervisor was stopping it
        message = row_value(row, "message")
        text = (
            f"{node}: torchrun agent died by {signal}"
            + (f": {message}" if message else "")
            + " [supervisor]"
        )
        found.setdefault(key, []).append((str(node), ts, signal, text))
    return found


def running_agents(events: pd.DataFrame, job: str | None, attempt: int | None) -> set[str]:
    """Nodes whose torchrun agent the supervisor started in this attempt and has not seen exit."""
    if events.empty or "kind" not in events.columns:
        return set()
    rows = (
        events[
            events["kind"].isin(["start", "agent_exit"]) & (events.get("source") == "supervisor")
        ]
        if "source" in events.columns
        else events[events["kind"].isin(["start", "agent_exit"])]
    )
    if job is not None and "job_id" in rows.columns:
        rows = rows[rows["job_id"] == job]
    if attempt is not None and "attempt" in rows.columns:
        rows = rows[rows["attempt"] == attempt]
    started = {str(n) for n in rows.loc[rows["kind"] == "start", "node"].dropna()}
    exited = {str(n) for n in rows.loc[rows["kind"] == "agent_exit", "node"].dropna()}
    return started - exited


def ended_agents(events: pd.DataFrame, job: str | None, attempt: int | None) -> set[str]:
    """Nodes whose torchrun agent exited 0 in this attempt (the supervisor's agent_exit rows): they
    ended their part of the job."""
    if events.empty or "kind" not in events.columns:
        return set()
    exits = events[events["kind"] == "agent_exit"]
    if job is not None and "job_id" in exits.columns:
        exits = exits[exits["job_id"] == job]
    if attempt is not None and "attempt" in exits.columns:
        exits = exits[exits["attempt"] == attempt]
    if exits.empty or "exit_code" not in exits.columns:
        return set()
    codes = pd.to_numeric(exits["exit_code"], errors="coerce")
    return {str(n) for n in exits.loc[codes == 0, "node"].dropna()}
