"""The decision contract: dataclass <-> versioned JSON, the JSON Schema, the decisions-table row
form.
"""

from __future__ import annotations

import datetime as dt
import json

import jsonschema
import pytest

from faultlens.attribution.decision import (
    DECISION_JSON_SCHEMA,
    SCHEMA_ID,
    Action,
    Culprit,
    Decision,
    DecisionError,
    DeliveryStatus,
    Restore,
    validate_document,
)
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.schema import rows_to_table
from faultlens.collectors.store.sink import SegmentSink

T0 = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def _incident() -> Incident:
    return Incident(
        incident_id=Incident.make_id("job-1", 3, "xid79", "node-07"),
        incident_class=IncidentClass.CRASH,
        cause=Cause.GPU_HARDWARE,
        first_signal_ts=T0,
        detected_ts=T0 + dt.timedelta(seconds=4),
        confidence=0.97,
        rule="xid-79-fallen-off-bus",
        summary="GPU fell off the bus",
        job_id="job-1",
        attempt=3,
        cluster="c1",
        culprit_nodes=("node-07",),
        culprit_ranks=(56, 57),
        culprit_gpus=("GPU-1234",),
        evidence=(
            Evidence("gpu_events", T0, "Xid 79 on GPU 3 (PCI 0000:9b:00.0)"),
            Evidence("process_events", None, "rank 56 exited with SIGKILL"),
        ),
    )


def _failover() -> Decision:
    return Decision.for_incident(
        _incident(),
        action=Action.FAILOVER,
        policy_rule="hardware-failover",
        reason="hardware evidence",
        issued_at=T0 + dt.timedelta(seconds=5),
        exclude_nodes=("node-07",),
        restore=Restore("durable", 1200, "s3://ckpt/job/step-1200"),
    )


def test_json_round_trip_keeps_every_field() -> None:
    decision = _failover()
    text = decision.to_json()
    document = json.loads(text)
    assert document["schema"] == SCHEMA_ID == "faultlens.decision/1"
    assert (
        document["action"] == "failover"
        and document["class"] == "crash"
        and document["cause"] == "gpu_hardware"
    )
    assert document["culprit"] == {"nodes": ["node-07"], "ranks": [56, 57], "gpus": ["GPU-1234"]}
    assert document["restore"] == {
        "tier": "durable",
        "step": 1200,
        "uri": "s3://ckpt/job/step-1200",
    }
    assert document["evidence"][1]["ts"] is None
    back = Decision.from_json(text)
    assert back == decision
    assert back.issued_at.tzinfo is not None
    assert back.to_json() == text  # canonical: the bytes a webhook signs are stable


def test_escalation_round_trip_without_restore() -> None:
    decision = Decision.for_incident(
        _incident(),
        action=Action.ESCALATE,
        policy_rule="low-confidence",
        reason="not certain",
        issued_at=T0,
    )
    assert json.loads(decision.to_json())["restore"] is None
    assert Decision.from_json(decision.to_json()) == decision


def test_decision_id_is_one_per_incident() -> None:
    incident = _incident()
    assert Decision.id_for(incident.incident_id) == _failover().decision_id
    assert Decision.id_for(incident.incident_id) != Decision.id_for(incident.incident_id + "x")


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(DECISION_JSON_SCHEMA)


BAD_DOCUMENTS = [
    (lambda d: d.update(schema="faultlens.decision/2"), "schema"),
    (lambda d: d.update(action="reboot"), "action"),
    (lambda d: d.update(cause="cosmic_rays"), "cause"),
    (lambda d: d["restore"].update(step=-1), "restore"),
    (lambda d: d["restore"].update(tier="tape"), "restore"),
    (lambda d: d.update(confidence=1.5), "confidence"),
    # a failover leaves out or rolls back
    (lambda d: d.update(exclude_nodes=[], restore=None), "(document)"),
    (lambda d: d.update(extra_field=1), "extra_field: unknown key"),
    (lambda d: d["culprit"].pop("ranks"), "culprit"),
    (lambda d: d.pop("decision_id"), "decision_id: required key is missing"),
    # a drain names nodes
    (lambda d: d.update(action="drain", restore=None, exclude_nodes=[]), "(document)"),
    (lambda d: d.update(issued_at="yesterday"), "issued_at"),
    (lambda d: d.update(attempt=True), "attempt"),  # no coercion: true is no attempt number
]


@pytest.mark.parametrize(("change", "where"), BAD_DOCUMENTS)
def test_schema_rejects_bad_documents(change, where) -> None:
    document = _failover().to_document()
    validate_document(document)
    change(document)
    with pytest.raises(DecisionError) as info:
        validate_document(document, source="hook payload")
    assert str(info.value).startswith(f"hook payload: {where}")


# jsonschema checks `format: date-time` only where its optional rfc3339 package is installed
_DATE_TIMES_CHECKED = "date-time" in jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers


@pytest.mark.parametrize(("change", "where"), BAD_DOCUMENTS)
def test_published_json_schema_agrees_with_the_model(change, where) -> None:
    """DECISION_JSON_SCHEMA is the published contract; the pydantic model is what faultlens
    validates with: both accept the documents faultlens writes and reject each bad one."""
    validator = jsonschema.Draft202012Validator(
        DECISION_JSON_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    escalation = Decision.for_incident(
        _incident(),
        action=Action.ESCALATE,
        policy_rule="low-confidence",
        reason="not certain",
        issued_at=T0,
    )
    for document in (_failover().to_document(), escalation.to_document()):
        assert validator.is_valid(document)
        validate_document(document)
    document = _failover().to_document()
    change(document)
    if where != "issued_at" or _DATE_TIMES_CHECKED:
        assert not validator.is_valid(document)
    with pytest.raises(DecisionError):
        validate_document(document)


def test_escalation_may_not_carry_a_restore() -> None:
    document = _failover().to_document()
    document["action"] = "escalate"
    with pytest.raises(DecisionError, match="restore"):
        Decision.from_document(document)


def test_from_json_rejects_non_json() -> None:
    with pytest.raises(DecisionError, match=r"payload\.json: not JSON"):
        Decision.from_json("{not json", source="payload.json")


def test_enums_have_unknown() -> None:
    assert (
        Action("unknown") is Action.UNKNOWN and DeliveryStatus("unknown") is DeliveryStatus.UNKNOWN
    )


def test_row_form_fits_the_decisions_table_and_round_trips_through_parquet(store_dir) -> None:
    decision = _failover()
    row = decision.to_row(status=DeliveryStatus.PENDING)
    table = rows_to_table("decisions", [row])
    assert table.num_rows == 1
    with SegmentSink(store_dir) as sink:
        sink.write(
            "decisions",
            [
                row,
                decision.to_row(
                    status=DeliveryStatus.DELIVERED, hook="webhook", ts=T0 + dt.timedelta(seconds=9)
                ),
            ],
        )
    with Store(str(store_dir)) as store:
        rows = store.query("SELECT * FROM decisions ORDER BY ts").to_pylist()
    assert [r["delivery_status"] for r in rows] == ["pending", "delivered"]
    assert rows[0]["exclude_nodes"] == ["node-07"] and rows[0]["restore_step"] == 1200
    assert rows[0]["node"] == "node-07" and rows[0]["job_id"] == "job-1" and rows[0]["rank"] is None
    assert Decision.from_row(rows[1]) == decision


def test_culprit_defaults_are_empty() -> None:
    assert Culprit() == Culprit((), (), ())
