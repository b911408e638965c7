"""The decision policy (rules/policy.yaml): each rule, the guards, history from a real store."""

from __future__ import annotations

import datetime as dt
import textwrap
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Restore
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.attribution.policy import (
    DEFAULT_POLICY_PATH,
    DecisionPolicy,
    PolicyError,
    RestoreRequest,
    StoreHistory,
    load_policy,
    policy_from_document,
)
from faultlens.attribution.reading.store import Store
from faultlens.collectors.store.sink import SegmentSink
from faultlens.controller.delivery import Deliverer

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


def incident(
    n: int = 1,
    *,
    cls: IncidentClass = IncidentClass.CRASH,
    cause: Cause = Cause.GPU_HARDWARE,
    nodes: tuple[str, ...] = ("node-1",),
    confidence: float = 0.95,
    job: str = "job-a",
    attempt: int = 0,
    fingerprint: str | None = None,
    step: int | None = None,
    ts: dt.datetime = NOW,
) -> Incident:
    return Incident(
        incident_id=f"inc-{job}-{n}",
        incident_class=cls,
        cause=cause,
        first_signal_ts=ts - dt.timedelta(seconds=3),
        detected_ts=ts,
        confidence=confidence,
        rule="test-rule",
        summary="test",
        job_id=job,
        attempt=attempt,
        culprit_nodes=nodes,
        culprit_ranks=(2,),
        fingerprint=fingerprint,
        step=step,
        evidence=(Evidence("gpu_events", ts, "Xid 79"),),
    )


def policy(**kwargs) -> DecisionPolicy:
    return DecisionPolicy(load_policy(), clock=lambda: NOW, **kwargs)


def write_incidents(store_dir: Path, incidents: list[Incident]) -> None:
    with SegmentSink(store_dir) as sink:
        sink.write("incidents", [i.to_row() for i in incidents])


def test_default_policy_file_loads() -> None:
    config = load_policy()
    assert config.source == str(DEFAULT_POLICY_PATH)
    assert Cause.SOFTWARE in config.never_failover_causes
    assert config.rules[-1].id == "default-escalate"


@pytest.mark.parametrize(
    "cause",
    [
        Cause.GPU_HARDWARE,
        Cause.HBM,
        Cause.NVLINK,
        Cause.PCIE,
        Cause.THERMAL,
        Cause.HOST,
        Cause.NETWORK,
    ],
)
def test_hardware_cause_fails_over_excluding_the_culprit(cause: Cause) -> None:
    decision = policy().decide(incident(cause=cause))
    assert decision.action is Action.FAILOVER
    assert decision.exclude_nodes == ("node-1",)
    assert decision.policy_rule == "hardware-failover"
    assert decision.issued_at == NOW and decision.incident_id == "inc-job-a-1"


@pytest.mark.parametrize(
    "cls", [IncidentClass.COLLECTIVE_HANG, IncidentClass.STRAGGLER, IncidentClass.CRASH]
)
def test_single_node_hang_straggler_or_crash_without_known_cause_fails_over(
    cls: IncidentClass,
) -> None:
    decision = policy().decide(incident(cls=cls, cause=Cause.UNKNOWN, confidence=0.9))
    assert decision.action is Action.FAILOVER
    assert decision.policy_rule == "single-node-failover"


def test_unknown_cause_on_two_nodes_escalates() -> None:
    decision = policy().decide(incident(cls=IncidentClass.COLLECTIVE_HANG, cause=Cause.UNKNOWN,
                                        nodes=("node-1", "node-2")))
    assert decision.action is Action.ESCALATE
    assert decision.policy_rule == "default-escalate"


@pytest.mark.parametrize("cause", [Cause.SOFTWARE, Cause.OOM])
def test_software_escalates(cause: Cause) -> None:
    decision = policy().decide(incident(cause=cause, fingerprint="fp-1"))
    assert decision.action is Action.ESCALATE
    assert decision.exclude_nodes == () and decision.restore is None


def test_workload_imbalance_notifies_and_the_job_keeps_running() -> None:
    decision = policy().decide(
        incident(cls=IncidentClass.STRAGGLER, cause=Cause.WORKLOAD_IMBALANCE)
    )
    # a slowdown never stops a running job (tests/test_straggler_policy.py)
    assert decision.action is Action.NOTIFY
    assert decision.policy_rule == "straggler-systemic" and decision.exclude_nodes == ()


