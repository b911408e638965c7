"""A slowdown's failover the job outran (it ended before the checkpoint boundary) is stored with the
status `outrun` and shown, never delivered to a hook nor carried out later, and the campaign scores
it as not carried out. Real Parquet store, real file-drop hook."""

from __future__ import annotations

import datetime as dt

from faultlens.attribution.decision import Action, Decision, DeliveryStatus
from faultlens.attribution.engine import write_new_incidents
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.controller.delivery import DecisionLog, Deliverer
from faultlens.controller.hooks.filedrop import FileDropHook
from faultlens.controller.lab.score import read_observed

AT = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC)


def _incident(name: str) -> Incident:
    return Incident(
        incident_id=f"inc-{name}",
        incident_class=IncidentClass.STRAGGLER,
        cause=Cause.UNKNOWN,
        first_signal_ts=AT,
        detected_ts=AT,
        confidence=0.9,
        rule="straggler-single-rank",
        summary="rank 3 computes 2x its peers",
        job_id="job",
        attempt=0,
        culprit_nodes=("node-1",),
        culprit_ranks=(3,),
    )


def _straggler_failover(name: str) -> Decision:
    return Decision.for_incident(
        _incident(name),
        action=Action.FAILOVER,
        policy_rule="single-node-failover",
        reason="one node is to blame",
        issued_at=AT,
        exclude_nodes=("node-1",),
    )


def test_an_outrun_failover_is_stored_shown_and_never_delivered(store_dir, tmp_path):
    outrun, pending = _straggler_failover("a"), _straggler_failover("b")
    supervisor = Deliverer(str(store_dir), [])
    supervisor.mark_outrun(outrun, note="not carried out: the job ended before its boundary")
    supervisor.submit(pending)
    supervisor.close()
    records = DecisionLog(str(store_dir)).records()
    assert records[outrun.decision_id].status is DeliveryStatus.OUTRUN
    assert records[pending.decision_id].status is DeliveryStatus.PENDING

    drop = tmp_path / "drop"
    later = Deliverer(str(store_dir), [FileDropHook(drop)])
    results = later.redeliver()
    later.close()
    # the failover the job outran reaches no hook: only the one still pending does
    assert [r.decision_id for r in results] == [pending.decision_id]
    assert {p.stem for p in drop.glob("*.json")} == {pending.decision_id}
    with Store(store_dir) as reader:
        rows = reader.query(
            "SELECT hook, delivery_status, reason FROM decisions WHERE decision_id = ? ORDER BY ts",
            [outrun.decision_id],
        ).to_pylist()
    assert rows[-1]["delivery_status"] == "outrun" and "job ended" in rows[-1]["reason"]


def test_the_campaign_scores_an_outrun_failover_as_not_carried_out(store_dir):
    outrun, applied = _straggler_failover("c"), _straggler_failover("d")
    write_new_incidents(str(store_dir), [_incident("c"), _incident("d")])
    supervisor = Deliverer(str(store_dir), [])
    supervisor.mark_outrun(outrun)
    supervisor.submit(applied)
    supervisor.mark_applied(applied)
    supervisor.close()
    observed, _ = read_observed(store_dir, "job")
    assert sorted((o.incident_id, o.action, o.exclude) for o in observed) == [
        ("inc-c", "failover (outrun)", ()),
        ("inc-d", "failover", ("node-1",)),
    ]
