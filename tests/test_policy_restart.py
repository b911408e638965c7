"""Restart in place (issue 33): a first occurrence is no verdict on the code. A software crash of
one rank, or a DataLoader worker killed on its host, the first time its fingerprint is seen in the
job -> restart (same nodes, nothing excluded, the newest good checkpoint); the same fingerprint
again -> escalate (rules/policy.yaml restart_budget); every rank raising it at once -> escalate;
hardware keeps failing over. History from a real store."""

from __future__ import annotations

import datetime as dt
import textwrap
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Restore, validate_document
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.policy import (
    DecisionPolicy,
    PolicyError,
    RestoreRequest,
    StoreHistory,
    load_policy,
)
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink

NOW = dt.datetime(2026, 12, 7, 12, 0, 0, tzinfo=dt.UTC)


def crash(
    n: int,
    *,
    rule: str = "crash-exception",
    cause: Cause = Cause.SOFTWARE,
    ranks: tuple[int, ...] = (3,),
    nodes: tuple[str, ...] = ("node-1",),
    fingerprint: str | None = "fp-a",
    attempt: int = 0,
    step: int | None = 8,
    job: str = "job-r",
) -> Incident:
    return Incident(
        incident_id=f"inc-{job}-{n}",
        incident_class=IncidentClass.CRASH,
        cause=cause,
        first_signal_ts=NOW - dt.timedelta(seconds=2),
        detected_ts=NOW,
        confidence=0.6,
        rule=rule,
        summary="crash",
        job_id=job,
        attempt=attempt,
        culprit_nodes=nodes,
        culprit_ranks=ranks,
        fingerprint=fingerprint,
        step=step,
        evidence=(Evidence("process_events", NOW, "RuntimeError: corrupt record"),),
    )


def chooser(seen: list[RestoreRequest]):
    def choose(request: RestoreRequest) -> Restore | None:
        seen.append(request)
        return Restore("local", 6)

    return choose


@pytest.mark.parametrize(
    ("rank", "step", "node"), [(0, 2, "node-0"), (3, 8, "node-1"), (1, 12, "node-0")]
)
def test_first_exception_of_one_rank_restarts_in_place(rank: int, step: int, node: str) -> None:
    requests: list[RestoreRequest] = []
    policy = DecisionPolicy(load_policy(), restore_chooser=chooser(requests), clock=lambda: NOW)
    decision = policy.decide(crash(1, ranks=(rank,), nodes=(node,), step=step))
    assert decision.action is Action.RESTART
    assert decision.policy_rule == "first-exception-restart"
    assert decision.exclude_nodes == ()
    assert decision.restore == Restore("local", 6)
    # the newest checkpoint on every node: nothing is left out
    assert requests == [RestoreRequest(job_id="job-r", exclude_nodes=())]
    assert "first occurrence" in decision.reason
    validate_document(decision.to_document())


def test_without_a_checkpoint_the_restart_is_from_the_beginning() -> None:
    decision = DecisionPolicy(load_policy(), clock=lambda: NOW).decide(crash(1))
    assert decision.action is Action.RESTART and decision.restore is None
    assert "from the beginning" in decision.reason


def test_a_dataloader_worker_killed_on_its_host_restarts_in_place() -> None:
    killed = crash(1, rule="dataloader-worker-killed", cause=Cause.UNKNOWN, fingerprint="fp-dl")
    decision = DecisionPolicy(load_policy(), clock=lambda: NOW).decide(killed)
    assert decision.action is Action.RESTART and decision.policy_rule == "transient-restart"


def _stored(store_dir: Path, incidents: list[Incident]) -> None:
    with SegmentSink(store_dir) as sink:
        sink.write("incidents", [i.to_row() for i in incidents])


@pytest.mark.parametrize(
    ("first", "again"),
    [
        # the same exception, same rank, another step (the checkpoint moved past the first one)
        (crash(1, step=8), crash(2, step=11, attempt=1)),
        # the same fingerprint on another rank of another node: the code, wherever it runs
        (crash(1, ranks=(0,), nodes=("node-0",)), crash(2, ranks=(3,), attempt=1)),
        # a DataLoader worker killed twice
        (
            crash(1, rule="dataloader-worker-killed", cause=Cause.UNKNOWN, fingerprint="fp-dl"),
            crash(
                2,
                rule="dataloader-worker-killed",
                cause=Cause.UNKNOWN,
                fingerprint="fp-dl",
                attempt=1,
                step=14,
            ),
        ),
    ],
)
def test_the_same_fingerprint_again_escalates(
    store_dir: Path, first: Incident, again: Incident
) -> None:
    _stored(store_dir, [first])
    with Store(str(store_dir)) as store:
        decision = DecisionPolicy(
            load_policy(), history=StoreHistory(store), clock=lambda: NOW
        ).decide(again)
    assert decision.action is Action.ESCALATE, decision.reason
    assert decision.exclude_nodes == () and decision.restore is None


