"""End to end: `faultlens demo` runs a real DDP/gloo CPU job under the supervisor with its five
faults; every incident has the right class, culprit and decision, and each restart resumed from the
checkpoint the policy chose.
"""

import json

import pytest

from faultlens.attribution.reading.store import Store

pytest.importorskip("torch")

# attempt -> (injected fault, incident class, culprit node, culprit rank, cause check, action,
# excluded node)
EXPECTED = [
    ("straggler", "straggler", "node-1", 3, {"thermal"}, "failover", "node-1"),
    ("hang", "collective_hang", "node-0", 1, None, "failover", "node-0"),
    ("sigkill", "crash", "node-3", 2, None, "failover", "node-3"),
    ("gpu_lost", "crash", "node-4", 2, {"pcie", "gpu_hardware"}, "failover", "node-4"),
    ("software", "crash", None, None, {"software"}, "escalate", None),
]


def test_every_fault_is_attributed_and_decided(demo_store):
    store, workdir, output = demo_store
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["outcome"] == "escalated"
    assert len(summary["attempts"]) == len(EXPECTED)
    with Store(store) as reader:
        decisions = reader.query("""
            SELECT attempt, "class", cause, action, exclude_nodes, restore_step, restore_tier,
                document
            FROM decisions QUALIFY row_number() OVER (PARTITION BY decision_id ORDER BY ts) = 1
            ORDER BY attempt""").to_pylist()
        incidents = {
            row["incident_id"]: row for row in reader.query("SELECT * FROM incidents").to_pylist()
        }
    assert [d["attempt"] for d in decisions] == list(range(len(EXPECTED)))
    for decision, (fault, cls, node, rank, causes, action, excluded) in zip(
        decisions, EXPECTED, strict=True
    ):
        document = json.loads(decision["document"])
        incident = incidents[document["incident_id"]]
        assert incident["class"] == cls, (fault, incident)
        if node is not None:
            assert incident["culprit_nodes"] == [node], (fault, incident["culprit_nodes"])
            assert incident["culprit_ranks"] == [rank], (fault, incident["culprit_ranks"])
        if causes is not None:
            assert incident["cause"] in causes, (fault, incident["cause"])
        assert decision["action"] == action, (fault, decision)
        assert decision["exclude_nodes"] == ([excluded] if excluded else []), (fault, decision)
    assert "4 incidents recovered automatically, 1 escalated to a human" in " ".join(output.split())


def test_each_restart_resumed_from_the_chosen_checkpoint(demo_store):
    store, workdir, _ = demo_store
    with Store(store) as reader:
        decisions = reader.query("""
            SELECT attempt, restore_step, restore_tier, exclude_nodes FROM decisions
            WHERE action = 'failover'
            QUALIFY row_number() OVER (PARTITION BY decision_id ORDER BY ts) = 1
            ORDER BY attempt""").to_pylist()
        first_steps = {
            row["attempt"]: row["first"]
            for row in reader.query(
                "SELECT attempt, min(step) AS first FROM steps WHERE phase = 'train' "
                "GROUP BY attempt"
            ).to_pylist()
        }
        ranks = reader.query("SELECT DISTINCT attempt, node FROM ranks").to_pylist()
        launches = reader.query(
            "SELECT attempt, count(DISTINCT node) AS nodes FROM process_events "
            "WHERE kind = 'start' GROUP BY attempt ORDER BY attempt"
        ).to_pylist()
    assert first_steps[0] == 0
    excluded_so_far: set[str] = set()
    # the supervisor records each node's launch (goodput counts start-up from it)
    assert launches == [{"attempt": a, "nodes": 2} for a in range(len(decisions) + 1)]
    for decision in decisions:
        nxt = decision["attempt"] + 1
        plan = json.loads((workdir / f"restore-plan-{nxt}.json").read_text())
        assert plan["step"] == decision["restore_step"] is not None
        assert first_steps[nxt] == decision["restore_step"] + 1, (decision, first_steps)
        # never restored from the local tier of a node this decision, or any earlier one, excluded
        excluded_so_far |= set(decision["exclude_nodes"])
        for source in plan["sources"]:
            assert source["node"] not in excluded_so_far, (plan, decision)
        # and the excluded node never came back
        later = {r["node"] for r in ranks if r["attempt"] >= nxt}
        assert not later & set(decision["exclude_nodes"])


def test_the_supervisor_records_agent_exits_and_its_own_signals_and_marks_failovers_applied(
    demo_store,
):
    store, _, _ = demo_store
    with Store(store) as reader:
        rows = reader.query(
            "SELECT attempt, node, kind, pid, exit_code, signal, is_secondary, "
            "message, ts "
            "FROM process_events WHERE source = 'supervisor' ORDER BY ts"
        ).to_pylist()
        decisions = reader.query(
            "SELECT decision_id, action, hook, delivery_status FROM decisions"
        ).to_pylist()
    starts = {(r["attempt"], r["node"]) for r in rows if r["kind"] == "start"}
    exits = {(r["attempt"], r["node"]): r for r in rows if r["kind"] == "agent_exit"}
    assert set(exits) == starts  # every agent's exit is recorded
    signals = [r for r in rows if r["kind"] == "signal_sent"]
    assert signals and {r["attempt"] for r in signals} <= {a for a, _ in starts}
    for (attempt, node), row in exits.items():
        assert (row["exit_code"] is None) == (row["signal"] is not None), row
        # stopped by the supervisor: the signal was recorded before it was sent
        if row["is_secondary"]:
            assert any(
                s["attempt"] == attempt and s["node"] == node and s["ts"] <= row["ts"]
                for s in signals
            ), row
    assert all(
        s["is_secondary"] and s["message"] and s["signal"] in ("SIGTERM", "SIGKILL")
        for s in signals
    )
    failovers = {d["decision_id"] for d in decisions if d["action"] == "failover"}
    applied = {
        d["decision_id"]
        for d in decisions
        if d["delivery_status"] == "applied" and d["hook"] == "supervisor"
    }
    # every failover it carried out is applied; with no hook configured, so is the escalation it
    # carried out itself (it stopped the job and told the console): nothing done is left pending
    escalations = {d["decision_id"] for d in decisions if d["action"] == "escalate"}
    assert failovers and escalations and applied == failovers | escalations


def test_faultlens_deliver_never_redelivers_what_the_supervisor_applied(demo_store, tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    store = tmp_path / "store"
    # deliver appends rows: the session's store stays as the demo left it
    shutil.copytree(demo_store.store, store)
    drop = tmp_path / "drop"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "deliver",
            "--store",
            str(store),
            "--drop-dir",
            str(drop),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with Store(store) as reader:
        actions = {r["decision_id"]: r["action"] for r in reader.query(
            "SELECT DISTINCT decision_id, action FROM decisions").to_pylist()}
        applied = {r["decision_id"] for r in reader.query(
            "SELECT DISTINCT decision_id FROM decisions WHERE delivery_status = 'applied'"
        ).to_pylist()}
    delivered = {path.stem for path in drop.glob("*.json")}
    # what the supervisor carried out (the failovers, and the escalation it stopped the job for
    # with no hook configured) never goes again; nothing else is left to deliver
    assert set(actions) and applied == set(actions)
    assert delivered == set()
