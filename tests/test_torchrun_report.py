"""torchrun's failure report, parsed from what real torchrun runs wrote to stderr (fixture
scenarios), and from reports torch's own ChildFailedError formats for the shapes the scenarios do
not produce."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from faultlens.collectors.artifacts.torchrun_report import (
    TorchrunOutput,
    TorchrunReportError,
    parse_report_time,
    parse_torchrun_output,
)
from faultlens.collectors.sources.process_events import EventContext, collect_paths


def _output(art: Path) -> TorchrunOutput:
    return parse_torchrun_output(
        (art / "torchrun_stderr.txt").read_text(), source=str(art), tz=dt.UTC
    )


def _assert_survivors_secondary(
    art: Path, output: TorchrunOutput, survivors: list, primary_rank: int
) -> None:
    """What the product must get right about the survivors, whatever error torch made them print
    (closed by peer, a receive timeout, SIGTERM from torchrun, ...): each is in the report, failed
    after the primary, and the process_events rows read from this run class every one of them
    secondary and the primary not."""
    for survivor in survivors:
        if survivor.signal == "SIGTERM":
            assert survivor.pid in output.sigterm_pids and survivor.exit_code == -15
        else:
            assert survivor.exit_code != 0 and survivor.traceback  # any secondary error text
    rows = collect_paths(
        [art / "torchrun_stderr.txt", art / "logdir"], EventContext(tz=dt.UTC)
    ).rows
    failures = [r for r in rows if r["kind"] != "start" and r["rank"] is not None]
    others = [r for r in failures if r["rank"] != primary_rank]
    assert others and all(r["is_secondary"] for r in others), [
        (r["rank"], r["kind"], r["message"]) for r in others if not r["is_secondary"]]
    assert not any(
        r["is_secondary"]
        for r in failures
        if r["rank"] == primary_rank and r["kind"] != "comm_error"
    )


def test_sigkill_report(torch_artifacts: dict[str, Path]) -> None:
    output = _output(torch_artifacts["crash_sigkill"])
    (report,) = output.reports
    assert report.title.endswith("train_scenario.py FAILED")
    assert sorted(f.rank for f in report.failures) == [0, 1, 2, 3]
    killed = next(f for f in report.failures if f.rank == 1)
    assert (killed.local_rank, killed.exit_code, killed.signal, killed.error_file) == (
        1,
        -9,
        "SIGKILL",
        None,
    )
    assert killed.traceback == f"Signal 9 (SIGKILL) received by PID {killed.pid}"
    assert [(a.exit_code, a.local_rank, a.pid) for a in output.agent_failures] == [
        (-9, 1, killed.pid)
    ]
    _assert_survivors_secondary(torch_artifacts["crash_sigkill"], output,
                                [f for f in report.failures if f.rank != 1], primary_rank=1)
    # the root cause is the earliest time torchrun saw: the SIGKILLed rank is stamped when torchrun
    # noticed it, so a survivor that wrote its error file first can be named instead (recorded as
    # torchrun said it)
    root = report.root_cause
    assert root is not None and root.time == min(
        f.time for f in report.failures if f.time is not None
    )


def test_exception_report_with_a_restart(torch_artifacts: dict[str, Path]) -> None:
    art = torch_artifacts["crash_exception"]
    output = _output(art)
    (report,) = output.reports  # torchrun reports only the last attempt's failures
    assert len(output.agent_failures) == 2  # one `failed (exitcode ...)` line per failed attempt
    assert report.attempt == 1
    bug = next(f for f in report.failures if f.rank == 2)
    assert (bug.exit_code, bug.signal, bug.attempt) == (1, None, 1)
    assert bug.error_file is not None and Path(bug.error_file).is_file()
    assert bug.traceback.startswith("Traceback (most recent call last):")
    assert bug.traceback.splitlines()[-1] == ("ValueError: injected bug: loss became nan at step 3 "
                                              "on rank 2")
    # the report's time is the error file's timestamp (seconds), shown in the host's local time
    error = json.loads(Path(bug.error_file).read_text())
    stamped = dt.datetime.fromtimestamp(int(error["message"]["extraInfo"]["timestamp"]))
    assert bug.time is not None and bug.time.replace(tzinfo=None) == stamped
    # torchrun's root cause: the earliest stamp (rank 2 unless a survivor's error file has the same
    # second)
    root = report.root_cause
    assert root is not None and root.time == bug.time
    survivors = [f for f in report.failures if f.rank != 2]
    assert {f.rank for f in survivors} == {0, 1, 3}
    _assert_survivors_secondary(art, output, survivors, primary_rank=2)


def test_hang_report_names_a_survivor_as_root_cause(torch_artifacts: dict[str, Path]) -> None:
    """Rank 2 skipped the collective; torchrun's root cause is whichever waiting rank timed out
    first.
    """
    (report,) = _output(torch_artifacts["hang"]).reports
    root = report.root_cause
    assert root is not None and root.rank != 2
    assert any(
        text in root.traceback for text in ("Timed out waiting", "Connection closed by peer")
    )
    stuck = next(f for f in report.failures if f.rank == 2)
    assert (stuck.exit_code, stuck.signal) == (-15, "SIGTERM")


def test_successful_run_has_no_report(torch_artifacts: dict[str, Path]) -> None:
    output = _output(torch_artifacts["straggler"])
    assert output.reports == () and output.agent_failures == ()


def _torch_report(failures: dict) -> str:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    return str(ChildFailedError("/opt/job/train.py", failures))


def test_single_failure_report_from_torchs_formatter(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    text = _torch_report(
        {7: ProcessFailure(local_rank=3, pid=4242, exitcode=-9, error_file=str(tmp_path / "x"))}
    )
    assert "<NO_OTHER_FAILURES>" in text
    (report,) = parse_torchrun_output(text).reports
    (failure,) = report.failures
    assert (
        failure.rank,
        failure.local_rank,
        failure.pid,
        failure.signal,
        failure.is_root_cause,
    ) == (7, 3, 4242, "SIGKILL", True)


def test_error_file_failure_from_torchs_formatter(torch_artifacts: dict[str, Path]) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = next(
        (torch_artifacts["crash_exception"] / "logdir").glob("*/attempt_0/2/error.json")
    )
    text = _torch_report({
        2: ProcessFailure(local_rank=2, pid=100, exitcode=1, error_file=str(error_file)),
        5: ProcessFailure(local_rank=1, pid=101, exitcode=-15, error_file="/nonexistent"),
    })
    report = parse_torchrun_output(text, tz=dt.UTC).reports[0]
    by_rank = {f.rank: f for f in report.failures}
    assert by_rank[2].is_root_cause  # its error file's timestamp is older than "now"
    assert by_rank[2].attempt == 0 and by_rank[2].error_file == str(error_file)
    assert "injected bug" in by_rank[2].traceback
    assert by_rank[5].signal == "SIGTERM" and by_rank[5].error_file is None


def test_cut_off_report_is_an_error_naming_the_line(torch_artifacts: dict[str, Path]) -> None:
    text = (torch_artifacts["crash_sigkill"] / "torchrun_stderr.txt").read_text()
    cut = text[: text.index("Root Cause")]
    with pytest.raises(TorchrunReportError, match=r"stderr.txt:\d+: .* (cut off|no Root Cause)"):
        parse_torchrun_output(cut, source="stderr.txt")
    broken = text.replace("exitcode  : -9", "exitcode  : minus nine")
    with pytest.raises(TorchrunReportError, match=r"exitcode 'minus nine"):
        parse_torchrun_output(broken, source="stderr.txt")


def test_report_time() -> None:
    assert parse_report_time("2026-11-30_04:32:41", dt.UTC) == dt.datetime(
        2026, 11, 30, 4, 32, 41, tzinfo=dt.UTC
    )
    local = parse_report_time("2026-11-30_04:32:41")
    assert local is not None and local.tzinfo is not None
    assert parse_report_time("yesterday") is None
