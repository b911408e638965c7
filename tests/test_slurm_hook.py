"""The Slurm hook and the Alertmanager hook against a real Slurm cluster and a real Alertmanager
(tests/slurm_cluster.py): every action the policy emits, delivered through the real Deliverer to a
real sbatch job; Slurm's own job and node records checked with scontrol."""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Decision, DeliveryStatus, Restore
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.controller.delivery import Deliverer
from faultlens.controller.hooks import AlertmanagerHook, RetryPolicy, SlurmHook, load_hooks
from faultlens.controller.slurm.restore import read_restore
from tests.conftest import REPO_ROOT

FAST = RetryPolicy(attempts=3, initial_s=0.05, factor=1.0)
ALL_ACTIONS = [a for a in Action if a is not Action.UNKNOWN]


def decision(
    n: int,
    action: Action,
    *,
    job: str,
    nodes: tuple[str, ...] = (),
    attempt: int = 0,
    restore: Restore | None = None,
    cause: Cause = Cause.GPU_HARDWARE,
) -> Decision:
    t0 = dt.datetime.now(dt.UTC)
    incident = Incident(
        f"inc-{job}-{n}",
        IncidentClass.CRASH,
        cause,
        t0,
        t0,
        0.95,
        "xid-79",
        "Xid 79",
        job_id=job,
        attempt=attempt,
        culprit_nodes=nodes,
        culprit_ranks=(2,),
    )
    return Decision.for_incident(
        incident,
        action=action,
        policy_rule="test",
        reason=f"Xid 79 (GPU fell off the bus) on {','.join(nodes) or 'no node'}",
        issued_at=t0,
        exclude_nodes=nodes if action in (Action.FAILOVER, Action.DRAIN) else (),
        restore=restore,
    )


def sleeper(tmp_path: Path) -> Path:
    script = tmp_path / "sleeper.sbatch"
    script.write_text(
        textwrap.dedent("""\
        #!/bin/bash
        echo "restart=${SLURM_RESTART_COUNT:-0} nodes=$SLURM_JOB_NODELIST"
        sleep 600
        """)
    )
    return script


def running_job(slurm, tmp_path: Path, name: str, nodes: int = 2) -> tuple[str, list[str]]:
    job_id = slurm.sbatch(
        sleeper(tmp_path),
        "-J",
        name,
        "-N",
        str(nodes),
        "--requeue",
        "-o",
        str(tmp_path / f"{name}-%j.out"),
    )
    record = slurm.wait_job(job_id, {"RUNNING"})
    return job_id, slurm.run("scontrol", "show", "hostnames", record["NodeList"]).split()


def deliver(store: Path, hooks, dec: Decision):
    deliverer = Deliverer(store, hooks, retry=FAST, sleep=lambda s: None)
    try:
        results = deliverer.submit(dec)
        record = deliverer.log.records([dec.decision_id])[dec.decision_id]
    finally:
        deliverer.close()
    return results, record


@pytest.fixture
def hook(tmp_path, slurm):
    return SlurmHook(tmp_path / "state", slurm_env={"SLURM_CONF": str(slurm.conf)}, retry=FAST)


