"""What `faultlens run` records and does around a job's life, with real torch jobs (DDP over gloo,
CPU) under it: a slow teardown after the last step is a completed job (exit 0); an agent's death is
an agent_exit row; an agent that dies alone leaves no worker training unwatched (killed, each signal
recorded first as signal_sent); a failover the supervisor carried out is marked applied and
`faultlens deliver` never delivers it again; rich markup in failure text (gloo's
"[/__w/.../pair.cc:537]") is printed literally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from faultlens.attribution.reading.store import Store
from tests.conftest import REPO_ROOT

pytest.importorskip("torch")

DEMO_THRESHOLDS = REPO_ROOT / "rules" / "thresholds-demo.yaml"


def _run(
    tmp_path: Path,
    job: str,
    *args: str,
    nnodes: int = 2,
    nproc: int = 1,
    spares: int = 0,
    env: dict[str, str] | None = None,
    train: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    command = [
        sys.executable,
        "-m",
        "faultlens.controller.cli.main",
        "run",
        "--store",
        str(tmp_path / "store"),
        "--workdir",
        str(tmp_path / "work"),
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--spares",
        str(spares),
        "--job",
        job,
        "--thresholds",
        str(DEMO_THRESHOLDS),
        *args,
        "--",
        "-m",
        "faultlens.controller.demo.train",
        *train,
    ]
    try:
        return subprocess.run(
            command, cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300
        )
    finally:
        _kill_leftovers(tmp_path / "store", job)


def _kill_leftovers(store: Path, job: str) -> None:
    """A failing run must not leave workers behind on the machine (the test's own hygiene)."""
    if not store.exists():
        return
    for pid in _alive(_rank_pids(store, job)):
        psutil.Process(pid).kill()


def _rank_pids(store: Path, job: str) -> dict[int, tuple[str, int, int]]:
    with Store(store) as reader:
        rows = reader.query("SELECT DISTINCT pid, node, rank, attempt FROM ranks WHERE job_id = ?",
                            [job]).to_pylist()
    return {r["pid"]: (r["node"], r["rank"], r["attempt"]) for r in rows if r["pid"] is not None}


def _alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get(
                "FAULTLENS_STORE"
            ):
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


def _supervisor_rows(store: Path, job: str) -> list[dict]:
    with Store(store) as reader:
        return reader.query("SELECT ts, node, attempt, kind, rank, pid, exit_code, signal, "
                            "message, is_secondary "
                            "FROM process_events WHERE job_id = ? AND source = 'supervisor' ORDER "
                            "BY ts",
                            [job]).to_pylist()


def _out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_finished_job_that_tears_down_slower_than_the_hang_floor_completes(tmp_path):
    # every rank sleeps 8 s after its last step: longer than the demo thresholds' 4 s progress floor
    # exits take long on a loaded machine
    proc = _run(tmp_path, "slow-teardown", "--hang-grace", "60",
                train=("--steps", "10", "--step-sleep", "0.01", "--teardown-sleep", "8"))
    assert proc.returncode == 0, _out(proc)
    assert "training completed" in proc.stdout
    rows = _supervisor_rows(tmp_path / "store", "slow-teardown")
    exits = {r["node"]: r for r in rows if r["kind"] == "agent_exit"}
    assert set(exits) == {"node-0", "node-1"}
    assert all(
        r["exit_code"] == 0 and r["signal"] is None and r["rank"] is None for r in exits.values()
    ), exits
    # nothing was stopped: no agent got a signal from the supervisor
    assert not [r for r in rows if r["kind"] == "signal_sent" and r["signal"] == "SIGTERM"], rows
    with Store(tmp_path / "store") as reader:
        assert reader.query("SELECT count(*) AS n FROM decisions").to_pylist() == [{"n": 0}]


@pytest.mark.parametrize("loss", ["agent_loss", "node_loss"])
def test_a_lost_agent_is_recorded_and_leaves_no_worker_training(tmp_path, loss):
    fault = {"kind": loss, "node": "node-1", "step": 4}
    proc = _run(tmp_path, loss, nproc=2, env={"FAULTLENS_DEMO_FAULT": json.dumps(fault)},
                train=("--steps", "400", "--step-sleep", "0.03"))
    assert "MarkupError" not in proc.stderr, _out(proc)
    store = tmp_path / "store"
    rows = _supervisor_rows(store, loss)
    lost = [r for r in rows if r["kind"] == "agent_exit" and r["node"] == "node-1"]
    assert len(lost) == 1, rows
    assert (
        lost[0]["exit_code"] is None and lost[0]["signal"] == "SIGKILL" and lost[0]["rank"] is None
    ), lost
    assert not lost[0]["is_secondary"]  # the supervisor did not do it
    assert {r["node"] for r in rows if r["kind"] == "agent_exit"} == {"node-0", "node-1"}
    sent = {r["pid"]: r for r in rows if r["kind"] == "signal_sent"}
    if loss == "agent_loss":  # its workers outlived it: the supervisor killed them, saying so first
        orphans = {pid: r for pid, r in sent.items() if r["node"] == "node-1"}
        assert sorted(r["rank"] for r in orphans.values()) == [2, 3], rows
        for row in orphans.values():
            assert (
                row["signal"] == "SIGKILL"
                and "node-1" in row["message"]
                and row["ts"] >= lost[0]["ts"]
            ), row
    # no worker of the job is left running, and none of node-1's trained on to the end unwatched
    assert _alive([*_rank_pids(store, loss), *sent]) == []
    with Store(store) as reader:
        last = reader.query("SELECT max(step) AS last FROM steps WHERE job_id = ? AND node = "
                            "'node-1'",
                            [loss]).to_pylist()[0]["last"]
    assert last is None or last < 399
    # every signal the supervisor sent is a row, written before the signal's effect was seen
    for row in sent.values():
        assert row["is_secondary"] and row["message"] and row["attempt"] == 0


def test_failure_text_with_rich_markup_is_printed_literally(tmp_path):
    # gloo and torch text holds "[/path/file.cc:537]", which rich reads as a closing tag
    # (MarkupError)
    text = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] shard index out "
        "of range"
    )
    proc = _run(
        tmp_path,
        "markup",
        env={"FAULTLENS_DEMO_FAULT": json.dumps({"kind": "exception", "step": 2, "message": text})},
        train=("--steps", "200", "--step-sleep", "0.03"),
    )
    assert "MarkupError" not in proc.stderr and "Traceback" not in proc.stderr, _out(proc)
    assert proc.returncode == 1 and "markup: escalated" in proc.stdout, _out(proc)
    assert "[/__w/pytorch/pytorch/third_party/gloo" in proc.stdout.replace("\n", "")


