"""`faultlens node-check` on the real Slurm cluster: a node drained by a faultlens decision comes
back after a clean check; a node with a GPU event since its drain stays out; a node that fails
again within the window after its return is a repeat offender, kept drained and never resumed by
the check; every check a row of the store's node_checks table; the collective self-test (real gloo
ranks) returns a node or keeps it out. GPU events enter the store the way a site's do:
`faultlens ingest kmsg` of kernel log lines (dmesg -T)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultlens.attribution.decision import Action
from faultlens.attribution.reading.store import Store
from faultlens.controller.hooks import SlurmHook
from faultlens.controller.slurm.nodecheck import drain_time
from faultlens.controller.slurm.selftest import collective_self_test
from tests.conftest import REPO_ROOT
from tests.test_slurm_hook import decision

XID_79 = "NVRM: Xid (PCI:0000:2b:00): 79, pid=2314, GPU has fallen off the bus."


def cli(*args: str, slurm, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SLURM_CONF": str(slurm.conf)}
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def check(node: str, store: Path, slurm) -> dict:
    result = cli("node-check", node, "--store", str(store), "--json", slurm=slurm)
    assert result.returncode in (0, 1), result.stderr
    out = json.loads(result.stdout)
    assert result.returncode == (0 if out["verdict"] == "pass" else 1)
    return out


def xid(node: str, store: Path, tmp_path: Path, slurm) -> None:
    """A kernel log line of Xid 79 on `node`, stamped now, into the store."""
    time.sleep(1.1)  # Slurm's drain stamp has seconds
    stamp = dt.datetime.now(dt.UTC).strftime("%a %b %e %H:%M:%S %Y")
    log = tmp_path / f"kmsg-{node}-{time.monotonic_ns()}.txt"
    log.write_text(f"[{stamp}] {XID_79}\n")
    result = cli(
        "ingest", "kmsg", str(log), "--node", node, "--utc", "--store", str(store), slurm=slurm
    )
    assert result.returncode == 0, result.stderr


def drain_by_decision(slurm, tmp_path: Path, node: str, n: int) -> None:
    hook = SlurmHook(tmp_path / "state", slurm_env={"SLURM_CONF": str(slurm.conf)})
    dec = decision(n, Action.DRAIN, job="fleet", nodes=(node,))
    hook.deliver(dec, dec.to_json())
    assert "DRAIN" in slurm.node(node)["State"]


def test_a_clean_node_returns_and_a_repeat_offender_is_kept_out(slurm, tmp_path, store_dir):
    drain_by_decision(slurm, tmp_path, "node-2", 1)
    first = check("node-2", store_dir, slurm)
    assert first["verdict"] == "pass" and first["action"] == "resumed"
    node = slurm.node("node-2")
    assert "DRAIN" not in node["State"]
    slurm.wait_idle(30)
    # back in service, it fails again: a new Xid, and faultlens drains it again
    xid("node-2", store_dir, tmp_path, slurm)
    drain_by_decision(slurm, tmp_path, "node-2", 2)
    second = check("node-2", store_dir, slurm)
    assert second["verdict"] == "repeat_offender" and second["action"] == "kept_drained"
    node = slurm.node("node-2")
    assert "DRAIN" in node["State"] and node["Reason"].startswith("repeat offender")
    # clean since, still out: a human returns a repeat offender
    third = check("node-2", store_dir, slurm)
    assert third["verdict"] == "repeat_offender" and "DRAIN" in slurm.node("node-2")["State"]
    store = Store(str(store_dir))
    try:
        rows = store.query("SELECT node, verdict, action FROM node_checks ORDER BY ts").to_pylist()
    finally:
        store.close()
    assert [(r["node"], r["verdict"], r["action"]) for r in rows] == [
        ("node-2", "pass", "resumed"),
        ("node-2", "repeat_offender", "kept_drained"),
        ("node-2", "repeat_offender", "kept_drained"),
    ]
    # the nodes view says where it stands: out as a repeat offender, returned once before
    shown = cli("nodes", "--store", str(store_dir), "--json", slurm=slurm)
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert (row["node"], row["state"], row["checks"], row["returns"]) == (
        "node-2",
        "repeat_offender",
        3,
        1,
    )
    assert row["reason"].startswith("repeat offender")


def test_a_gpu_event_since_the_drain_keeps_the_node_out(slurm, tmp_path, store_dir):
    drain_by_decision(slurm, tmp_path, "node-3", 3)
    xid("node-3", store_dir, tmp_path, slurm)
    xid("node-1", store_dir, tmp_path, slurm)  # another node's event is not node-3's
    out = check("node-3", store_dir, slurm)
    # the kernel line is an Xid 79 and a lost GPU; node-1's two rows are not node-3's
    assert out["verdict"] == "fail" and out["events"] == 2
    assert out["event_kinds"] == "gpu_lost, xid 79"
    node = slurm.node("node-3")
    assert "DRAIN" in node["State"] and "xid 79" in node["Reason"]
    # the healthy node is not drained by checking it (nothing since its last check window)
    assert "DRAIN" not in slurm.node("node-0")["State"]


def test_a_healthy_node_passes_and_is_left_alone(slurm, store_dir):
    out = check("node-0", store_dir, slurm)
    assert out == {**out, "verdict": "pass", "action": "none"}
    assert slurm.node("node-0")["State"] == "IDLE"


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (
            "faultlens drain dec-1: crash/gpu_hardware: Xid 79 [root@2026-12-07T15:04:23]",
            dt.datetime(2026, 12, 7, 15, 4, 23),
        ),
        ("repeat offender [slurm@2026-01-02T03:04:05]", dt.datetime(2026, 1, 2, 3, 4, 5)),
        ("no stamp", None),
        ("", None),
    ],
)
def test_drain_time_reads_slurms_reason_stamp(reason, expected):
    got = drain_time(reason)
    if expected is None:
        assert got is None
    else:
        assert got == expected.astimezone(dt.UTC)


def test_the_pages_node_check_command(slurm, tmp_path):
    """docs/slurm.md's node-check example, its /shared moved here: a healthy node passes."""
    from tests.test_slurm_e2e import example

    shared = tmp_path / "shared"
    argv = example("node-check").replace("/shared/", f"{shared}/").split()
    assert argv[:2] == ["faultlens", "node-check"]
    result = cli(*argv[1:], slurm=slurm)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("node-1: pass (none)")