def test_failover_drains_requeues_excluding_and_keeps_the_restore_point(
    slurm, hook, tmp_path, store_dir
):
    job_id, nodes = running_job(slurm, tmp_path, "llm-fo")
    culprit = nodes[1]
    restore = Restore("durable", 1200, "s3://ckpt/llm-fo/step-1200")
    dec = decision(1, Action.FAILOVER, job="llm-fo", nodes=(culprit,), restore=restore)
    results, _record = deliver(store_dir, [hook], dec)
    assert [r.status for r in results] == [DeliveryStatus.DELIVERED]
    node = slurm.node(culprit)
    assert "DRAIN" in node["State"] and dec.decision_id in node["Reason"]
    # the requeued job runs again at once (not after Slurm's 120 s requeue delay), elsewhere
    job = slurm.wait_job(job_id, {"RUNNING"}, timeout=30)
    assert job["Restarts"] == "1" and culprit in job["ExcNodeList"]
    assert culprit not in slurm.run("scontrol", "show", "hostnames", job["NodeList"]).split()
    assert dec.decision_id in job["Comment"]
    assert read_restore(hook.state_dir, "llm-fo") == {
        "FAULTLENS_RESTORE_TIER": "durable",
        "FAULTLENS_RESTORE_STEP": "1200",
        "FAULTLENS_RESTORE_URI": "s3://ckpt/llm-fo/step-1200",
        "FAULTLENS_RESTORE_DECISION": dec.decision_id,
    }
    # delivered again (at-least-once): refused by decision id, no second requeue
    hook.deliver(dec, dec.to_json())
    # the marker lost (killed between the requeue and the marker): Slurm's Restarts count refuses
    (hook.state_dir / "applied" / dec.decision_id).unlink()
    hook.deliver(dec, dec.to_json())
    assert slurm.job(job_id)["Restarts"] == "1"
    assert hook.applied(dec.decision_id)


def test_restart_requeues_in_place_nothing_excluded(slurm, hook, tmp_path, store_dir):
    job_id, nodes = running_job(slurm, tmp_path, "llm-rs")
    dec = decision(2, Action.RESTART, job="llm-rs", cause=Cause.SOFTWARE)
    results, _ = deliver(store_dir, [hook], dec)
    assert [r.status for r in results] == [DeliveryStatus.DELIVERED]
    job = slurm.wait_job(job_id, {"RUNNING"}, timeout=30)  # at once, in place
    assert job["Restarts"] == "1" and job["ExcNodeList"] == "(null)"
    assert slurm.idle_nodes() | set(nodes) == set(slurm.nodes)  # nothing drained
    for name in slurm.nodes:
        assert "DRAIN" not in slurm.node(name)["State"]
    deliver(store_dir, [hook], dec)
    assert slurm.job(job_id)["Restarts"] == "1"


def test_escalate_holds_the_job_with_a_reason_and_pages(slurm, hook, tmp_path, store_dir):
    job_id, _ = running_job(slurm, tmp_path, "llm-esc")
    page = AlertmanagerHook(slurm.alertmanager_url, store=str(store_dir), retry=FAST)
    dec = decision(3, Action.ESCALATE, job="llm-esc", cause=Cause.SOFTWARE, attempt=1)
    results, _record = deliver(store_dir, [hook, page], dec)
    assert {r.hook: r.status for r in results} == {
        "slurm": DeliveryStatus.DELIVERED,
        "alertmanager": DeliveryStatus.DELIVERED,
    }
    job = slurm.wait_job(job_id, {"PENDING"})
    assert "held" in job["Reason"].lower() and job["Priority"] == "0"
    assert f"escalate {dec.decision_id}" in job["Comment"]
    alerts = [a for a in slurm.alerts() if a["labels"].get("decision_id") == dec.decision_id]
    assert len(alerts) == 1
    labels, notes = alerts[0]["labels"], alerts[0]["annotations"]
    assert labels["alertname"] == "FaultlensEscalation" and labels["job"] == "llm-esc"
    assert "software" in notes["what"] and "attempt 1" in notes["where"]
    assert notes["why"] == dec.reason
    assert notes["command"] == f"faultlens incident --store {store_dir} {dec.incident_id}"
    # twice delivered, one page (Alertmanager keeps one alert per label set)
    page.deliver(dec, dec.to_json())
    alerts = [a for a in slurm.alerts() if a["labels"].get("decision_id") == dec.decision_id]
    assert len(alerts) == 1


def test_notify_comments_and_the_job_runs_on(slurm, hook, tmp_path, store_dir):
    job_id, _ = running_job(slurm, tmp_path, "llm-slow")
    page = AlertmanagerHook(slurm.alertmanager_url, retry=FAST)
    dec = decision(
        4, Action.NOTIFY, job="llm-slow", nodes=("node-2",), cause=Cause.WORKLOAD_IMBALANCE
    )
    results, _ = deliver(store_dir, [hook, page], dec)
    assert all(r.status is DeliveryStatus.DELIVERED for r in results)
    job = slurm.job(job_id)
    assert job["JobState"] == "RUNNING" and job["Restarts"] == "0"
    assert f"notify {dec.decision_id}" in job["Comment"]
    # a notice is not paged
    assert not [a for a in slurm.alerts() if a["labels"].get("decision_id") == dec.decision_id]


