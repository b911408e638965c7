"""Command hook (JSON on stdin), file drop, entry-point hooks (group faultlens.hooks), hooks YAML.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import textwrap
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action, Decision, DeliveryStatus, Restore
from faultlens.attribution.incident import Cause, Evidence, Incident, IncidentClass
from faultlens.controller.checkpoints.manifest import Manifest, shard_entries
from faultlens.controller.delivery import DecisionLog, Deliverer
from faultlens.controller.hooks import (
    CommandHook,
    FileDropHook,
    HookConfigError,
    HookError,
    PermanentHookError,
    RetryPolicy,
    hooks_from_config,
    load_hooks,
)
from faultlens.controller.hooks.entrypoint import (
    EntryPointHookError,
    available,
    load_entry_point_hook,
)
from faultlens.controller.restore import RestorePlan

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def make_decision(n: int = 1) -> Decision:
    incident = Incident(
        f"inc-{n}",
        IncidentClass.CRASH,
        Cause.GPU_HARDWARE,
        T0,
        T0,
        0.97,
        "xid-79",
        "x",
        job_id="job-1",
        attempt=0,
        culprit_nodes=("node-1",),
        culprit_ranks=(2,),
        evidence=(Evidence("gpu_events", T0, "Xid 79"),),
    )
    return Decision.for_incident(
        incident,
        action=Action.FAILOVER,
        policy_rule="hardware-failover",
        reason="xid",
        issued_at=T0,
        exclude_nodes=("node-1",),
        restore=Restore("durable", 100, None),
    )


RECEIVER = textwrap.dedent("""
    import json, os, sys
    document = json.load(sys.stdin)
    out = sys.argv[1]
    with open(out, "a") as handle:
        record = {"id": os.environ["FAULTLENS_DECISION_ID"],
                  "action": os.environ["FAULTLENS_DECISION_ACTION"], "document": document}
        handle.write(json.dumps(record) + "\\n")
""")


def test_command_hook_gets_the_json_on_stdin(tmp_path: Path) -> None:
    script = tmp_path / "receiver.py"
    script.write_text(RECEIVER)
    out = tmp_path / "received.jsonl"
    decision = make_decision()
    CommandHook([sys.executable, str(script), str(out)], name="requeue").deliver(
        decision, decision.to_json()
    )
    received = [json.loads(line) for line in out.read_text().splitlines()]
    assert received[0]["id"] == decision.decision_id and received[0]["action"] == "failover"
    assert Decision.from_document(received[0]["document"]) == decision


def test_command_hook_failure_and_missing_program(tmp_path: Path) -> None:
    failing = CommandHook([sys.executable, "-c", "import sys; sys.stderr.write('queue full\\n'); "
                                                 "sys.exit(3)"])
    with pytest.raises(HookError, match="exit 3: queue full"):
        failing.deliver(make_decision(), make_decision().to_json())
    with pytest.raises(PermanentHookError, match="no such program"):
        CommandHook([str(tmp_path / "missing-program")]).deliver(
            make_decision(), make_decision().to_json()
        )


def test_file_drop_is_atomic_and_idempotent(tmp_path: Path) -> None:
    drop = FileDropHook(tmp_path / "spool", name="spool")
    decision = make_decision()
    drop.deliver(decision, decision.to_json())
    target = tmp_path / "spool" / f"{decision.decision_id}.json"
    first = target.read_text()
    drop.deliver(decision, decision.to_json())
    assert target.read_text() == first
    assert Decision.from_json(first) == decision
    # no temporary left
    assert sorted(p.name for p in (tmp_path / "spool").iterdir() if p.is_file()) == [target.name]


def test_file_drop_unwritable_directory_is_a_hook_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HookError):
        FileDropHook(blocker / "spool").deliver(make_decision(), make_decision().to_json())


RECORDER_MODULE = textwrap.dedent("""
    class RecorderHook:
        received = []

        def __init__(self, label="recorder"):
            self.label = label

        def deliver(self, decision, document):
            RecorderHook.received.append((self.label, decision.decision_id, document))
