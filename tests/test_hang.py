"""Hang analysis: the real NCCL set (ground truth ranks 9 and 14), real gloo dumps from torchrun
jobs (with their repaired pg_config and as gloo writes it), and built multi-group jobs for root
cause vs follow-ons and every verdict."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from faultlens.attribution.detectors.hang import HangReport, HangVerdict, analyze_collectives
from faultlens.attribution.policy.config import load_policy
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.artifacts.safe_pickle import safe_load
from tests import fr_builders as fb
from tests.conftest import DATA_DIR, REPO_ROOT

NCCL_SET = DATA_DIR / "nccl-fr-gpu_error_2nd"
TP, DP, PP = "TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"
PROGRAM = [fb.Step(TP), fb.Step(DP, "nccl:all_gather"), fb.Step(TP, "nccl:broadcast"),
           fb.Step(PP, "nccl:all_reduce", ((8,),))]


def _analyze(directory: Path, expected: range | None = None) -> HangReport:
    return analyze_collectives(read_dump_dir(directory).table, expected_ranks=expected)


def _job(
    tmp_path: Path,
    faults: list[fb.Fault],
    *,
    tp: int = 2,
    dp: int = 2,
    pp: int = 2,
    steps: int = 6,
    program: list[fb.Step] | None = None,
) -> Path:
    job = fb.Job(fb.megatron_like(tp, dp, pp), program or PROGRAM, steps, faults)
    return fb.write_set(tmp_path / "dumps", job.run())


# -- the real NCCL set


def test_real_nccl_set_blames_ranks_9_and_14_only() -> None:
    report = _analyze(NCCL_SET)
    assert report.culprit_ranks == (9, 14)
    assert report.verdict == HangVerdict.NEVER_JOINED
    assert report.never_joined == (9, 14) and report.missing_dumps == ()
    assert report.pg_desc in ("EXPERT_MODEL_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP")
    assert report.confidence >= 0.9
    # the waiting ranks (stage 0 through p2p, peers in TP/EP/DP groups) show up only as follow-on
    # evidence
    assert any("rank(s) 8, 10, 11 entered it, rank(s) 9 never did" in e for e in report.evidence)
    assert any("rank(s) 12, 13, 15 entered it, rank(s) 14 never did" in e for e in report.evidence)


def test_real_nccl_set_torch_analyzer_lists_follow_ons(tmp_path: Path) -> None:
    """Side by side: torch's analyzer output on the same set names more ranks than the two culprits.
    """
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.flight_recorder.fr_trace",
            str(NCCL_SET),
            "-p",
            "_dump_",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0  # it exits 0 whatever it finds
    named = set()
    for found in re.findall(r"missing ranks: \{([0-9, ]+)\}", text):
        named.update(int(r) for r in found.split(","))
    assert {9, 14} <= named
    assert named - {9, 14}, (
        "torch lists follow-on ranks (e.g. pipeline peers of 9 and 14) as missing too"
    )
    assert _analyze(NCCL_SET).culprit_ranks == (9, 14)


# -- built multi-group jobs: root cause vs follow-ons


def test_stuck_rank_is_blamed_not_the_ranks_waiting_on_it_in_other_groups(tmp_path: Path) -> None:
    # rank 5 stops before its DP all_gather at step 3: its TP peer, DP peers and pipeline peer wait
    # on it, and the ranks waiting on *those* lag in their own TP/DP/PP groups
    report = _analyze(_job(tmp_path, [fb.Fault(5, 3, 1)]))
    assert report.culprit_ranks == (5,) and report.verdict == HangVerdict.NEVER_JOINED
    follow_ons = [e for e in report.evidence if e.startswith("follow-on:")]
    assert follow_ons, "the other groups' lags are reported, as follow-ons"
    assert all("rank(s) 5 never did" not in e for e in follow_ons)


def test_rank_that_skips_and_goes_on_is_blamed_through_the_cycle(tmp_path: Path) -> None:
    # rank 2 leaves out one pipeline all_reduce and goes on: its pipeline peer waits on it, while it
    # waits on its TP peer, who waits ... (a cycle broken by program-order precedent)
    report = _analyze(_job(tmp_path, [fb.Fault(2, 3, 3, kind="skip")]))
    assert report.culprit_ranks == (2,)
    assert report.pg_desc == PP and report.verdict == HangVerdict.NEVER_JOINED


def test_larger_job_with_many_groups(tmp_path: Path) -> None:
    report = _analyze(_job(tmp_path, [fb.Fault(13, 4, 2)], tp=4, dp=2, pp=2, steps=8))
    assert report.culprit_ranks == (13,)
    assert report.pg_desc == TP and report.collective_seq_id is not None


def test_two_independent_stuck_ranks_are_both_blamed(tmp_path: Path) -> None:
    report = _analyze(_job(tmp_path, [fb.Fault(1, 3, 0), fb.Fault(6, 3, 0)], tp=2, dp=2, pp=2))
    assert report.culprit_ranks == (1, 6)


def _two_group_set(*, follow_on_mismatch_after: bool) -> dict[int, dict]:
    """4 ranks; TP groups A=[0,1], B=[2,3]; DP group C=[0,2] and D=[1,3].
    Rank 1 never joins TP-A seq 3 (rank 0 waits in it). Later, in DP-D, rank 3 (whose error path
    runs an extra collective) issues a barrier where rank 1 ... the op mismatch in a second group is
    a follow-on."""
    groups = {
        "0": ("default_pg", (0, 1, 2, 3)),
        "10": (TP, (0, 1)),
        "11": (TP, (2, 3)),
        "20": (DP, (0, 2)),
        "21": (DP, (1, 3)),
    }
    config = fb.pg_config(groups)
    t0 = fb.T0
    second = 10**9  # ns
    hang_t = t0 + 5 * second
    mismatch_t = hang_t + (30 * second if follow_on_mismatch_after else -30 * second)

    def e(rid: int, seq: int, name: str, *, op: str = "nccl:all_reduce", t: int, done: bool = True,
          sizes=((1024,),)) -> dict:
        return fb.entry(
            record_id=rid,
            seq=seq,
            group=(name, groups[name][0]),
            pg_id=int(name),
            op=op,
            t=t,
            state="completed" if done else "scheduled",
            sizes=sizes,
        )

    dumps = {
        0: [e(0, 1, "10", t=t0), e(1, 2, "10", t=t0 + second), e(2, 3, "10", t=hang_t, done=False)],
        1: [e(0, 1, "10", t=t0), e(1, 2, "10", t=t0 + second),
            e(2, 1, "21", t=mismatch_t, op="nccl:all_reduce", done=False)],
        2: [e(0, 1, "11", t=t0), e(1, 2, "11", t=t0 + second), e(2, 3, "11", t=t0 + 2 * second)],
        3: [e(0, 1, "11", t=t0), e(1, 2, "11", t=t0 + second), e(2, 3, "11", t=t0 + 2 * second),
            e(3, 1, "21", t=mismatch_t + 1000, op="nccl:barrier", sizes=(), done=False)],
    }
    return {rank: fb.dump(entries, config, rank=rank) for rank, entries in dumps.items()}


def test_follow_on_mismatch_in_a_second_group_is_not_blamed(tmp_path: Path) -> None:
    directory = fb.write_set(tmp_path, _two_group_set(follow_on_mismatch_after=True))
    report = _analyze(directory)
    assert report.culprit_ranks == (1,)
    assert report.verdict == HangVerdict.NEVER_JOINED and report.pg_name == "10"
    assert any(e.startswith("follow-on:") and "op mismatch" in e for e in report.evidence)


def test_a_mismatch_before_the_hang_is_the_root_cause(tmp_path: Path) -> None:
    directory = fb.write_set(tmp_path, _two_group_set(follow_on_mismatch_after=False))
    report = _analyze(directory)
    assert report.verdict == HangVerdict.OP_MISMATCH and report.pg_name == "21"
    # a 1:1 tie, resolved by the wait-for graph (rank 1 is the one others wait on)
    assert report.culprit_ranks == (1,)


# -- each verdict on built NCCL sets


def _group_set(
    states: dict[int, list[tuple[int, str]]],
    *,
    op: dict[int, str] | None = None,
    sizes: dict[int, tuple] | None = None,
    dtype: dict[int, str] | None = None,
    out_sizes: dict[int, tuple] | None = None,
) -> dict[int, dict]:
    config = fb.pg_config({"0": ("default_pg", tuple(states))})
    out = {}
    for rank, seq_states in states.items():
        entries = []
        for i, (seq, state) in enumerate(seq_states):
            last = i == len(seq_states) - 1
            entries.append(fb.entry(
                record_id=i, seq=seq, state=state, t=fb.T0 + seq * 10**9 + rank,
                op=(op or {}).get(rank, "nccl:all_reduce") if last else "nccl:all_reduce",
                sizes=(sizes or {}).get(rank, ((1024,),)) if last else ((1024,),),
                dtype=(dtype or {}).get(rank, "Float") if last else "Float",
                out_sizes=(out_sizes or {}).get(rank) if last else None))
        out[rank] = fb.dump(entries, config, rank=rank)
    return out


def test_never_joined(tmp_path: Path) -> None:
    states = {r: [(1, "completed"), (2, "completed"), (3, "started")] for r in range(4)}
    states[2] = [(1, "completed"), (2, "completed")]
    report = _analyze(fb.write_set(tmp_path, _group_set(states)))
    assert (report.verdict, report.culprit_ranks, report.never_joined) == (
        HangVerdict.NEVER_JOINED,
        (2,),
        (2,),
    )
    assert report.collective_seq_id == 3 and report.op == "nccl:all_reduce"


def test_joined_and_stalled(tmp_path: Path) -> None:
    states = {r: [(1, "completed"), (2, "completed"), (3, "completed")] for r in range(4)}
    states[1] = [(1, "completed"), (2, "completed"), (3, "started")]
    report = _analyze(fb.write_set(tmp_path, _group_set(states)))
    assert (report.verdict, report.culprit_ranks, report.stalled) == (
        HangVerdict.STALLED,
        (1,),
        (1,),
    )
    assert report.collective_seq_id == 3


def test_not_started_while_the_others_started(tmp_path: Path) -> None:
    states = {r: [(1, "completed"), (2, "started")] for r in range(4)}
    states[3] = [(1, "completed"), (2, "scheduled")]
    report = _analyze(fb.write_set(tmp_path, _group_set(states)))
    assert report.culprit_ranks == (3,) and report.verdict == HangVerdict.STALLED


def test_whole_group_stuck_together_blames_nobody(tmp_path: Path) -> None:
    states = {r: [(1, "completed"), (2, "started")] for r in range(4)}
    report = _analyze(fb.write_set(tmp_path, _group_set(states)))
    assert report.verdict == HangVerdict.STALLED and report.culprit_ranks == ()
    assert report.stalled == (0, 1, 2, 3) and report.confidence < 0.5


STUCK = {r: [(1, "completed"), (2, "started")] for r in range(4)}
DONE = {r: [(1, "completed"), (2, "completed")] for r in range(4)}


@pytest.mark.parametrize(("odd", "mismatch"), [
    (3, {"sizes": {3: ((512,),)}}),
    (0, {"dtype": {0: "BFloat16"}}),
    # outputs compared like inputs: an all_reduce whose output another shape has
    (2, {"out_sizes": {2: ((32, 32),)}}),
    (1, {"out_sizes": {1: ((2048,),)}}),
])
def test_size_mismatch_the_group_is_stuck_in_points_at_the_odd_rank(tmp_path, odd, mismatch):
    report = _analyze(fb.write_set(tmp_path, _group_set(STUCK, **mismatch)))
    assert (report.verdict, report.culprit_ranks, report.collective_seq_id) == (
        HangVerdict.SIZE_MISMATCH,
        (odd,),
        2,
    )
    assert report.confidence >= load_policy().confidence_threshold


@pytest.mark.parametrize(("odd", "mismatch"), [
    (3, {"sizes": {3: ((512,),)}}),
    (0, {"dtype": {0: "BFloat16"}}),
    (2, {"out_sizes": {2: ((32, 32),)}}),
    (1, {"op": {1: "nccl:broadcast"}}),
])
def test_a_mismatch_every_member_completed_is_no_hang(tmp_path, odd, mismatch):
    """Every entry completed, but one rank's differs: a collective mismatch (a silent desync), never
    a failover on its own, and never "matching ops and sizes"."""
    report = _analyze(fb.write_set(tmp_path, _group_set(DONE, **mismatch)))
    assert (report.verdict, report.culprit_ranks, report.collective_seq_id) == (
        HangVerdict.COLLECTIVE_MISMATCH,
        (odd,),
        2,
    )
    assert report.confidence < load_policy().confidence_threshold
    assert report.roots[0].kind == HangVerdict.COLLECTIVE_MISMATCH
    assert "matching" not in report.reason and "no hang" in report.reason


def test_op_mismatch_points_at_the_odd_rank(tmp_path: Path) -> None:
    states = {r: [(1, "completed"), (2, "started")] for r in range(4)}
    report = _analyze(fb.write_set(tmp_path, _group_set(states, op={1: "nccl:broadcast"})))
    assert (report.verdict, report.culprit_ranks, report.op) == (
        HangVerdict.OP_MISMATCH,
        (1,),
        "nccl:all_reduce",
    )


def test_all_to_all_uneven_splits_are_not_a_mismatch(tmp_path: Path) -> None:
    states = {r: [(1, "completed")] for r in range(4)}
    sets = _group_set(states, op={r: "nccl:all_to_all" for r in range(4)},
                      sizes={r: ((2000 + r, 5120),) for r in range(4)})
    assert _analyze(fb.write_set(tmp_path, sets)).verdict == HangVerdict.NO_HANG


def test_missing_dump_is_the_culprit(tmp_path: Path) -> None:
    states = {r: [(1, "completed"), (2, "scheduled")] for r in range(4)}
    sets = _group_set(states)
    del sets[2]
    report = _analyze(fb.write_set(tmp_path, sets))
    assert (report.verdict, report.culprit_ranks, report.missing_dumps) == (
        HangVerdict.MISSING_DUMPS,
        (2,),
        (2,),
    )


def test_missing_highest_rank_needs_the_expected_world(tmp_path: Path) -> None:
    states = {r: [(1, "completed")] for r in range(4)}
    sets = _group_set(states)
    for top in sets.values():
        top["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
    del sets[3]
    directory = fb.write_set(tmp_path, sets)
    assert _analyze(directory).verdict == HangVerdict.NO_HANG
    report = _analyze(directory, expected=range(4))
    assert (report.verdict, report.culprit_ranks) == (HangVerdict.MISSING_DUMPS, (3,))
    # every rank that dumped completed everything: nothing waits on rank 3, whose dump may just be
    # lost or late
    assert report.confidence < load_policy().confidence_threshold and report.waited_missing == ()


def test_healthy_set_is_no_hang(tmp_path: Path) -> None:
    report = _analyze(_job(tmp_path, []))
    assert report.verdict == HangVerdict.NO_HANG and report.culprit_ranks == ()


# -- real gloo dumps from torchrun jobs


def _raw_copy(directory: Path, out: Path) -> Path:
    """The dumps as gloo writes them: pg_config keyed '' with ranks '[]', no rank/world_size/node
    keys.
    """
    out.mkdir(parents=True)
    for path in sorted(directory.glob("rank_*.pkl")):
        top = safe_load(path)
        top["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        for key in ("rank", "world_size", "node"):
            top.pop(key, None)
        (out / f"_dump_{path.stem.split('_')[-1]}").write_bytes(pickle.dumps(top, protocol=2))
    return out


@pytest.mark.parametrize("raw", [False, True], ids=["repaired", "raw"])
@pytest.mark.parametrize(
    "scenario", ["hang", "subgroup_hang", "mismatch", "crash_sigkill", "crash_exception"]
)
def test_real_gloo_dumps(
    torch_artifacts: dict[str, Path], tmp_path: Path, scenario: str, raw: bool
) -> None:
    meta = json.loads((torch_artifacts[scenario] / "meta.json").read_text())
    directory = torch_artifacts[scenario] / "dumps"
    if raw:
        directory = _raw_copy(directory, tmp_path / "raw")
    report = _analyze(directory)
    assert report.culprit_ranks == tuple(meta["culprit_ranks"]), report.reason
    expected = dict(meta.get("expected", {}))
    if scenario == "mismatch":
        # the harness' mismatch completes (gloo moves the bytes; the dumps are written at the end of
        # the run): a collective mismatch, no hang, below any failover (its cached meta.json keeps
        # the name of the mismatch it made)
        assert expected.get("verdict") == "SIZE_MISMATCH"
        expected["verdict"] = "COLLECTIVE_MISMATCH"
        assert report.confidence < load_policy().confidence_threshold
    if "verdict" in expected:
        assert report.verdict == HangVerdict[expected["verdict"]]
        assert report.pg_name == expected["pg_name"]
        assert report.collective_seq_id == expected["collective_seq_id"]
        assert report.op == expected["op"]
    if scenario == "subgroup_hang":
        assert report.pg_desc == ("pair_2_3" if not raw else "undefined") or report.pg_name == "1"
        assert any("follow-on" in e and "group '0'" in e for e in report.evidence)
    if scenario == "crash_sigkill":
        assert report.verdict == HangVerdict.MISSING_DUMPS and report.missing_dumps == (1,)
    if scenario == "crash_exception":
        assert report.never_joined == (2,)


@pytest.mark.parametrize("scenario", ["hang", "subgroup_hang"])
def test_real_gloo_dumps_taken_after_the_timeout(
    torch_artifacts: dict[str, Path], scenario: str
) -> None:
    directory = torch_artifacts[scenario] / "dumps_on_exit"
    if not any(directory.glob("rank_*")):
        pytest.skip(f"{scenario}: no dumps on exit in this artifact set")
    meta = json.loads((torch_artifacts[scenario] / "meta.json").read_text())
    report = _analyze(directory, expected=range(meta["world_size"]))
    assert report.culprit_ranks == tuple(meta["culprit_ranks"]), report.reason


def test_torch_analyzer_fails_on_raw_gloo_dumps(
    torch_artifacts: dict[str, Path], tmp_path: Path
) -> None:
    """The same raw dumps that faultlens reads: torch's own analyzer dies (KeyError on the gloo
    pg_config) or, with a rank missing, cannot decide."""
    outcomes = {}
    for scenario in ("hang", "subgroup_hang", "crash_sigkill"):
        raw = _raw_copy(torch_artifacts[scenario] / "dumps", tmp_path / scenario)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.flight_recorder.fr_trace",
                str(raw),
                "-p",
                "_dump_",
                "--allow-incomplete-ranks",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        outcomes[scenario] = (result.returncode, result.stdout + result.stderr)
    for scenario, (code, text) in outcomes.items():
        assert code != 0 or "cannot decide" in text.lower(), (scenario, text[-500:])
        assert "KeyError" in text or "cannot decide" in text.lower(), (scenario, text[-500:])


# -- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "faultlens.controller.cli.main", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_analyze_hang_text_and_json() -> None:
    text = _cli("analyze-hang", str(NCCL_SET))
    assert text.returncode == 0, text.stderr
    assert "culprit rank(s): 9, 14" in text.stdout and "why:" in text.stdout
    as_json = _cli("analyze-hang", str(NCCL_SET), "--json", "--expected-ranks", "16")
    document = json.loads(as_json.stdout)
    assert document["culprit_ranks"] == [9, 14] and document["verdict"] == "never_joined"
    assert document["dumps"]["ranks_read"] == 16 and document["missing_dumps"] == []


def test_cli_analyze_hang_bad_input(tmp_path: Path) -> None:
    missing = _cli("analyze-hang", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    (tmp_path / "rank_0.pkl").write_bytes(b"\x80\x02garbage")
    broken = _cli("analyze-hang", str(tmp_path))
    assert broken.returncode == 2 and "rank_0.pkl" in broken.stderr
    assert broken.stderr.strip().count("\n") == 0