def test_drain_drains_and_pages_touching_no_job(slurm, hook, tmp_path, store_dir):
    job_id, nodes = running_job(slurm, tmp_path, "llm-dr")
    page = AlertmanagerHook(slurm.alertmanager_url, retry=FAST)
    dec = decision(5, Action.DRAIN, job="llm-dr", nodes=(nodes[0],), cause=Cause.GPU_HARDWARE)
    results, _ = deliver(store_dir, [hook, page], dec)
    assert all(r.status is DeliveryStatus.DELIVERED for r in results)
    node = slurm.node(nodes[0])
    assert "DRAIN" in node["State"] and dec.decision_id in node["Reason"]
    job = slurm.job(job_id)
    assert job["JobState"] == "RUNNING" and job["Restarts"] == "0"
    alerts = [a for a in slurm.alerts() if a["labels"].get("decision_id") == dec.decision_id]
    assert alerts and alerts[0]["labels"]["alertname"] == "FaultlensNodeDrain"
    assert alerts[0]["labels"]["nodes"] == nodes[0]


def test_a_failing_slurm_command_is_retried_and_its_error_kept(slurm, hook, tmp_path, store_dir):
    running_job(slurm, tmp_path, "llm-bad", nodes=1)
    calls = []
    real_run = hook.slurm.run

    class Counting(type(hook.slurm)):
        def run(self, *argv):
            calls.append(argv[:2])
            return real_run(*argv)

    hook.slurm = Counting(env=hook.slurm.env)
    dec = decision(6, Action.DRAIN, job="llm-bad", nodes=("node-9",))
    results, record = deliver(store_dir, [hook], dec)
    assert results[0].status is DeliveryStatus.FAILED and results[0].attempts == FAST.attempts
    assert calls.count(("scontrol", "update")) == FAST.attempts
    assert "node-9" in record.errors["slurm"] and "scontrol update" in record.errors["slurm"]
    assert record.status is DeliveryStatus.FAILED
    assert not hook.applied(dec.decision_id)


def test_a_decision_for_no_slurm_job_is_refused_at_once(slurm, hook, store_dir):
    dec = decision(7, Action.RESTART, job="no-such-job")
    results, record = deliver(store_dir, [hook], dec)
    assert results[0].status is DeliveryStatus.FAILED and results[0].attempts == 1
    assert "no Slurm job named 'no-such-job'" in record.errors["slurm"]


def test_the_shipped_hooks_file_builds_a_slurm_and_a_paging_hook():
    hooks = load_hooks(REPO_ROOT / "docs" / "deploy" / "slurm" / "hooks.yaml")
    kinds = {type(h).__name__ for h in hooks}
    assert {"SlurmHook", "AlertmanagerHook"} <= kinds
    text = (REPO_ROOT / "docs" / "deploy" / "slurm" / "hooks.yaml").read_text()
    assert "docs/deploy" not in text.split("\n", 3)[-1]  # no checkout path in a hook


def test_every_hook_kind_accepts_every_action(slurm, hook, tmp_path, store_dir):
    """Each action the policy emits, to a live job: the Slurm hook and the pager take all."""
    page = AlertmanagerHook(slurm.alertmanager_url, retry=FAST)
    for n, action in enumerate(ALL_ACTIONS):
        name = f"all-{action.value}"
        _, nodes = running_job(slurm, tmp_path, name, nodes=1)
        dec = decision(100 + n, action, job=name, nodes=tuple(nodes))
        _results, record = deliver(store_dir, [hook, page], dec)
        assert record.status is DeliveryStatus.DELIVERED, (action, record.errors)
        slurm.reset()
    assert json.dumps([a.value for a in ALL_ACTIONS])