def test_software_is_never_failed_over_even_by_a_permissive_rule_order() -> None:
    document = {
        "format_version": 1,
        "confidence_threshold": 0.5,
        "never_failover_causes": ["software", "oom"],
        "retry_budget": {"default": 10},
        "rules": [{"id": "everything-fails-over", "when": {}, "action": "failover"}],
    }
    config = policy_from_document(document, source="permissive.yaml")
    decision = DecisionPolicy(config, clock=lambda: NOW).decide(incident(cause=Cause.SOFTWARE))
    assert decision.action is Action.ESCALATE
    assert decision.policy_rule == "everything-fails-over:never-failover"
    assert DecisionPolicy(config, clock=lambda: NOW).decide(incident()).action is Action.FAILOVER


def test_same_fingerprint_on_several_nodes_is_software() -> None:
    decision = policy().decide(
        incident(cause=Cause.UNKNOWN, nodes=("node-1", "node-2"), fingerprint="fp-9")
    )
    assert decision.action is Action.ESCALATE
    assert decision.policy_rule == "software-repeat"
    assert decision.cause is Cause.SOFTWARE
    assert "fp-9" in decision.reason


def test_same_fingerprint_seen_before_on_another_node_is_software(store_dir: Path) -> None:
    earlier = incident(1, cause=Cause.UNKNOWN, nodes=("node-2",), fingerprint="fp-7", attempt=0,
                       ts=NOW - dt.timedelta(minutes=5))
    write_incidents(store_dir, [earlier])
    current = incident(2, cause=Cause.UNKNOWN, nodes=("node-1",), fingerprint="fp-7", attempt=1)
    with Store(str(store_dir)) as store:
        decision = policy(history=StoreHistory(store)).decide(current)
        assert decision.action is Action.ESCALATE and decision.cause is Cause.SOFTWARE
        assert "node-2" in decision.reason
        # the same exception on the same node only: not (yet) a software verdict
        other = incident(3, cause=Cause.UNKNOWN, nodes=("node-2",), fingerprint="fp-7", attempt=1)
        assert policy(history=StoreHistory(store)).decide(other).action is Action.FAILOVER


def test_failure_again_at_the_same_step_after_restart_is_software(store_dir: Path) -> None:
    first = incident(1, cause=Cause.UNKNOWN, nodes=("node-1",), step=120, attempt=0,
                     ts=NOW - dt.timedelta(minutes=5))
    write_incidents(store_dir, [first])
    again = incident(2, cause=Cause.UNKNOWN, nodes=("node-3",), step=120, attempt=1)
    elsewhere = incident(3, cause=Cause.UNKNOWN, nodes=("node-3",), step=480, attempt=1)
    hardware = incident(4, cause=Cause.GPU_HARDWARE, nodes=("node-3",), step=120, attempt=1)
    with Store(str(store_dir)) as store:
        history = StoreHistory(store)
        decision = policy(history=history).decide(again)
        assert decision.action is Action.ESCALATE and decision.policy_rule == "software-repeat"
        assert "step 120" in decision.reason
        assert policy(history=history).decide(elsewhere).action is Action.FAILOVER
        # a hardware cause with its own evidence is trusted even at the same step
        assert policy(history=history).decide(hardware).action is Action.FAILOVER


def test_no_certain_culprit_escalates() -> None:
    low = policy().decide(incident(confidence=0.4))
    assert low.action is Action.ESCALATE and low.policy_rule == "low-confidence"
    nobody = policy().decide(incident(nodes=()))
    assert nobody.action is Action.ESCALATE and nobody.policy_rule == "no-culprit"
    # the straggler threshold is stricter (confidence_by_class); an uncertain straggler is notified,
    # not stopped
    assert policy().decide(incident(cls=IncidentClass.STRAGGLER, cause=Cause.UNKNOWN,
                                    confidence=0.65)).action is Action.NOTIFY