""")


@pytest.fixture
def installed_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real installed distribution on sys.path declaring two faultlens.hooks entry points: the
    restore hook of this package and a third-party recorder."""
    site = tmp_path / "site"
    (site / "faultlens_test_hooks-1.0.dist-info").mkdir(parents=True)
    (site / "faultlens_test_hooks-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: faultlens-test-hooks\nVersion: 1.0\n")
    (site / "faultlens_test_hooks-1.0.dist-info" / "entry_points.txt").write_text(
        "[faultlens.hooks]\nrestore = faultlens.controller.restore:RestoreHook\n"
        "recorder = faultlens_test_recorder:RecorderHook\nbroken = "
        "faultlens_test_recorder:Missing\n")
    (site / "faultlens_test_recorder.py").write_text(RECORDER_MODULE)
    monkeypatch.syspath_prepend(str(site))
    return site


def _write_checkpoint(directory: Path, step: int, world_size: int) -> None:
    files = {
        rank: (f"rank_{rank}.pt", f"state of rank {rank} at {step}".encode())
        for rank in range(world_size)
    }
    directory.mkdir(parents=True)
    for _, (name, data) in files.items():
        (directory / name).write_bytes(data)
    (directory / "manifest.json").write_bytes(
        Manifest(step, world_size, shard_entries(files)).to_json()
    )


def test_entry_point_hooks_are_found_and_built_with_options(installed_hooks: Path, tmp_path: Path,
                                                            store_dir: Path) -> None:
    assert available()["restore"] == "faultlens.controller.restore:RestoreHook"
    durable = tmp_path / "durable"
    _write_checkpoint(durable / "step-00000100", 100, 2)
    plan_file = tmp_path / "plan.json"
    hooks = hooks_from_config(
        [
            {
                "type": "entry_point",
                "name": "restore",
                "entry_point": "restore",
                "options": {
                    "tiers": [f"durable={durable}"],
                    "plan_file": str(plan_file),
                    "world_size": 2,
                },
            },
            {
                "type": "entry_point",
                "name": "ops",
                "entry_point": "recorder",
                "options": {"label": "ops"},
            },
        ]
    )
    deliverer = Deliverer(store_dir, hooks, sleep=lambda s: None)
    decision = make_decision()
    results = deliverer.submit(decision)
    deliverer.close()
    assert {(r.hook, r.status) for r in results} == {("restore", DeliveryStatus.DELIVERED),
                                                     ("ops", DeliveryStatus.DELIVERED)}
    plan = RestorePlan.from_json(plan_file.read_text())
    assert plan.step == 100 and plan.decision_id == decision.decision_id
    assert plan.source_for(1) == f"{durable}/step-00000100/rank_1.pt"
    recorder = sys.modules["faultlens_test_recorder"].RecorderHook
    assert recorder.received == [("ops", decision.decision_id, decision.to_json())]


def test_entry_point_errors_name_the_entry_point(installed_hooks: Path) -> None:
    with pytest.raises(EntryPointHookError, match=r"'nope' not found in group faultlens\.hooks"):
        load_entry_point_hook("nope")
    with pytest.raises(EntryPointHookError, match=r"'broken'.*cannot load"):
        load_entry_point_hook("broken")


