"""`faultlens nodes`: where each node stands, from the store alone (no Slurm needed): drained by a
decision, kept out or returned by `faultlens node-check`, or a repeat offender.

    drained          a decision drained it (failover exclusion, drain) since its last check, or
                     its last check failed (kept drained)
    returned         its last check passed and resumed it (or found it serving)
    repeat_offender  its last check found it failed again within the window after a return: kept
                     out until a human returns it
    unknown          none of these (a check that acted on nothing)

Read from the node_checks table (one row per check: controller/slurm/nodecheck.py) and the
decisions table (the exclude_nodes of failover and drain decisions, newest row per decision).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from faultlens.attribution.reading.store import Store

#: decision actions that take nodes out of service
DRAINING_ACTIONS = ("failover", "drain")


class NodeState(StrEnum):
    DRAINED = "drained"
    RETURNED = "returned"
    REPEAT_OFFENDER = "repeat_offender"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class NodeStatus:
    node: str
    state: NodeState
    since: dt.datetime | None  # the drain, the check, or the return that set the state
    reason: str
    checks: int  # node-checks of this node
    returns: int  # times a check resumed it
    drains: int  # decisions that took it out

    def to_row(self) -> dict:
        return {
            "node": self.node,
            "state": self.state.value,
            "since": self.since,
            "checks": self.checks,
            "returns": self.returns,
            "drains": self.drains,
            "reason": self.reason,
        }


def _checks(store: Store) -> list[dict]:
    if not store.segments("node_checks"):
        return []
    return store.query(
        "SELECT node, ts, verdict, action, reason FROM node_checks WHERE node IS NOT NULL "
        "ORDER BY ts"
    ).to_pylist()


def _drains(store: Store) -> list[dict]:
    """(node, ts, decision id, reason) of every node a failover or drain decision took out."""
    if not store.segments("decisions"):
        return []
    actions = ", ".join("?" for _ in DRAINING_ACTIONS)
    rows = store.query(
        "SELECT decision_id, any_value(action) AS action, min(issued_ts) AS ts, "
        "any_value(exclude_nodes) AS nodes, any_value(reason) AS reason FROM decisions "
        f"WHERE action IN ({actions}) GROUP BY decision_id ORDER BY ts",
        list(DRAINING_ACTIONS),
    ).to_pylist()
    return [
        {
            "node": node,
            "ts": r["ts"],
            "decision": r["decision_id"],
            "action": r["action"],
            "reason": r["reason"] or "",
        }
        for r in rows
        for node in (r["nodes"] or [])
    ]


def _state(check: dict) -> NodeState:
    if check["verdict"] == "repeat_offender":
        return NodeState.REPEAT_OFFENDER
    if check["verdict"] == "fail":
        return NodeState.DRAINED
    if check["verdict"] == "pass" and check["action"] in ("resumed", "none"):
        return NodeState.RETURNED
    return NodeState.UNKNOWN


def node_states(store: Store) -> list[NodeStatus]:
    """Every node a check or a draining decision named, by name."""
    checks, drains = _checks(store), _drains(store)
    names = sorted({c["node"] for c in checks} | {d["node"] for d in drains})
    out = []
    for node in names:
        own = [c for c in checks if c["node"] == node]
        taken = [d for d in drains if d["node"] == node]
        last = own[-1] if own else None
        latest_drain = taken[-1] if taken else None
        returns = sum(1 for c in own if c["action"] == "resumed")
        if latest_drain is not None and (last is None or latest_drain["ts"] > last["ts"]):
            state = NodeState.DRAINED
            since, reason = (
                latest_drain["ts"],
                (
                    f"faultlens {latest_drain['action']} {latest_drain['decision']}: "
                    f"{latest_drain['reason']}"
                ),
            )
        elif last is not None:
            state, since, reason = _state(last), last["ts"], last["reason"] or ""
        else:
            state, since, reason = NodeState.UNKNOWN, None, ""
        out.append(NodeStatus(node, state, since, reason, len(own), returns, len(taken)))
    return out
