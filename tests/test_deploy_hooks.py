"""The example decision receivers of docs/deploy/ do what docs/operations.md says, delivered by the
real hooks: the Kubernetes webhook receiver (a real HTTP server
reached by the real WebhookHook; kubectl is a recording stand-in) and the torchrun wrapper (a real
launcher process that fails, then a real file-drop decision). The Slurm hook is part of the package,
tested against a real Slurm cluster in tests/test_slurm_hook.py."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Decision, Restore
from faultlens.attribution.incident import Cause, Incident, IncidentClass
from faultlens.controller.hooks import FileDropHook, PermanentHookError, WebhookHook
from tests.conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "docs" / "deploy"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


RESTORE = Restore("durable", 1200, "s3://ckpt/llm-7b/step-1200")


def decision(
    n: int,
    action: Action = Action.FAILOVER,
    *,
    job: str = "llm-7b",
    attempt: int = 0,
    exclude: tuple[str, ...] = ("node-07",),
    restore: Restore | None = RESTORE,
) -> Decision:
    incident = Incident(
        f"inc-{n}",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        T0,
        T0,
        0.97,
        "xid-79",
        "Xid 79",
        job_id=job,
        attempt=attempt,
        culprit_nodes=exclude,
        culprit_ranks=(2,),
    )
    return Decision.for_incident(
        incident,
        action=action,
        policy_rule="hardware-failover",
        reason="Xid 79 on node-07",
        issued_at=T0,
        exclude_nodes=exclude if action is not Action.ESCALATE else (),
        restore=restore if action is Action.FAILOVER else None,
    )


# ----------------------------------------------------------------------------------------------
# Kubernetes


def _receiver_module():
    spec = importlib.util.spec_from_file_location(
        "webhook_receiver", DEPLOY / "kubernetes" / "webhook_receiver.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def k8s(tmp_path):
    module = _receiver_module()
    calls: list[tuple[list[str], str | None]] = []
    receiver = module.DecisionReceiver(
        "training",
        kubectl=lambda args, stdin: calls.append((list(args), stdin)),
        state_file=tmp_path / "handled.txt",
    )
    server = module.make_server(receiver, "s3cret", host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/faultlens/decisions"
    yield url, calls, module, tmp_path
    server.shutdown()
    server.server_close()


def test_k8s_receiver_cordons_records_the_restore_and_restarts_pods(k8s):
    url, calls, module, tmp_path = k8s
    hook = WebhookHook(url, secret="s3cret", name="k8s")
    first = decision(1)
    hook.deliver(first, first.to_json())
    assert calls[0] == (["cordon", "node-07"], None)
    assert calls[1][0] == ["apply", "-f", "-"]
    configmap = json.loads(calls[1][1])
    assert configmap["metadata"]["name"] == "llm-7b-faultlens-restore"
    assert configmap["data"] == {
        "decision_id": first.decision_id,
        "attempt": "1",
        "tier": "durable",
        "uri": "s3://ckpt/llm-7b/step-1200",
        "step": "1200",
    }
    assert calls[2] == (
        ["-n", "training", "delete", "pods", "-l", "faultlens.io/job=llm-7b", "--wait=false"],
        None,
    )
    hook.deliver(first, first.to_json())  # a duplicate delivery is acknowledged, nothing runs twice
    assert len(calls) == 3
    # the handled ids survive a restart of the receiver
    again = module.DecisionReceiver("training", kubectl=lambda a, s: calls.append((a, s)),
                                    state_file=tmp_path / "handled.txt")
    assert again.handle(json.loads(first.to_json())) == "duplicate"


def test_k8s_receiver_rejects_a_bad_signature(k8s):
    url, calls, _, _ = k8s
    forged = decision(2)
    with pytest.raises(PermanentHookError, match="401"):
        WebhookHook(url, secret="wrong", name="k8s").deliver(forged, forged.to_json())
    assert calls == []


# ----------------------------------------------------------------------------------------------
# torchrun

LAUNCHER = textwrap.dedent("""\
    import os, sys
    # stands in for torchrun's job: attempt 0 dies like a rank lost to Xid 79; later attempts
    # must restore
    attempt = int(os.environ["FAULTLENS_ATTEMPT"])
    with open(sys.argv[1], "a") as log:
        log.write(f"{attempt} {os.environ.get('FAULTLENS_RESTORE_STEP', '-')} {sys.argv[2:]}\\n")
    sys.exit(1 if attempt == 0 else 0)
""")


def _wrapper(tmp_path: Path, node: str, spool: Path) -> subprocess.Popen:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = {**os.environ, "FAULTLENS_JOB_ID": "llm-7b", "FAULTLENS_DECISION_SPOOL": str(spool),
           "FAULTLENS_NODE": node, "FAULTLENS_DECISION_WAIT": "30",
           "FAULTLENS_TORCHRUN": f"{sys.executable} {script} {tmp_path / (node + '.log')}"}
    return subprocess.Popen(
        [str(DEPLOY / "torchrun" / "faultlens-torchrun.sh"), "--nproc-per-node", "8", "train.py"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_torchrun_wrapper_restarts_from_the_decision_or_leaves_when_excluded(tmp_path):
    if shutil.which("bash") is None or shutil.which("python3") is None:
        pytest.skip("needs bash and python3")
    spool = tmp_path / "spool"
    spool.mkdir()
    healthy, excluded = _wrapper(tmp_path, "node-01", spool), _wrapper(tmp_path, "node-07", spool)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
        (tmp_path / f"{n}.log").exists() for n in ("node-01", "node-07")
    ):
        time.sleep(0.05)
    failover = decision(1)
    FileDropHook(spool, name="spool").deliver(failover, failover.to_json())
    _, err_healthy = healthy.communicate(timeout=30)
    _, err_excluded = excluded.communicate(timeout=30)
    assert healthy.returncode == 0, err_healthy
    assert (tmp_path / "node-01.log").read_text().splitlines() == [
        "0 - ['--nproc-per-node', '8', 'train.py']", "1 1200 ['--nproc-per-node', '8', 'train.py']"]
    assert excluded.returncode == 0 and "excluded" in err_excluded
    assert (tmp_path / "node-07.log").read_text().splitlines() == ["0 - ['--nproc-per-node', '8', "
                                                                   "'train.py']"]


def test_torchrun_wrapper_stops_on_escalation(tmp_path):
    if shutil.which("bash") is None or shutil.which("python3") is None:
        pytest.skip("needs bash and python3")
    spool = tmp_path / "spool"
    spool.mkdir()
    escalated = decision(2, Action.ESCALATE)
    FileDropHook(spool, name="spool").deliver(escalated, escalated.to_json())
    wrapper = _wrapper(tmp_path, "node-01", spool)
    _, err = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 1 and "decision escalate; stopping" in err
    assert len((tmp_path / "node-01.log").read_text().splitlines()) == 1
