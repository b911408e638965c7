"""What happened to a job, in one word (`faultlens jobs`): its state judged from the store.

- completed: every torchrun agent of the last attempt exited 0 by itself (every rank exited 0
  after its last step; the supervisor's agent_exit rows), whatever came after in its teardown;
- stopped: the last attempt's decision escalated: the job was stopped for a human;
- restarting: the last attempt's decision was a failover, a restart in place or a drain, and the
  next attempt has not shown up yet;
- running: telemetry within `running_within_s` of now, and none of the above;
- failed: an agent of the last attempt exited non-zero or was killed (the supervisor's stop
  included), or the last attempt had an incident, and nothing was decided that ends it (a job error
  before any step; a plain torchrun job);
- unknown: its telemetry stopped with no exit and no incident (a job that died silently, or a
  store that holds only part of it).

A notify is never a state: the job kept running.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from faultlens.attribution.reading.store import Store


class JobState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    RESTARTING = "restarting"
    UNKNOWN = "unknown"


_ENDS_ATTEMPT = {"failover", "restart", "drain"}


@dataclass(frozen=True)
class AgentExit:
    attempt: int
    node: str | None
    exit_code: int | None
    by_supervisor: bool  # the supervisor stopped it (a teardown), not an exit of its own


def agent_exits(store: Store, job_id: str) -> tuple[list[AgentExit], dict[int, set[str]]]:
    """The supervisor's agent_exit rows of the job, and the nodes it launched per attempt (its
    `start` rows without a rank); both empty for a job it did not run."""
    try:
        rows = store.query(
            "SELECT coalesce(attempt, 0)::BIGINT AS attempt, node, kind, exit_code, "
            "coalesce(is_secondary, false) AS by_us FROM process_events WHERE job_id = ? "
            "AND (kind = 'agent_exit' OR (kind = 'start' AND rank IS NULL))",
            [job_id],
        ).to_pylist()
    except Exception:  # a store without process_events: nothing known
        return [], {}
    launched: dict[int, set[str]] = {}
    exits = []
    for r in rows:
        if r["kind"] == "start":
            launched.setdefault(int(r["attempt"]), set()).add(r["node"])
        else:
            exits.append(AgentExit(int(r["attempt"]), r["node"], r["exit_code"], bool(r["by_us"])))
    return exits, launched


def judge_job_state(
    *,
    last_attempt: int,
    last_ts: dt.datetime | None,
    exits: Iterable[AgentExit],
    launched: Mapping[int, set[str]],
    incidents: Iterable[Mapping[str, Any]],
    decisions: Iterable[Mapping[str, Any]],
    now: dt.datetime,
    running_within_s: float,
) -> JobState:
    """The job's state (module docstring) from its last attempt's agent exits (every node
    `launched` must have exited 0), incidents and decisions (rows with `attempt` and, for
    decisions, `action`, in issue order)."""
    mine = [e for e in exits if e.attempt == last_attempt]
    ended_ok = {e.node for e in mine if e.exit_code == 0 and not e.by_supervisor}
    every_node = launched.get(last_attempt) or {e.node for e in mine}
    if mine and every_node <= ended_ok and len(ended_ok) == len({e.node for e in mine}):
        return JobState.COMPLETED
    ending = [
        d
        for d in decisions
        if (d.get("attempt") or 0) >= last_attempt and d.get("action") != "notify"
    ]
    if ending:
        action = ending[-1].get("action")
        if action == "escalate":
            return JobState.STOPPED
        if action in _ENDS_ATTEMPT:
            return JobState.RESTARTING
    if (
        last_ts is not None
        and (now - last_ts).total_seconds() <= running_within_s
        # an agent the supervisor stopped with no decision ending the attempt: the job is over (a
        # job error judged before torchrun's own teardown ended its agents)
        and not any(e.exit_code not in (None, 0) or e.by_supervisor for e in mine)
    ):
        return JobState.RUNNING
    if any(e.exit_code != 0 for e in mine):
        return JobState.FAILED
    if any((i.get("attempt") or 0) >= last_attempt for i in incidents):
        return JobState.FAILED
    return JobState.UNKNOWN
