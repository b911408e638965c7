"""The flight-recorder trigger: the dumps real torchrun ranks wrote with it (fixture scenarios), and
its signal, trigger-file, exception and failure paths in processes of its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.artifacts.safe_pickle import safe_load
from faultlens.collectors.sources.pystack import (
    ProcessStack,
    StackPlace,
    load_stack_dir,
    parse_py_spy,
    where,
    with_fallback,
)
from faultlens.collectors.training.fr_trigger import FlightRecorderTrigger, repair_pg_config
from faultlens.collectors.training.own_stack import OWN_STACKS_DIR, own_stacks
from tests.conftest import REPO_ROOT

PROBE = REPO_ROOT / "tests" / "torch_jobs" / "trigger_probe.py"


def _ranks(directory: Path, suffix: str = "pkl") -> set[int]:
    return {int(p.stem.split("_")[1]) for p in directory.glob(f"rank_*.{suffix}")}


def _meta(art: Path) -> dict:
    return json.loads((art / "meta.json").read_text())


# ------------------------------------------------------------------------------------ real torchrun
# dumps


def test_live_hang_dumps_show_the_collective_rank_2_never_joined(
    torch_artifacts: dict[str, Path],
) -> None:
    art = torch_artifacts["hang"]
    meta = _meta(art)
    seq = meta["expected"]["collective_seq_id"]
    assert meta["dump_request"]["method"] == "signal" and meta["dump_request"]["ranks_written"] == [
        0,
        1,
        2,
        3,
    ]
    assert _ranks(art / "dumps") == _ranks(art / "dumps", "json") == {0, 1, 2, 3}
    for rank in range(4):
        trace = safe_load(art / "dumps" / f"rank_{rank}.pkl")
        assert (trace["rank"], trace["world_size"], trace["node"]) == (rank, 4, "node-0")
        world = [e for e in trace["entries"] if e["process_group"][1] == "default_pg"]
        last = world[-1]
        if rank == 2:
            assert last["collective_seq_id"] == seq - 1  # it skipped the collective
        else:
            # enqueued, not completed: live
            assert (last["collective_seq_id"], last["retired"]) == (seq, False)
            assert last["frames"], "the hang scenario dumps with Python stack traces"
    # on the way out of the timeout (or of the peer's death) every waiting rank wrote a second dump;
    # whether the failed collective shows as retired there depends on how the wait ended (seen both
    # ways), so only the live dump above is evidence of the hang
    for rank in (0, 1, 3):
        exit_trace = safe_load(art / "dumps_on_exit" / f"rank_{rank}.pkl")
        world = [e for e in exit_trace["entries"] if e["process_group"][1] == "default_pg"]
        assert world[-1]["collective_seq_id"] == seq


def test_each_rank_writes_where_it_is_beside_its_dump(
    torch_artifacts: dict[str, Path], tmp_path: Path
) -> None:
    """The trigger's own stacks (no py-spy, no ptrace): rank 2, stuck outside any collective, is in
    the scenario's own code; ranks 0, 1 and 3 are blocked in torch.distributed.all_reduce. The dump
    thread itself is not listed."""
    art = torch_artifacts["hang"]
    stacks = load_stack_dir(art / "dumps" / OWN_STACKS_DIR)
    assert set(stacks) == {0, 1, 2, 3}
    places = {rank: where(stack) for rank, stack in stacks.items()}
    assert places[2].kind == StackPlace.OUTSIDE and "train_scenario.py" in (
        places[2].frame or ""
    ), places[2]
    assert "communicate" in (places[2].frame or "") and places[2].thread == "MainThread"
    for rank in (0, 1, 3):
        assert (places[rank].kind, places[rank].op) == (StackPlace.IN_COLLECTIVE, "all_reduce"), (
            places[rank]
        )
    assert not any(t.name == "faultlens-fr-sigwait" for s in stacks.values() for t in s.threads)
    # the command reads them by default (no py-spy stacks there): the culprit's frame is in the
    # verdict
    copy = tmp_path / "dumps"
    shutil.copytree(art / "dumps", copy)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "analyze-hang",
            str(copy),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["culprit_ranks"] == [2]
    assert "rank 2 is in Job.communicate (train_scenario.py:" in report["reason"], report["reason"]


def test_own_stacks_name_each_thread_innermost_first(tmp_path: Path) -> None:
    """own_stacks from a real second thread blocked in a wait, read back by the py-spy reader."""
    import threading

    release = threading.Event()

    def loader_next() -> None:
        release.wait(30)

    thread = threading.Thread(target=loader_next, name="loader")
    thread.start()
    try:
        document = own_stacks()
    finally:
        release.set()
        thread.join()
    stack = parse_py_spy(document)
    assert stack.error is None and stack.pid == os.getpid()
    loader = next(t for t in stack.threads if t.name == "loader")
    assert loader.frames[0].name == "Event.wait" or loader.frames[0].filename.endswith(
        "threading.py"
    )
    assert any(f.name.endswith("loader_next") for f in loader.frames)
    assert where(stack, [loader.thread_id]).kind == StackPlace.OUTSIDE
    assert "loader_next" in (where(stack, [loader.thread_id]).frame or "")
    # the caller is left out
    assert threading.get_ident() not in {t.thread_id for t in stack.threads}


def test_py_spy_stacks_fall_back_to_the_ranks_own(torch_artifacts: dict[str, Path]) -> None:
    own = load_stack_dir(torch_artifacts["hang"] / "dumps" / OWN_STACKS_DIR)
    failed = {2: ProcessStack(123, (), "py-spy dump of pid 123 failed: Permission denied")}
    merged = with_fallback(failed, own)
    assert set(merged) == {0, 1, 2, 3} and merged[2] is own[2]
    assert with_fallback({0: own[0]}, {0: ProcessStack(None, (), "bad")})[0] is own[0]


def test_pg_config_is_repaired_from_torchs_group_tables(torch_artifacts: dict[str, Path]) -> None:
    art = torch_artifacts["subgroup_hang"]
    for rank in range(4):
        for trace in (safe_load(art / "dumps" / f"rank_{rank}.pkl"),
                      json.loads((art / "dumps" / f"rank_{rank}.json").read_text())):
            config = trace["pg_config"]
            assert "" not in config  # gloo's unnamed placeholder is gone
            assert config["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}
            if rank in (2, 3):
                assert config["1"] == {"name": "1", "desc": "pair_2_3", "ranks": "[2, 3]"}
            else:
                assert "1" not in config  # not a member of the pair group
            assert (trace["rank"], trace["world_size"]) == (rank, 4)
    # the reader turns the repaired config into the members of each group (carried on a group's
    # first row)
    table = read_dump_dir(art / "dumps").table.to_pylist()
    pair_rows = [r for r in table if r["pg_desc"] == "pair_2_3"]
    assert pair_rows and {tuple(r["pg_ranks"]) for r in pair_rows if r["pg_ranks"]} == {(2, 3)}
    assert {r["rank"] for r in pair_rows} == {2, 3}


def test_stack_traces_follow_the_setting(torch_artifacts: dict[str, Path]) -> None:
    with_frames = safe_load(torch_artifacts["hang"] / "dumps" / "rank_0.pkl")["entries"]
    without = safe_load(torch_artifacts["subgroup_hang"] / "dumps" / "rank_0.pkl")["entries"]
    assert all(e["frames"] for e in with_frames)
    assert any("train_scenario.py" in f["filename"] for e in with_frames for f in e["frames"])
    assert not any(e.get("frames") for e in without)


def test_sigkilled_rank_has_no_dump_and_survivors_dump_on_sigterm(
    torch_artifacts: dict[str, Path],
) -> None:
    art = torch_artifacts["crash_sigkill"]
    assert 1 not in _ranks(art / "dumps")
    assert _ranks(art / "dumps") == {0, 2, 3}
    for rank in (0, 2, 3):
        trace = safe_load(art / "dumps" / f"rank_{rank}.pkl")
        # the step-3 all_reduce the dead rank never joined is the survivors' last entry
        assert trace["entries"][-1]["collective_seq_id"] == 4


def test_exception_dumps_in_both_attempts(torch_artifacts: dict[str, Path]) -> None:
    art = torch_artifacts["crash_exception"]
    assert 2 in _ranks(art / "dumps") and 2 in _ranks(art / "dumps_attempt_1")
    for directory in ("dumps", "dumps_attempt_1"):
        trace = safe_load(art / directory / "rank_2.pkl")
        world = [e for e in trace["entries"] if e["process_group"][1] == "default_pg"]
        # raised in step 3's forward, before its all_reduce
        assert world[-1]["collective_seq_id"] == 3


def test_json_and_pickle_dumps_agree(torch_artifacts: dict[str, Path]) -> None:
    art = torch_artifacts["mismatch"]
    for rank in range(4):
        pickled = safe_load(art / "dumps" / f"rank_{rank}.pkl")
        as_json = json.loads((art / "dumps" / f"rank_{rank}.json").read_text())
        assert pickled["pg_config"] == as_json["pg_config"]
        assert [e["collective_seq_id"] for e in pickled["entries"]] == [
            e["collective_seq_id"] for e in as_json["entries"]]
        assert [e["input_sizes"] for e in pickled["entries"]] == [
            e["input_sizes"] for e in as_json["entries"]
        ]


# --------------------------------------------------------------------------------- the trigger's
# mechanics


def _start_probe(
    tmp_path: Path, rank: int = 3, *extra: str
) -> tuple[subprocess.Popen, Path, Path, Path]:
    dumps, exits, trigger = tmp_path / "dumps", tmp_path / "exit", tmp_path / "trigger"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, str(PROBE), str(dumps), str(exits), str(trigger), str(rank), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process, dumps, exits, trigger


def _wait_for(path: Path, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.02)
    return False


def test_sigusr1_and_trigger_file_dump_while_the_main_thread_is_blocked(tmp_path: Path) -> None:
    process, dumps, exits, trigger = _start_probe(tmp_path)
    try:
        os.kill(process.pid, signal.SIGUSR1)
        assert _wait_for(dumps / "rank_3.pkl") and _wait_for(dumps / "rank_3.json")
        first = (dumps / "rank_3.pkl").stat().st_mtime_ns
        trace = safe_load(dumps / "rank_3.pkl")
        assert trace["pg_config"] == {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}
        }
        assert (trace["rank"], trace["world_size"], trace["node"]) == (3, 4, "probe-node")
        assert json.loads((dumps / "rank_3.json").read_text())["pg_config"] == trace["pg_config"]
        assert not [p for p in dumps.iterdir() if p.name.startswith(".")]  # no temporary file left

        time.sleep(0.01)
        trigger.write_text("dump please\n")
        deadline = time.monotonic() + 20
        while (dumps / "rank_3.pkl").stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (dumps / "rank_3.pkl").stat().st_mtime_ns != first, (
            "touching the trigger file wrote a new dump"
        )
        assert process.poll() is None  # SIGUSR1 did not kill it

        # SIGTERM (torchrun shutting a survivor down): a dump into the exit directory, then death by
        # SIGTERM
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
        assert process.returncode == -signal.SIGTERM, err
        assert (exits / "rank_3.pkl").exists()
        assert "python handler ran" not in out  # it never got past the wait
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_step_timer_started_first_does_not_catch_the_signal(tmp_path: Path) -> None:
    """SIGUSR1's default action ends the process: a thread that does not block it (one started
    before install()) must not be the one it lands on. The timer's writer thread blocks it itself.
    """
    process, dumps, _exits, _trigger = _start_probe(tmp_path, 0, "timer-first")
    try:
        # the kernel may pick any thread; several signals make a wrong pick likely to show
        for _ in range(5):
            os.kill(process.pid, signal.SIGUSR1)
            time.sleep(0.05)
        assert _wait_for(dumps / "rank_0.pkl")
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


def _fake_api(include_stack_traces: bool, only_active: bool) -> tuple[bytes, str]:
    import pickle

    trace = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
    return pickle.dumps(trace, protocol=2), json.dumps(trace)


def test_dump_on_exception_writes_then_reraises(tmp_path: Path) -> None:
    trigger = FlightRecorderTrigger(
        tmp_path / "live",
        exit_dump_dir=tmp_path / "exit",
        rank=1,
        world_size=2,
        node="n",
        signum=None,
        dump_api=_fake_api,
        group_tables=dict,
    )
    with pytest.raises(KeyError), trigger.dump_on_exception():
        raise KeyError("boom")
    assert (tmp_path / "exit" / "rank_1.pkl").exists() and not (tmp_path / "live").exists()
    assert trigger.stats.reasons == ["exception KeyError"]
    with pytest.raises(SystemExit), trigger.dump_on_exception():
        sys.exit(0)  # a clean exit is not a failure
    assert trigger.stats.dumps == 1


def test_a_failing_dump_is_counted_never_raised(tmp_path: Path) -> None:
    def broken(include_stack_traces: bool, only_active: bool) -> tuple[bytes, str]:
        raise RuntimeError("flight recorder disabled")

    def hostile(include_stack_traces: bool, only_active: bool) -> tuple[bytes, str]:
        return b"cos\nsystem\n(S'touch pwned'\ntR.", "{}"

    for api in (broken, hostile):
        trigger = FlightRecorderTrigger(tmp_path / api.__name__, rank=0, signum=None, dump_api=api,
                                        group_tables=dict)
        assert trigger.dump("test") is None
        assert trigger.stats.failures == 1 and trigger.stats.dumps == 0
    assert "refused" in (trigger.stats.last_error or "")
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_repair_keeps_nccl_config_and_drops_glooos_placeholder() -> None:
    nccl = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    assert repair_pg_config(nccl, {}) == nccl
    gloo = {"": {"name": "", "desc": "", "ranks": "[]"}}
    tables = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
              "1": {"name": "1", "desc": "pair", "ranks": "[1]"}}
    assert repair_pg_config(gloo, tables) == tables


def test_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FAULTLENS_FR_DIR", raising=False)
    assert FlightRecorderTrigger.from_env() is None
    monkeypatch.setenv("FAULTLENS_FR_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("FAULTLENS_FR_TRIGGER", str(tmp_path / "t"))
    monkeypatch.setenv("FAULTLENS_FR_STACK_TRACES", "0")
    monkeypatch.setenv("FAULTLENS_FR_DUMP_ON_SIGTERM", "1")
    trigger = FlightRecorderTrigger.from_env()
    assert trigger is not None
    assert (trigger.dump_dir, trigger.trigger_file, trigger.exit_dump_dir) == (
        tmp_path / "d", tmp_path / "t", tmp_path / "d")
    assert trigger.include_stack_traces is False and trigger.dump_on_sigterm is True
