"""What a decision means for the running job (attribution/policy/running.py), the judgment the
supervisor asks while it watches an attempt: a slowdown never stops the job at once, its failover
waits for a checkpoint boundary, a notify keeps any job running, and a pending failover takes the
next slowdown with it."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from faultlens.attribution.decision import Action, Decision
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, load_policy
from faultlens.attribution.policy.running import (
    fails_over_at_boundary,
    is_slowdown,
    keeps_running,
    waits_for_pending_failover,
)

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def incident(cls: IncidentClass, cause: Cause, *, nodes: tuple[str, ...] = ("node-1",)) -> Incident:
    return Incident(
        incident_id=f"inc-{cls.value}-{cause.value}", incident_class=cls, cause=cause,
        first_signal_ts=NOW - dt.timedelta(seconds=3), detected_ts=NOW, confidence=0.95,
        rule="test-rule", summary="test", job_id="job-a", attempt=0, culprit_nodes=nodes,
        culprit_ranks=(2,), evidence=(Evidence("steps", NOW, "rank 2 is slow"),))


def decision(found: Incident, action: Action) -> Decision:
    return Decision.for_incident(found, action=action, policy_rule="test", reason="test",
                                 issued_at=NOW)


@pytest.mark.parametrize(("cls", "cause", "slow"), [
    (IncidentClass.STRAGGLER, Cause.GPU_HARDWARE, True),
    (IncidentClass.STRAGGLER, Cause.THERMAL, True),
    (IncidentClass.STRAGGLER, Cause.UNKNOWN, True),
    (IncidentClass.CRASH, Cause.WORKLOAD_IMBALANCE, True),  # imbalance is a slowdown in any class
    (IncidentClass.COLLECTIVE_HANG, Cause.WORKLOAD_IMBALANCE, True),
    (IncidentClass.CRASH, Cause.GPU_HARDWARE, False),
    (IncidentClass.COLLECTIVE_HANG, Cause.NETWORK, False),
    (IncidentClass.NUMERICS, Cause.DATA_CORRUPTION, False),
    (IncidentClass.HEALTH, Cause.HBM, False),
])
def test_a_slowdown_is_a_straggler_or_a_workload_imbalance(cls: IncidentClass, cause: Cause,
                                                           slow: bool) -> None:
    found = incident(cls, cause)
    assert is_slowdown(found) is slow
    assert waits_for_pending_failover(found) is slow


@pytest.mark.parametrize(("cls", "cause", "action", "running", "at_boundary"), [
    # a slowdown: every decision but a failover keeps the job running; a failover waits
    (IncidentClass.STRAGGLER, Cause.GPU_HARDWARE, Action.NOTIFY, True, False),
    (IncidentClass.STRAGGLER, Cause.GPU_HARDWARE, Action.ESCALATE, True, False),
    (IncidentClass.STRAGGLER, Cause.GPU_HARDWARE, Action.DRAIN, True, False),
    (IncidentClass.STRAGGLER, Cause.GPU_HARDWARE, Action.FAILOVER, False, True),
    (IncidentClass.CRASH, Cause.WORKLOAD_IMBALANCE, Action.ESCALATE, True, False),
    (IncidentClass.CRASH, Cause.WORKLOAD_IMBALANCE, Action.FAILOVER, False, True),
    # anything else: only a notify keeps it running, and nothing waits for a boundary
    (IncidentClass.CRASH, Cause.GPU_HARDWARE, Action.NOTIFY, True, False),
    (IncidentClass.CRASH, Cause.GPU_HARDWARE, Action.FAILOVER, False, False),
    (IncidentClass.CRASH, Cause.SOFTWARE, Action.ESCALATE, False, False),
    (IncidentClass.HEALTH, Cause.HBM, Action.DRAIN, False, False),
    (IncidentClass.COLLECTIVE_HANG, Cause.NETWORK, Action.FAILOVER, False, False),
])
def test_what_a_decision_does_to_the_running_job(cls: IncidentClass, cause: Cause, action: Action,
                                                 running: bool, at_boundary: bool) -> None:
    found = incident(cls, cause)
    made = decision(found, action)
    assert keeps_running(found, made) is running
    assert fails_over_at_boundary(found, made) is at_boundary


def test_a_slowdown_never_stops_the_job_at_once() -> None:
    """Over every class, cause and action: a slowdown's decision keeps the job running or waits for
    the checkpoint boundary, exactly one of the two; no other incident waits for a boundary."""
    for cls, cause, action in itertools.product(IncidentClass, Cause, Action):
        found = incident(cls, cause)
        made = decision(found, action)
        outcomes = (keeps_running(found, made), fails_over_at_boundary(found, made))
        if is_slowdown(found):
            assert outcomes.count(True) == 1, (cls, cause, action)
        else:
            assert outcomes == (action is Action.NOTIFY, False), (cls, cause, action)


def test_the_shipped_policy_on_a_systemic_slowdown_keeps_the_job_running() -> None:
    """What the supervisor sees end to end: the shipped policy notifies a workload imbalance, and
    the job keeps running; a hardware crash fails over at once."""
    policy = DecisionPolicy(load_policy(), clock=lambda: NOW)
    slow = incident(IncidentClass.STRAGGLER, Cause.WORKLOAD_IMBALANCE)
    decided = policy.decide(slow)
    assert decided.action is Action.NOTIFY and keeps_running(slow, decided)
    crash = incident(IncidentClass.CRASH, Cause.GPU_HARDWARE)
    decided = policy.decide(crash)
    assert decided.action is Action.FAILOVER
    assert not keeps_running(crash, decided) and not fails_over_at_boundary(crash, decided)