def test_too_many_nodes_escalates() -> None:
    decision = policy().decide(incident(cause=Cause.NETWORK, nodes=("n1", "n2", "n3")))
    assert decision.action is Action.ESCALATE
    assert decision.policy_rule.endswith("too-many-nodes")


def test_retry_budget_per_root_cause(store_dir: Path) -> None:
    config = load_policy()
    budget = config.retry_budget(Cause.UNKNOWN)
    assert budget == 2
    deliverer = Deliverer(store_dir, [])
    with Store(str(store_dir)) as store:
        history = StoreHistory(store)
        for n in range(budget):
            decision = policy(history=history).decide(
                incident(
                    n, cls=IncidentClass.COLLECTIVE_HANG, cause=Cause.UNKNOWN, nodes=(f"node-{n}",)
                )
            )
            assert decision.action is Action.FAILOVER
            deliverer.submit(decision)
        spent = policy(history=history).decide(
            incident(9, cls=IncidentClass.COLLECTIVE_HANG, cause=Cause.UNKNOWN, nodes=("node-9",))
        )
        assert spent.action is Action.ESCALATE
        assert spent.policy_rule == "single-node-failover:retry-budget-spent"
        # another root cause has its own budget; another job too
        assert (
            policy(history=history).decide(incident(10, cause=Cause.HBM)).action is Action.FAILOVER
        )
        assert (
            policy(history=history)
            .decide(
                incident(11, cls=IncidentClass.COLLECTIVE_HANG, cause=Cause.UNKNOWN, job="job-b")
            )
            .action
            is Action.FAILOVER
        )
    deliverer.close()


def test_lemon_node_is_excluded_proactively(store_dir: Path) -> None:
    old = NOW - dt.timedelta(days=2)
    history_incidents = [
        incident(1, nodes=("node-9",), job="job-x", ts=old),
        incident(2, nodes=("node-9",), job="job-y", ts=old),
        incident(
            3, cause=Cause.HBM, nodes=("node-9",), job="job-y", ts=old + dt.timedelta(hours=1)
        ),
        incident(4, nodes=("node-5",), job="job-x", ts=old),  # once: not a lemon
        # three times in one job: not across jobs
        incident(5, nodes=("node-6",), job="job-z", ts=old),
        incident(6, nodes=("node-6",), job="job-z", ts=old),
        incident(7, nodes=("node-6",), job="job-z", ts=old),
        # software does not count
        incident(8, cause=Cause.SOFTWARE, nodes=("node-7",), job="job-x", ts=old),
        incident(9, cause=Cause.SOFTWARE, nodes=("node-7",), job="job-y", ts=old),
        incident(10, cause=Cause.SOFTWARE, nodes=("node-7",), job="job-z", ts=old),
    ]
    write_incidents(store_dir, history_incidents)
    with SegmentSink(store_dir) as sink:
        sink.write("ranks", [{"ts": NOW, "job_id": "job-a", "node": node, "rank": r}
                             for r, node in enumerate(["node-1", "node-9", "node-6", "node-7"])])
    with Store(str(store_dir)) as store:
        p = policy(history=StoreHistory(store))
        assert [lemon.node for lemon in p.lemon_nodes()] == ["node-9"]
        decision = p.decide(incident(20, job="job-a", nodes=("node-1",)))
        assert decision.action is Action.FAILOVER
        assert decision.exclude_nodes == ("node-1", "node-9")
        assert "lemon" in decision.reason and "node-9 (3 incidents in 2 jobs)" in decision.reason
        # a job that does not run on the lemon is not touched by it
        assert p.decide(incident(21, job="job-other", nodes=("node-1",))).exclude_nodes == (
            "node-1",
        )
        # the window: the same history seen 40 days later has no lemons
        later = DecisionPolicy(load_policy(), history=StoreHistory(store),
                               clock=lambda: NOW + dt.timedelta(days=40))
        assert later.lemon_nodes() == []


