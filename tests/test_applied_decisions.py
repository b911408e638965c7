"""A decision the issuing supervisor carried out is recorded `applied` and is never delivered again,
whatever the hooks' state; a decision that still waits for a human is. Real Parquet store, real
file-drop hook."""

from __future__ import annotations

import datetime as dt

from faultlens.attribution.decision import Action, Decision, DeliveryStatus, Restore
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.controller.delivery import DecisionLog, Deliverer
from faultlens.controller.hooks.filedrop import FileDropHook

AT = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC)


def _decision(name: str, action: Action) -> Decision:
    incident = Incident(
        incident_id=f"inc-{name}",
        incident_class=IncidentClass.CRASH,
        cause=Cause.GPU_HARDWARE,
        first_signal_ts=AT,
        detected_ts=AT,
        confidence=0.95,
        rule="test",
        summary="",
        job_id="job",
        attempt=0,
        culprit_nodes=("node-1",),
    )
    failover = action is Action.FAILOVER
    return Decision.for_incident(
        incident,
        action=action,
        policy_rule="test",
        reason="test",
        issued_at=AT,
        exclude_nodes=("node-1",) if failover else (),
        restore=Restore("durable", 10) if failover else None,
    )


class _Failing:
    name = "flaky"
    retry = None

    def deliver(self, decision: Decision, document: str) -> None:
        raise OSError("receiver down")


def test_applied_decisions_are_never_redelivered(store_dir, tmp_path):
    applied, escalation = _decision("a", Action.FAILOVER), _decision("b", Action.ESCALATE)
    # the supervisor runs without hooks: persisted, pending
    supervisor = Deliverer(str(store_dir), [])
    supervisor.submit(applied)
    supervisor.mark_applied(applied, note="applied by the supervisor: excluded node-1")
    supervisor.submit(escalation)
    supervisor.close()
    records = DecisionLog(str(store_dir)).records()
    assert records[applied.decision_id].status is DeliveryStatus.APPLIED
    assert records[escalation.decision_id].status is DeliveryStatus.PENDING

    drop = tmp_path / "drop"
    later = Deliverer(str(store_dir), [FileDropHook(drop)])
    results = later.redeliver()
    later.close()
    assert [(r.decision_id, r.status) for r in results] == [
        (escalation.decision_id, DeliveryStatus.DELIVERED)
    ]
    assert {p.stem for p in drop.glob("*.json")} == {escalation.decision_id}
    with Store(store_dir) as reader:
        rows = reader.query("SELECT hook, delivery_status, reason FROM decisions WHERE decision_id "
                            "= ? ORDER BY ts",
                            [applied.decision_id]).to_pylist()
    assert rows[-1]["hook"] == "supervisor" and rows[-1]["delivery_status"] == "applied"
    assert "applied by the supervisor" in rows[-1]["reason"]


def test_an_applied_decision_whose_hook_failed_is_not_retried(store_dir):
    decision = _decision("c", Action.FAILOVER)
    deliverer = Deliverer(str(store_dir), [_Failing()], sleep=lambda s: None)
    assert [r.status for r in deliverer.submit(decision)] == [DeliveryStatus.FAILED]
    deliverer.mark_applied(decision)
    assert deliverer.redeliver() == []
    deliverer.close()