def test_another_failure_after_a_restart_restarts_again(store_dir: Path) -> None:
    _stored(store_dir, [crash(1, fingerprint="fp-a")])
    with Store(str(store_dir)) as store:
        decision = DecisionPolicy(
            load_policy(), history=StoreHistory(store), clock=lambda: NOW
        ).decide(crash(2, fingerprint="fp-b", attempt=1, step=11))
    assert decision.action is Action.RESTART


@pytest.mark.parametrize("budget", [0, 2])
def test_the_restart_budget_is_data(tmp_path: Path, store_dir: Path, budget: int) -> None:
    text = load_policy().source
    changed = Path(text).read_text().replace("same_fingerprint: 1", f"same_fingerprint: {budget}")
    path = tmp_path / "policy.yaml"
    path.write_text(changed)
    _stored(store_dir, [crash(1)])
    with Store(str(store_dir)) as store:
        policy = DecisionPolicy(load_policy(path), history=StoreHistory(store), clock=lambda: NOW)
        second = policy.decide(crash(2, attempt=1, step=11))
    # budget 0: never restarted; budget 2: the second occurrence restarts too
    assert second.action is (Action.RESTART if budget == 2 else Action.ESCALATE)


def test_every_rank_raising_it_escalates_at_once() -> None:
    policy = DecisionPolicy(load_policy(), clock=lambda: NOW)
    # the crash analysis names no node when the same fingerprint is on several nodes
    everywhere = crash(
        1, ranks=(0, 1, 2, 3), nodes=(), step=0, rule="crash-software-same-fingerprint-multi-node"
    )
    assert policy.decide(everywhere).action is Action.ESCALATE
    # several ranks of one node failing the same way: not "one rank", no restart
    one_node = crash(2, ranks=(0, 1), nodes=("node-0",), step=0)
    assert policy.decide(one_node).action is Action.ESCALATE


@pytest.mark.parametrize("cause", [Cause.GPU_HARDWARE, Cause.HBM, Cause.NETWORK, Cause.HOST])
def test_hardware_keeps_failing_over(cause: Cause) -> None:
    found = crash(1, rule="crash-hardware-same-gpu", cause=cause)
    decision = DecisionPolicy(load_policy(), clock=lambda: NOW).decide(found)
    assert decision.action is Action.FAILOVER and decision.exclude_nodes == ("node-1",)


def test_a_signal_death_keeps_failing_over() -> None:
    found = crash(1, rule="crash-killed-by-signal", cause=Cause.UNKNOWN, fingerprint="SIGSEGV@r1")
    decision = DecisionPolicy(load_policy(), clock=lambda: NOW).decide(found)
    assert decision.action is Action.FAILOVER


def test_a_restart_rule_with_a_bad_budget_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        Path(load_policy().source)
        .read_text()
        .replace("same_fingerprint: 1", "same_fingerprint: -1")
    )
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert "restart_budget.same_fingerprint" in str(info.value)


def test_rules_can_match_the_attribution_rule_and_rank_count(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        textwrap.dedent("""\
        format_version: 1
        confidence_threshold: 0.6
        never_failover_causes: [software]
        retry_budget: {default: 1}
        rules:
          - id: two-ranks
            when: {rule: [crash-exception], culprit_ranks: {min: 2}}
            action: escalate
          - id: one-rank
            when: {rule: [crash-exception]}
            action: restart
          - id: rest
            when: {}
            action: escalate
        """)
    )
    policy = DecisionPolicy(load_policy(path), clock=lambda: NOW)
    assert policy.decide(crash(1, ranks=(0, 2))).policy_rule == "two-ranks"
    assert policy.decide(crash(2)).action is Action.RESTART
    assert policy.decide(crash(3, rule="other")).policy_rule == "rest"