@pytest.mark.parametrize("when", [{"class": ["health"]}, {"class": ["crash"]}, {}])
def test_a_notify_rule_matched_by_class_or_catch_all_never_fails_over(when: dict) -> None:
    """A user's rule `action: notify` chosen by class (not by cause) or as the catch-all is a
    notification, for every class: it used to fall through to the failover guards and fail the
    culprit node over."""
    document = {
        "format_version": 1,
        "confidence_threshold": 0.5,
        "never_failover_causes": ["software", "oom"],
        "retry_budget": {"default": 10},
        "rules": [
            {"id": "tell-me", "when": when, "action": "notify", "reason": "watch it"},
            {"id": "the-rest", "when": {}, "action": "failover"},
        ],
    }
    config = policy_from_document(document, source="notify.yaml")
    cls = IncidentClass.HEALTH if when.get("class") == ["health"] else IncidentClass.CRASH
    decision = DecisionPolicy(config, clock=lambda: NOW).decide(incident(cls=cls, cause=Cause.HBM))
    assert (decision.action, decision.policy_rule, decision.exclude_nodes) == (
        Action.NOTIFY,
        "tell-me",
        (),
    )


def test_critical_health_event_gives_a_proactive_drain() -> None:
    health = incident(cls=IncidentClass.HEALTH, cause=Cause.HBM, nodes=("node-4",))
    decision = policy(restore_chooser=lambda request: Restore("durable", 10, None)).decide(health)
    assert decision.action is Action.DRAIN
    assert decision.exclude_nodes == ("node-4",)
    assert decision.restore is None  # nothing failed: nothing to restore
    assert decision.policy_rule == "health-drain"


def test_restore_choice_is_delegated_with_the_exclusion_and_corruption_bound() -> None:
    requests: list[RestoreRequest] = []

    def chooser(request: RestoreRequest) -> Restore | None:
        requests.append(request)
        return Restore("peer", 300, None)

    decision = policy(restore_chooser=chooser).decide(incident(cause=Cause.GPU_HARDWARE, step=310))
    assert decision.restore == Restore("peer", 300, None)
    assert requests[-1].exclude_nodes == ("node-1",)
    assert requests[-1].before_ts is None and requests[-1].before_step is None
    corrupt = incident(2, cause=Cause.DATA_CORRUPTION, step=310)
    decision = policy(restore_chooser=chooser).decide(corrupt)
    assert decision.action is Action.FAILOVER
    assert requests[-1].before_ts == corrupt.first_signal_ts and requests[-1].before_step == 310
    assert "corruption" in decision.reason


def test_no_surviving_checkpoint_still_fails_over_from_the_beginning() -> None:
    decision = policy(restore_chooser=lambda request: None).decide(incident())
    assert decision.action is Action.FAILOVER and decision.restore is None
    assert "restart from the beginning" in decision.reason


def test_exactly_one_decision_per_incident() -> None:
    p = policy()
    assert p.decide(incident()).decision_id == p.decide(incident()).decision_id


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_bad_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "format_version: 1\nrules: [\n  - id: x\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value).startswith(f"{path}: line ")
    assert "not valid YAML" in str(info.value)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda t: t.replace("confidence_threshold: 0.6", "confidence_threshold: 2"),
            ": confidence_threshold: expected less than or equal to 1, got 2",
        ),
        (
            lambda t: t.replace("format_version: 1", "format_version: 7"),
            ": format_version: expected 1, got 7",
        ),
        (
            lambda t: t.replace("action: drain", "action: reboot"),
            ": rules[0].action: expected one of failover, restart, escalate, notify, drain, "
            "got 'reboot'",
        ),
        (
            lambda t: t.replace("    unknown: 2", "    cosmic: 2"),
            ": retry_budget.by_cause.cosmic: expected one of ",
        ),
        (
            lambda t: t.replace(
                "when: {cause: [gpu_hardware,", "when: {cause: [software, gpu_hardware,"
            ),
            ": rules[5].when.cause: a failover rule may not match a never_failover cause "
            "(software)",
        ),
        (
            lambda t: t.replace(
                "  - id: default-escalate\n    when: {}\n",
                "  - id: default-escalate\n    when: {class: [crash]}\n",
            ),
            ": rules: expected a last catch-all rule",
        ),
    ],
)
def test_invalid_policy_names_file_key_and_expectation(tmp_path: Path, edit, expected: str) -> None:
    text = DEFAULT_POLICY_PATH.read_text()
    changed = edit(text)
    assert changed != text
    path = _write(tmp_path, changed)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "nope.yaml")
