"""The process source on what real processes wrote: torchrun's stderr and --log-dir trees of the
fixture scenarios, a supervisor watching real child processes, a real out-of-memory error; and
`faultlens ingest torchrun`."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultlens.attribution.reading.store import Store
from faultlens.collectors.sources.process_events import (
    EventContext,
    ProcessEventsError,
    ProcessSource,
    collect_paths,
    rows_from_error_file,
    rows_from_torchrun_output,
)
from faultlens.collectors.sources.source import NodeIdentity
from faultlens.collectors.store.schema import validate
from faultlens.controller.cli.main import main as cli

UTC = EventContext(tz=dt.UTC)


def _rows(art: Path) -> list[dict]:
    result = collect_paths([art / "torchrun_stderr.txt", art / "logdir"], UTC)
    assert result.errors == []
    validate("process_events", result.table())  # every row fits the schema
    return result.rows


def _pick(rows: list[dict], **match: object) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def test_crash_exception_rows(torch_artifacts: dict[str, Path]) -> None:
    art = torch_artifacts["crash_exception"]
    rows = _rows(art)
    assert {r["job_id"] for r in rows} == {"faultlens-crash-exception"}
    bug = _pick(rows, source="error_json", rank=2)
    assert [r["attempt"] for r in sorted(bug, key=lambda r: r["attempt"])] == [0, 1]
    assert {(r["kind"], r["exception_type"], r["is_secondary"]) for r in bug} == {
        ("exception", "ValueError", False)
    }
    assert len({r["fingerprint"] for r in bug}) == 1
    # ts is the error file's own timestamp
    worker = next((art / "logdir").glob("*/attempt_0/2"))
    stamp = int(
        json.loads((worker / "error.json").read_text())["message"]["extraInfo"]["timestamp"]
    )
    assert _pick(bug, attempt=0)[0]["ts"] == stamp * 10**9
    survivors = [r for r in _pick(rows, source="error_json") if r["rank"] != 2]
    assert survivors, "survivors that raised before torchrun's SIGTERM wrote error files"
    assert all(r["kind"] == "comm_error" and r["is_secondary"] for r in survivors)
    reported = _pick(rows, source="torchrun_report", rank=2)
    assert {(r["kind"], r["attempt"]) for r in reported} == {("exit", 1), ("exception", 1)}
    assert _pick(reported, kind="exit")[0]["exit_code"] == 1
    assert _pick(reported, kind="exception")[0]["fingerprint"] == bug[0]["fingerprint"]
    root = _pick(rows, source="torchrun_report", reported_root_cause=True, kind="exit")
    assert len(root) == 1  # torchrun's choice, recorded as it made it
    # a traceback seen in stderr.log, in torchrun's teed output and in error.json is kept once
    # (error.json)
    assert _pick(rows, source="stderr", rank=2, kind="exception") == []


def test_crash_sigkill_rows(torch_artifacts: dict[str, Path]) -> None:
    rows = _rows(torch_artifacts["crash_sigkill"])
    exits = {r["rank"]: r for r in _pick(rows, kind="exit")}
    assert sorted(exits) == [0, 1, 2, 3]
    assert (exits[1]["exit_code"], exits[1]["signal"], exits[1]["is_secondary"]) == (
        -9,
        "SIGKILL",
        False,
    )
    assert exits[1]["error_file"] is None
    for rank in (0, 2, 3):
        # torchrun's SIGTERM to a survivor: an echo, not the culprit
        if exits[rank]["signal"] == "SIGTERM":
            assert exits[rank]["is_secondary"]
        else:  # it failed on its own first: with the peer's death, a secondary communication error
            errors = _pick(rows, rank=rank, source="torchrun_report", kind="comm_error")
            assert errors and all(r["is_secondary"] for r in errors)
    assert len(_pick(rows, kind="exit", reported_root_cause=True)) == 1
    # no error file names the run: its log dir, given alongside, does
    assert {r["job_id"] for r in rows} == {"faultlens-crash-sigkill"}
    assert {r["attempt"] for r in rows} == {0}


def test_hang_rows_are_secondary_timeouts(torch_artifacts: dict[str, Path]) -> None:
    art = torch_artifacts["hang"]
    rows = _rows(art)
    errors = _pick(rows, source="error_json")
    assert {r["rank"] for r in errors} == {0, 1, 3}  # rank 2 was stuck outside, then SIGTERMed
    assert all(r["kind"] == "comm_error" and r["is_secondary"] for r in errors)
    assert any("Timed out waiting 6000ms" in r["message"] for r in errors)
    stuck = _pick(rows, kind="exit", rank=2)[0]
    assert (stuck["signal"], stuck["is_secondary"]) == ("SIGTERM", True)
    # torchrun's own error file (TORCHELASTIC_ERROR_FILE) holds its root cause and the exit code
    (top,) = rows_from_error_file(art / "torchrun_error.json", UTC)
    assert (top["reported_root_cause"], top["exit_code"], top["is_secondary"]) == (True, 1, True)
    reported_root = _pick(
        rows, source="torchrun_report", reported_root_cause=True, kind="comm_error"
    )[0]
    assert top["fingerprint"] == reported_root["fingerprint"]


def test_successful_run_gives_no_rows(torch_artifacts: dict[str, Path]) -> None:
    result = collect_paths([torch_artifacts["straggler"] / "torchrun_stderr.txt"])
    assert result.rows == [] and result.errors == []


def test_watchdog_and_oom_lines(tmp_path: Path) -> None:
    watchdog = (
        "[rank3]:[E1130 04:20:25.214000 8192 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
        "collective operation "
        "timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
        "Timeout(ms)=600000) ran "
        "for 600058 milliseconds before timing out.\n")
    rows = rows_from_torchrun_output(watchdog, UTC, fallback_ts=0)
    (row,) = rows
    assert (row["kind"], row["is_secondary"], row["rank"]) == ("watchdog_timeout", True, 3)
    assert dt.datetime.fromtimestamp(row["ts"] / 1e9).strftime("%m-%d %H:%M:%S") == "11-30 04:20:25"

    # torch's CUDA allocator message (torch >= 2.1), as a rank's stderr shows it
    cuda_oom = (
        "[rank5]: Traceback (most recent call last):\n"
        '[rank5]:   File "/workspace/train.py", line 88, in forward\n'
        "[rank5]:     h = self.mlp(x)\n"
        "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 5 "
        "has a total "
        "capacity of 79.10 GiB of which 3.06 MiB is free. Process 3771 has 79.09 GiB memory in "
        "use.\n")
    (row,) = rows_from_torchrun_output(cuda_oom, UTC, fallback_ts=0)
    assert (row["kind"], row["exception_type"], row["rank"], row["is_secondary"]) == (
        "oom", "torch.OutOfMemoryError", 5, False)

    oom = subprocess.run([sys.executable, "-c", "import torch; torch.empty(2**45, "
                                                "dtype=torch.float64)"],
                         capture_output=True, text=True, timeout=120)
    assert oom.returncode == 1
    log = tmp_path / "worker.err"
    log.write_text(oom.stderr)
    (row,) = collect_paths([log], UTC).rows
    assert (row["kind"], row["exception_type"], row["is_secondary"]) == (
        "oom",
        "RuntimeError",
        False,
    )
    assert "can't allocate memory" in row["message"]


def test_supervisor_exits_of_real_processes() -> None:
    source = ProcessSource(NodeIdentity(node="node-9", job_id="job-1", attempt=0))
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for rank, process in enumerate((killed, failed, stopped)):
        source.record_start(rank=rank, local_rank=rank, pid=process.pid)
    killed.send_signal(signal.SIGKILL)
    stopped.send_signal(signal.SIGTERM)
    for rank, process in enumerate((killed, failed, stopped)):
        source.record_exit(
            rank=rank,
            local_rank=rank,
            pid=process.pid,
            returncode=process.wait(timeout=30),
            terminated_by_us=process is stopped,
        )
    batch = source.poll()["process_events"]
    rows = batch.to_pylist()
    exits = {r["rank"]: r for r in rows if r["kind"] == "exit"}
    assert (exits[0]["exit_code"], exits[0]["signal"], exits[0]["is_secondary"]) == (
        -9,
        "SIGKILL",
        False,
    )
    assert (exits[1]["exit_code"], exits[1]["signal"]) == (3, None)
    assert (exits[2]["signal"], exits[2]["is_secondary"]) == ("SIGTERM", True)
    assert {r["node"] for r in rows} == {"node-9"} and {r["source"] for r in rows} == {"supervisor"}
    assert len([r for r in rows if r["kind"] == "start"]) == 3
    assert source.poll() == {}


def test_source_watches_a_log_dir(torch_artifacts: dict[str, Path], tmp_path: Path) -> None:
    run = next((torch_artifacts["crash_exception"] / "logdir").iterdir())
    copy = tmp_path / "logs" / run.name
    shutil.copytree(run / "attempt_0", copy / "attempt_0")
    source = ProcessSource(NodeIdentity(node="node-0"), paths=[tmp_path / "logs"])
    first = source.poll()["process_events"].to_pylist()
    # rank 2's bug is always there; how many survivors wrote an error file before torchrun's SIGTERM
    # depends on timing (seen: 1 to 3), so their count is not asserted
    assert {r["attempt"] for r in first} == {0}
    assert any(r["rank"] == 2 and r["exception_type"] == "ValueError" for r in first), first
    assert source.poll() == {}  # nothing changed, nothing new
    shutil.copytree(run / "attempt_1", copy / "attempt_1")
    time.sleep(0.01)
    second = source.poll()["process_events"].to_pylist()
    assert {r["attempt"] for r in second} == {1}
    assert any(r["rank"] == 2 and r["exception_type"] == "ValueError" for r in second), second
    assert source.errors == 0


def test_bad_error_files(tmp_path: Path, torch_artifacts: dict[str, Path]) -> None:
    truncated = tmp_path / "error.json"
    good = next(
        (torch_artifacts["crash_exception"] / "logdir").glob("*/attempt_0/2/error.json")
    ).read_text()
    truncated.write_text(good[: len(good) // 2])
    with pytest.raises(ProcessEventsError, match=f"{truncated}: not a torch error file: invalid "
                                                 "JSON"):
        rows_from_error_file(truncated)
    truncated.write_text('{"message": {"message": "x", "extraInfo": {"timestamp": "soon"}}}')
    with pytest.raises(ProcessEventsError, match="timestamp 'soon'"):
        rows_from_error_file(truncated)


def test_cli_ingest_torchrun(
    torch_artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    art = torch_artifacts["crash_exception"]
    store = tmp_path / "store"
    code = cli(
        [
            "ingest",
            "torchrun",
            str(art / "torchrun_stderr.txt"),
            str(art / "logdir"),
            "--store",
            str(store),
            "--utc",
        ]
    )
    assert code == 0
    assert "process_events rows" in capsys.readouterr().out
    with Store(str(store)) as opened:
        found = opened.query("SELECT attempt, rank, kind, source, fingerprint FROM process_events "
                             "WHERE exception_type = 'ValueError' AND source = 'error_json' ORDER "
                             "BY attempt"
                             ).to_pylist()
    assert [(r["attempt"], r["rank"]) for r in found] == [(0, 2), (1, 2)]


def test_cli_bad_input(
    tmp_path: Path, torch_artifacts: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nthis is not torchrun\n")
    assert cli(["ingest", "torchrun", str(garbage), "--store", str(tmp_path / "s1")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(garbage) in err

    cut = tmp_path / "cut.txt"
    text = (torch_artifacts["crash_sigkill"] / "torchrun_stderr.txt").read_text()
    cut.write_text(text[: text.index("Root Cause")])
    assert cli(["ingest", "torchrun", str(cut), "--store", str(tmp_path / "s2")]) == 2
    assert f"{cut}:" in capsys.readouterr().err

    # one corrupt error.json in a log dir: the other workers' rows are stored, the bad file is
    # named, exit 1
    logs = tmp_path / "logs"
    shutil.copytree(torch_artifacts["crash_exception"] / "logdir", logs)
    broken = next(logs.glob("*/attempt_0/1/error.json"))
    broken.write_text("{ truncated")
    store = tmp_path / "s3"
    assert cli(["ingest", "torchrun", str(logs), "--store", str(store)]) == 1
    assert str(broken) in capsys.readouterr().err
    expected = sorted(
        (int(f.parts[-3].split("_")[1]), int(f.parts[-2]))
        for f in logs.glob("*/attempt_*/*/error.json")
        if f != broken
    )
    assert len(expected) >= 4  # at least the two ValueErrors and two survivors of attempt 0
    with Store(str(store)) as opened:
        ranks = opened.query("SELECT DISTINCT attempt, local_rank FROM process_events WHERE source "
                             "= 'error_json'")
    assert sorted(zip(*ranks.to_pydict().values(), strict=True)) == expected