def test_hooks_yaml_builds_every_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULTLENS_TEST_SECRET", "abc")
    path = tmp_path / "hooks.yaml"
    path.write_text(textwrap.dedent(f"""
        format_version: 1
        hooks:
          - {{type: webhook, name: ctl, url: "http://127.0.0.1:9/x",
             secret_env: FAULTLENS_TEST_SECRET, retry: {{attempts: 2, initial_s: 0.1}}}}
          - {{type: command, name: requeue, command: "{sys.executable} -c pass", timeout_s: 5}}
          - {{type: file, name: spool, directory: "{tmp_path / 'spool'}"}}
    """))
    hooks = load_hooks(path)
    assert [h.name for h in hooks] == ["ctl", "requeue", "spool"]
    assert hooks[0].retry == RetryPolicy(attempts=2, initial_s=0.1)
    assert hooks[1].argv == [sys.executable, "-c", "pass"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "format_version: 1\nhooks:\n  - {type: carrier_pigeon}\n",
            "hooks[0].type: expected one of webhook, command, file, entry_point, slurm, "
            "alertmanager, got 'carrier_pigeon'",
        ),
        (
            "format_version: 1\nhooks:\n  - {type: webhook, secret: x}\n",
            "hooks[0].url: required key is missing",
        ),
        (
            "format_version: 1\nhooks:\n  - {type: file, directory: /x, colour: red}\n",
            "hooks[0].colour: unknown key (not allowed here)",
        ),
        (
            "format_version: 1\nhooks:\n"
            "  - {type: file, directory: /x}\n  - {type: file, directory: /y}\n",
            "hooks[1].name: expected a unique name",
        ),
        ("format_version: 2\nhooks: []\n", "format_version: expected 1, got 2"),
        ("format_version: 1\nhooks: [\n", "not valid YAML"),
        ("format_version: 1\nhooks:\n  - {type: webhook, url: 'http://x/y'}\n", "a secret"),
    ],
)
def test_bad_hooks_file_names_file_key_and_expectation(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "hooks.yaml"
    path.write_text(text)
    with pytest.raises(HookConfigError) as info:
        load_hooks(path)
    assert str(info.value).startswith(str(path))
    assert expected in str(info.value)


def test_every_hook_kind_through_the_deliverer_and_a_redelivery(
    tmp_path: Path, store_dir: Path
) -> None:
    script = tmp_path / "receiver.py"
    script.write_text(RECEIVER)
    out = tmp_path / "received.jsonl"
    spool = tmp_path / "spool"
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the spool directory should be")
    hooks = [
        CommandHook([sys.executable, str(script), str(out)], name="requeue"),
        FileDropHook(spool, name="spool"),
        FileDropHook(
            blocked / "sub", name="broken-spool", retry=RetryPolicy(attempts=2, initial_s=0)
        ),
    ]
    decision = make_decision()
    deliverer = Deliverer(store_dir, hooks, sleep=lambda s: None)
    results = {r.hook: r.status for r in deliverer.submit(decision)}
    assert results == {"requeue": DeliveryStatus.DELIVERED, "spool": DeliveryStatus.DELIVERED,
                       "broken-spool": DeliveryStatus.FAILED}
    deliverer.close()
    blocked.unlink()  # the operator fixes the spool
    again = Deliverer(store_dir, hooks, sleep=lambda s: None)
    assert [(r.hook, r.status) for r in again.redeliver()] == [
        ("broken-spool", DeliveryStatus.DELIVERED)
    ]
    again.close()
    assert len(out.read_text().splitlines()) == 1  # the command was not run twice
    log = DecisionLog(store_dir)
    assert log.records()[decision.decision_id].status is DeliveryStatus.DELIVERED
    log.close()


def test_decision_persisted_without_hooks_is_delivered_later(
    tmp_path: Path, store_dir: Path
) -> None:
    decision = make_decision(5)
    Deliverer(store_dir, []).submit(decision)  # e.g. `faultlens decide` without --hooks
    spool = tmp_path / "spool"
    deliverer = Deliverer(store_dir, [FileDropHook(spool, name="spool")], sleep=lambda s: None)
    assert [(r.decision_id, r.status) for r in deliverer.redeliver()] == [(decision.decision_id,
                                                                          DeliveryStatus.DELIVERED)]
    deliverer.close()
    assert (spool / f"{decision.decision_id}.json").exists()


def test_example_hooks_file_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from faultlens.attribution.rulefile import validate_against
    from faultlens.controller.hooks.config import HooksFile
    from tests.conftest import REPO_ROOT

    path = REPO_ROOT / "rules" / "hooks.example.yaml"
    document = yaml.safe_load(path.read_text())
    validate_against(document, HooksFile, str(path))
    monkeypatch.setenv("FAULTLENS_WEBHOOK_SECRET", "x")
    built = hooks_from_config(
        [h for h in document["hooks"] if h["type"] != "entry_point"], source=str(path)
    )
    assert [h.name for h in built] == ["controller", "requeue", "spool"]
