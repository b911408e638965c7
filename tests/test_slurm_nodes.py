"""`faultlens nodes` (controller/slurm/nodes.py) over a real store: node-check rows and the
decisions that drained nodes, in the tables' own schema (collectors/store/schema.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.slurm.nodes import NodeState, node_states

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def check_row(node, minutes, verdict, action, reason):
    return {
        "ts": at(minutes),
        "node": node,
        "verdict": verdict,
        "action": action,
        "since_ts": at(minutes - 1),
        "events": 0,
        "event_kinds": "",
        "returned_ts": None,
        "reason": reason,
    }


def decision_row(decision_id, minutes, action, nodes, status="pending"):
    return {
        "ts": at(minutes),
        "job_id": "llm-7b",
        "decision_id": decision_id,
        "incident_id": f"inc-{decision_id}",
        "action": action,
        "class": "crash",
        "cause": "host",
        "exclude_nodes": list(nodes),
        "reason": "one node is to blame",
        "confidence": 0.85,
        "rule": "crash-node-lost",
        "issued_ts": at(minutes),
        "delivery_status": status,
        "hook": "slurm",
    }


def write(store: Path, table: str, rows: list[dict]) -> None:
    sink = SegmentSink(str(store), flush_rows=len(rows))
    try:
        sink.write(table, rows)
        sink.flush()
    finally:
        sink.close()


def test_each_node_where_it_stands(tmp_path):
    store = tmp_path / "store"
    write(
        store,
        "node_checks",
        [
            # node-1: drained by a failover, returned by a clean check
            check_row("node-1", 10, "pass", "resumed", "faultlens node-check: clean since ..."),
            # node-2: returned, then failed again: a repeat offender
            check_row("node-2", 5, "pass", "resumed", "faultlens node-check: clean since ..."),
            check_row("node-2", 30, "repeat_offender", "kept_drained", "repeat offender: again"),
            # node-3: an Xid since its drain keeps it out
            check_row("node-3", 12, "fail", "kept_drained", "faultlens node-check: 2 GPU event(s)"),
        ],
    )
    write(
        store,
        "decisions",
        [
            decision_row("dec-a", 1, "failover", ["node-1"]),
            decision_row("dec-a", 1.1, "failover", ["node-1"], status="applied"),  # its delivery
            # node-0: a failover took it out after its last check (none): drained by the decision
            decision_row("dec-b", 40, "failover", ["node-0"]),
            decision_row("dec-c", 41, "restart", []),
        ],
    )
    with Store(str(store)) as opened:
        states = {s.node: s for s in node_states(opened)}
    assert sorted(states) == ["node-0", "node-1", "node-2", "node-3"]
    assert states["node-0"].state is NodeState.DRAINED
    assert states["node-0"].reason.startswith("faultlens failover dec-b")
    assert (states["node-1"].state, states["node-1"].returns, states["node-1"].drains) == (
        NodeState.RETURNED,
        1,
        1,
    )
    assert states["node-2"].state is NodeState.REPEAT_OFFENDER
    assert (states["node-2"].checks, states["node-2"].returns) == (2, 1)
    assert states["node-3"].state is NodeState.DRAINED and states["node-3"].since == at(12)


def test_the_command_on_a_missing_an_empty_and_a_store(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "faultlens.controller.cli.main", "nodes", "--store"]
    missing = subprocess.run(
        [*command, str(tmp_path / "none")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1
    assert str(tmp_path / "none") in missing.stderr
    store = tmp_path / "store"
    store.mkdir()
    empty = subprocess.run(
        [*command, str(store), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []
    write(store, "decisions", [decision_row("dec-x", 2, "drain", ["gpu-a17"])])
    table = subprocess.run(
        [*command, str(store)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert table.returncode == 0, table.stderr
    assert "gpu-a17" in table.stdout and "drained" in table.stdout