GPUS = """\
format_version: 1
gpus:
  - {index: 0, uuid: GPU-0a0a0a0a-0000-4000-8000-000000000000, pci_bus_id: "00000000:18:00.0"}
  - {index: 1, uuid: GPU-0a0a0a0a-0000-4000-8000-000000000001, pci_bus_id: "00000000:2A:00.0"}
"""


@pytest.mark.parametrize(
    ("timeline", "problem"),
    [
        ("- {at: 0.0, gpu: 1, set: {ecc_dbe_volatile: 1, remap_pending: true}}", "GPU 1 double"),
        ('- {at: 0.0, gpu: 0, lost: "GPU is lost (NVML_ERROR_GPU_IS_LOST)"}', "GPU 0 lost"),
        ('- {at: 0.0, gpu: 1, event: {kind: xid, code: 79, message: "fell off"}}', "xid 79"),
    ],
)
def test_nvml_through_a_recorded_timeline_keeps_a_drained_node_out(
    slurm, tmp_path, store_dir, timeline, problem
):
    """The store is clean since the drain; the node's NVML (a recorded timeline: the boundary this
    machine has no GPU for) still answers a failing GPU: kept drained, the reason says what."""
    drain_by_decision(slurm, tmp_path, "node-3", 11)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GPUS + "timeline:\n  " + timeline + "\n")
    result = cli(
        *("node-check", "node-3", "--store", str(store_dir), "--json"),
        *("--nvml-timeline", str(bad)),
        slurm=slurm,
    )
    out = json.loads(result.stdout)
    assert result.returncode == 1 and out["verdict"] == "fail", result.stderr
    assert out["events"] == 0 and problem in out["reason"]
    node = slurm.node("node-3")
    assert "DRAIN" in node["State"] and "NVML" in node["Reason"]
    # NVML clean: the node comes back, and says what it checked
    clean = tmp_path / "clean.yaml"
    clean.write_text(GPUS)
    result = cli(
        *("node-check", "node-3", "--store", str(store_dir), "--json"),
        *("--nvml-timeline", str(clean)),
        slurm=slurm,
    )
    out = json.loads(result.stdout)
    assert result.returncode == 0 and out["action"] == "resumed", result.stderr
    assert out["reason"].endswith("NVML clean")
    assert "DRAIN" not in slurm.node("node-3")["State"]


def test_a_timeline_node_check_cannot_read_is_one_line_naming_it(slurm, tmp_path, store_dir):
    bad = tmp_path / "broken.yaml"
    bad.write_text("format_version: 1\ngpus: [{index: 0, uuid: nope}]\n")
    result = cli(
        "node-check", "node-0", "--store", str(store_dir), "--nvml-timeline", str(bad), slurm=slurm
    )
    assert result.returncode not in (0, 1)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "uuid" in lines[0]


def test_the_collective_self_test_fails_when_its_ranks_cannot_finish():
    # torch cannot even be imported in 0.2 s: the ranks are stopped, the test fails naming why
    late = collective_self_test(2, timeout_s=0.2)
    assert not late.ok and "did not finish within 0.2s" in late.detail
    assert late.seconds < 15


def test_a_failed_self_test_keeps_a_drained_node_out_and_a_passed_one_returns_it(
    slurm, tmp_path, store_dir
):
    drain_by_decision(slurm, tmp_path, "node-1", 7)
    argv = ("node-check", "node-1", "--store", str(store_dir), "--json", "--self-test", "2")
    failed = cli(*argv, "--self-test-timeout", "0.2", slurm=slurm)
    out = json.loads(failed.stdout)
    assert failed.returncode == 1 and out["verdict"] == "fail", failed.stderr
    assert out["action"] == "kept_drained" and out["self_test"]["ok"] is False
    assert "self-test" in slurm.node("node-1")["Reason"]
    # the budget is a limit, not a wait: wide for a machine shared at load 40+ (torch's import)
    passed = cli(*argv, "--self-test-timeout", "240", slurm=slurm)
    out = json.loads(passed.stdout)
    assert passed.returncode == 0 and out["verdict"] == "pass", passed.stderr
    assert out["action"] == "resumed" and out["self_test"]["ok"] is True
    assert "self-test all_reduce across 2 local ranks ok" in out["reason"]
    assert out["self_test"]["detail"] == "every rank saw 3"
    assert "DRAIN" not in slurm.node("node-1")["State"]
