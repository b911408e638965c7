"""The store's incident and decision queries (attribution/reading/queries.py): an incident written
more than once (a follower racing a batch pass) reads as its first report in every reader, whatever
the order its rows were written in; a decision reads as issued, with each hook's latest delivery."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from faultlens.attribution.engine import existing_failures
from faultlens.attribution.goodput import load_job_facts
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.attribution.policy import StoreHistory
from faultlens.attribution.reading.queries import (
    decided_incident_ids,
    decision_rows,
    existing_incident_ids,
    incident_ids_starting,
    incident_rows,
    latest_deliveries,
    stored_incidents,
)
from faultlens.attribution.reading.store import Store
from faultlens.controller.cli.main import main
from faultlens.controller.report.data import load_incident
from tests.engine_rows import at, write

FIRST = Incident("inc-a", IncidentClass.CRASH, Cause.GPU_HARDWARE, at(5), at(9), 0.9, "xid-79",
                 "first", job_id="j", attempt=0, culprit_nodes=("node-1",))
# the same id reported again later, with what that pass saw: every earlier rule would have read
# this one (the newest row, the first row scanned, the earliest first signal of any row)
AGAIN = dataclasses.replace(FIRST, detected_ts=at(30), first_signal_ts=at(4), summary="again",
                            cause=Cause.NVLINK, attempt=1)
OTHER = Incident("inc-b", IncidentClass.COLLECTIVE_HANG, Cause.NETWORK, at(12), at(20), 0.8, "hang",
                 "b", job_id="j", attempt=0)
ELSEWHERE = Incident("inc-c", IncidentClass.STRAGGLER, Cause.THERMAL, at(1), at(2), 0.7, "slow",
                     "c", job_id="k", attempt=0)


def _ns(moment) -> int:
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


@pytest.fixture
def twice(store_dir: Path) -> Path:
    write(store_dir, "incidents", [AGAIN.to_row()])  # listed and scanned first
    write(store_dir, "incidents", [OTHER.to_row(), ELSEWHERE.to_row()])
    write(store_dir, "incidents", [FIRST.to_row()])
    write(store_dir, "incidents", [{"ts": at(1), "job_id": "j", "class": "crash"}])  # no id: none
    return store_dir


def test_an_incident_written_twice_reads_as_its_first_report_everywhere(twice: Path,
                                                                         capsys) -> None:
    with Store(str(twice)) as store:
        ids = [r["incident_id"] for r in incident_rows(store)]
        assert ids == ["inc-c", "inc-a", "inc-b"]  # in order of detection
        assert stored_incidents(store, job="j") == [FIRST, OTHER]
        assert stored_incidents(store, incident_id="inc-a") == [FIRST]
        assert stored_incidents(store, job="j", exclude_id="inc-b") == [FIRST]
        hung_or_slow = stored_incidents(store, classes=("collective_hang", "straggler"))
        assert hung_or_slow == [ELSEWHERE, OTHER]
        assert stored_incidents(store, classes=()) == []
        assert existing_incident_ids(store) == {"inc-a", "inc-b", "inc-c"}
        assert incident_ids_starting(store, ["inc-a", "inc-b"]) == ["inc-a", "inc-b"]
        # the follower's failures, the policy's history, the report, goodput: the same row
        assert existing_failures(store) == [FIRST, OTHER]
        assert StoreHistory(store).job_incidents("j", "inc-b") == [FIRST]
        incident = load_incident(store, "inc-a")
        read = (incident["summary"], incident["attempt"], incident["cause"])
        assert read == ("first", 0, "gpu_hardware")
    write(twice, "ranks", [{"ts": at(0), "job_id": "j", "attempt": 0, "rank": 0, "node": "node-1"}])
    with Store(str(twice)) as store:
        fact, other = load_job_facts(store, "j").incidents  # (goodput reads a job with telemetry)
    assert (fact.incident_id, fact.attempt, fact.cause) == ("inc-a", 0, "gpu_hardware")
    assert (fact.first_signal_ns, fact.detected_ns) == (_ns(at(5)), _ns(at(9)))
    assert other.incident_id == "inc-b"
    # `faultlens incidents`
    assert main(["incidents", "--store", str(twice), "--job", "j", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    listed = [(r["incident_id"], r["summary"]) for r in listed]
    assert listed == [("inc-a", "first"), ("inc-b", "b")]


def test_the_row_chosen_does_not_depend_on_the_order_rows_were_written(tmp_path: Path) -> None:
    """Two reports of one id at the same moment (ts and detected_ts equal): one fixed choice."""
    one, two = FIRST.to_row(), {**FIRST.to_row(), "summary": "same moment"}
    chosen = []
    for name, rows in (("ab", [one, two]), ("ba", [two, one])):
        for row in rows:
            write(tmp_path / name, "incidents", [row])
        with Store(str(tmp_path / name)) as store:
            chosen.append([r["summary"] for r in incident_rows(store)])
    assert chosen[0] == chosen[1] and len(chosen[0]) == 1


def _decision(ts: float, hook: str | None, status: str, **extra) -> dict:
    return {"ts": at(ts), "job_id": "j", "decision_id": "dec-1", "incident_id": "inc-a",
            "action": "failover", "issued_ts": at(10), "hook": hook, "delivery_status": status,
            **extra}


def test_a_decision_reads_as_issued_with_each_hooks_latest_delivery(store_dir: Path) -> None:
    write(store_dir, "decisions", [_decision(12, "spool", "delivered"),
                                   _decision(13, "web", "failed", delivery_error="503")])
    write(store_dir, "decisions", [_decision(10, None, "pending", reason="as issued"),
                                   _decision(11, "spool", "pending"),
                                   _decision(11.5, "web", "pending")])
    write(store_dir, "decisions", [{**_decision(9, None, "pending"), "decision_id": None}])  # no id
    with Store(str(store_dir)) as store:
        (decision,) = decision_rows(store, job="j")
        assert (decision["ts"], decision["reason"]) == (at(10), "as issued")
        assert decision_rows(store, incident_id="inc-a") == [decision]
        assert decision_rows(store, job="k") == []
        deliveries = latest_deliveries(store, "inc-a")
        assert [(d["hook"], d["delivery_status"], d["delivery_error"]) for d in deliveries] == [
            (None, "pending", None), ("spool", "delivered", None), ("web", "failed", "503")]
        assert decided_incident_ids(store) == {"inc-a"}
