"""The policy for slowdowns: never stop a running job for one, never exclude a node for a systemic
cause, decide straggler incidents of one attempt as a set, and fail over only when the what-if
saving pays for a restart."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.engine import Engine, attribute
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.policy import DecisionPolicy, StoreHistory, load_policy
from faultlens.attribution.policy.slowdown import decide_all, straggler_saving
from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.xid_catalog import load_xid_catalog
from faultlens.collectors.store.sink import SegmentSink
from tests.engine_rows import ranks_rows, steps_rows, write

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def policy(**kwargs) -> DecisionPolicy:
    return DecisionPolicy(load_policy(), clock=lambda: NOW, **kwargs)


def straggler(
    n: int = 1,
    *,
    node: str = "node-1",
    saving: float | None = 0.2,
    confidence: float = 0.9,
    cause: Cause = Cause.UNKNOWN,
    attempt: int = 0,
    remaining_s: float | None = None,
) -> Incident:
    details = {} if saving is None else {"saving_fraction": saving}
    if remaining_s is not None:
        details["remaining_s"] = remaining_s
    evidence = (Evidence("steps", NOW, f"rank {n}: compute 2.20x the other replicas"),)
    if saving is not None:
        evidence += (Evidence("steps", NOW, f"what-if: with rank {n} at its peers' speed ... "
                                            "fixing this saves "
                                            f"{saving * 100:.1f}% of step time (S = 1.25)"),)
    return Incident(
        incident_id=f"inc-s{n}",
        incident_class=IncidentClass.STRAGGLER,
        cause=cause,
        first_signal_ts=NOW - dt.timedelta(minutes=2),
        detected_ts=NOW,
        confidence=confidence,
        rule="straggler-single-rank",
        summary="straggler",
        job_id="job-a",
        attempt=attempt,
        culprit_nodes=(node,),
        culprit_ranks=(n,),
        evidence=evidence,
        details=details,
    )


def slow_rank_incident(store_dir: Path, total_steps: int | None) -> Incident:
    """45 steps of 4 ranks on 2 nodes, rank 3 2.8x slower in forward from step 15; the ranks rows
    declare `total_steps` (None: nothing declared)."""
    rng = random.Random(11)

    def sections(rank: int, step: int) -> dict[str, float]:
        s = {
            "data": 0.004 * rng.uniform(0.9, 1.1),
            "forward": 0.05 * rng.uniform(0.95, 1.05),
            "backward": 0.03 * rng.uniform(0.95, 1.05),
            "optimizer": 0.01 * rng.uniform(0.95, 1.05),
        }
        if rank == 3 and step >= 15:
            s["forward"] *= 2.8
        return s

    ranks = ranks_rows("job-1", 0, 4, 2, with_gpu=False)
    if total_steps is not None:
        ranks = [{**row, "total_steps": total_steps} for row in ranks]
    write(store_dir, "ranks", ranks)
    write(store_dir, "steps", steps_rows("job-1", 0, 4, 2, range(45), start=1.0, sections=sections))
    (incident,) = [i for i in attribute(str(store_dir), engine=Engine(catalog=load_xid_catalog()))
                   if i.incident_class is IncidentClass.STRAGGLER]
    return incident


def test_a_persistent_slow_rank_without_gpu_signal_is_actionable(store_dir: Path) -> None:
    """Issue 11: forward 2.8x, compute 2.2x, persistent, no GPU signal -> confidence 0.67,
    escalated, job stopped. The job declares 10^6 steps: its remaining time (steps left x the recent
    step time) pays for a restart."""
    incident = slow_rank_incident(store_dir, 1_000_000)
    decision = policy().decide(incident)
    step_s = incident.details["remaining_step_s"]
    assert (
        incident.details["total_steps"] == 1_000_000
        and incident.details["remaining_from_step"] == 44
    )
    assert incident.details["remaining_s"] == pytest.approx((1_000_000 - 45) * step_s, rel=1e-4)

    assert incident.culprit_nodes == ("node-01",) and incident.cause is Cause.UNKNOWN
    assert incident.confidence >= load_policy().threshold_for(IncidentClass.STRAGGLER)
    assert decision.action is Action.FAILOVER and decision.exclude_nodes == ("node-01",)


@pytest.mark.parametrize("declared,rule", [
    # nothing declares the job's length: unknown, never a failover
    (None, "straggler-remaining-unknown"),
    (46, "straggler-not-worth-a-restart"),  # the job ends in a step: nothing left to save over
])
def test_a_slowdown_whose_remaining_time_is_unknown_or_short_is_notified(
    store_dir: Path, declared: int | None, rule: str
) -> None:
    incident = slow_rank_incident(store_dir, declared)
    decision = policy().decide(incident)
    assert (
        decision.action is Action.NOTIFY
        and decision.policy_rule == rule
        and decision.exclude_nodes == ()
    )
    assert "keeps running" in decision.reason
    if declared is None:
        assert incident.details["remaining_s"] is None and "declares no length" in decision.reason
    else:
        assert incident.details["remaining_s"] == pytest.approx(
            incident.details["remaining_step_s"], abs=1e-3
        )
        assert "the job declares 46 steps" in decision.reason


def test_an_operator_figure_stands_in_for_a_job_that_declares_no_length() -> None:
    config = load_policy()
    config = dataclasses.replace(
        config, straggler=dataclasses.replace(config.straggler, remaining_s=48 * 3600.0)
    )
    decision = DecisionPolicy(config, clock=lambda: NOW).decide(straggler(saving=0.2))
    assert decision.action is Action.FAILOVER
    # the job's own figure wins over the operator's
    decision = DecisionPolicy(config, clock=lambda: NOW).decide(
        straggler(saving=0.2, remaining_s=3600.0)
    )
    assert decision.action is Action.NOTIFY and "the job declares" not in decision.reason


@pytest.mark.parametrize("saving,remaining_s,action,rule", [
    (0.20, None, Action.NOTIFY, "straggler-remaining-unknown"),
    (0.02, None, Action.NOTIFY, "straggler-not-worth-a-restart"),  # under min_saving
    # 12 min saved < restart + lost work
    (0.20, 3600.0, Action.NOTIFY, "straggler-not-worth-a-restart"),
    (0.20, 48 * 3600.0, Action.FAILOVER, "single-node-failover"),
])
def test_failover_only_when_the_saving_pays_for_a_restart(saving: float, remaining_s: float | None,
                                                          action: Action, rule: str) -> None:
    decision = policy().decide(straggler(saving=saving, remaining_s=remaining_s))
    assert decision.action is action and decision.policy_rule == rule
    if action is Action.NOTIFY:
        assert decision.exclude_nodes == () and "keeps running" in decision.reason


@pytest.mark.parametrize("incident", [
    straggler(cause=Cause.WORKLOAD_IMBALANCE),
    dataclasses.replace(straggler(), culprit_nodes=()),  # a slow replica spread over nodes
    straggler(confidence=0.5),
    dataclasses.replace(straggler(), culprit_nodes=("n1", "n2", "n3")),  # the rules would escalate
])
def test_a_slowdown_is_never_escalated_the_job_keeps_running(incident: Incident) -> None:
    decision = policy().decide(incident)
    assert decision.action is Action.NOTIFY
    assert decision.exclude_nodes == ()


def test_two_single_node_incidents_of_one_attempt_are_decided_as_one_set(store_dir: Path) -> None:
    """Issue 13: the policy decided each incident alone, so one systemic cause gave two failovers.
    """
    first, second = straggler(1, node="node-1"), straggler(2, node="node-2")
    # in one batch
    decisions = decide_all(policy(), [first, second])
    assert [d.action for d in decisions] == [Action.NOTIFY, Action.NOTIFY]
    assert all(d.policy_rule == "straggler-several-nodes" for d in decisions)
    # one after the other, through the store's history
    with SegmentSink(store_dir) as sink:
        sink.write("incidents", [first.to_row()])
    with Store(str(store_dir)) as store:
        decision = policy(history=StoreHistory(store)).decide(second)
        assert decision.action is Action.NOTIFY and "node-1" in decision.reason
        # a straggler of an earlier attempt (already handled) does not make a set
        later = straggler(3, node="node-3", attempt=1, remaining_s=48 * 3600.0)
        assert policy(history=StoreHistory(store)).decide(later).action is Action.FAILOVER


def test_the_saving_survives_the_store() -> None:
    row = straggler(saving=0.137).to_row()
    assert straggler_saving(Incident.from_row(row)) == pytest.approx(0.137)
    assert straggler_saving(Incident.from_row(straggler(saving=None).to_row())) is None