def test_a_slowdown_never_stops_the_running_job(tmp_path):
    """One rank of four computes 4x slower from step 12 with no GPU signal. Whatever the engine
    makes of it (straggler or imbalance; notify, escalate, or a failover), the supervisor never
    stops the job for it except to fail over at a checkpoint boundary; the job trains every step and
    `faultlens run` exits 0."""
    fault = {"kind": "straggler", "rank": 3, "step": 12, "extra_s": 0.09}
    proc = _run(
        tmp_path,
        "slow",
        nproc=2,
        spares=1,
        env={"FAULTLENS_DEMO_FAULTS": json.dumps([fault])},
        train=("--steps", "90", "--step-sleep", "0.03"),
    )
    assert proc.returncode == 0, _out(proc)
    output = proc.stdout.replace("\n", " ")
    store = tmp_path / "store"
    with Store(store) as reader:
        decisions = reader.query("SELECT attempt, action, hook, delivery_status, reason FROM "
                                 "decisions "
                                 "WHERE job_id = 'slow' ORDER BY ts").to_pylist()
        last = reader.query("SELECT rank, max(step) AS last FROM steps WHERE job_id = 'slow' AND "
                            "phase = 'train' "
                            "GROUP BY rank ORDER BY rank").to_pylist()
    assert last == [{"rank": r, "last": 89} for r in range(4)]
    assert decisions, output  # the slowdown was found and decided (the test is about what follows)
    applied = {
        d["attempt"]: d
        for d in decisions
        if d["delivery_status"] == "applied" and d["action"] == "failover"
    }
    for decision in decisions:
        if decision["action"] != "failover":
            assert "the job keeps running" in output
            # no hook configured: the supervisor that showed it delivered it (applied, not pending)
            assert any(
                d["action"] == decision["action"] and d["delivery_status"] == "applied"
                for d in decisions
            ), decisions
    # a failover of the slowdown waited for a newer checkpoint, or was carried out at once because
    # the newest one was recent (losing no more work than the policy priced in)
    for decision in applied.values():
        assert decision["action"] == "failover" and (
            "at the checkpoint boundary" in decision["reason"]
            or "carried out at once" in decision["reason"]
        ), decision
    stopped = {r["attempt"] for r in _supervisor_rows(store, "slow")
               if r["kind"] == "signal_sent" and r["signal"] == "SIGTERM"}
    # stopped only to carry out such a failover
    assert stopped <= set(applied), (stopped, decisions)
