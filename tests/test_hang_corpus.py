"""The hang corpus (tests/torch_jobs/hang_corpus): real dump sets of an 8-rank gloo job (TP 2 x DP 2
x PP 2 groups from new_group, pipeline send/recv), 23 scenarios with known truth, generated once per
session and cached.

Every scenario: the exact culprit set, no victim named, the culprits' kinds kept distinct, the frame
a stuck rank is in; a cycle nothing can order is reported whole below the policy's confidence
threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from faultlens.attribution.detectors.hang import HangReport, HangVerdict, analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import load_stack_dir, py_spy_path
from tests.conftest import REPO_ROOT

pytest.importorskip("torch")

from tests.torch_jobs.hang_corpus import scenarios as sc

NAMES = [s.name for s in sc.SCENARIOS]
#: scenarios whose waits the trace alone shows (no rank blocked in an unrecorded gloo send/recv)
P2P_BLOCKED = {"stuck_tp", "pipeline_send_hang", "pipeline_bwd_hang"}
# the corpora's size mismatches are all ones gloo completes (it moves the bytes) and every member
# goes past: a collective mismatch (no hang); their op mismatches hold the group
KIND_OF_TRUTH = {"stuck_outside": HangVerdict.STUCK_OUTSIDE, "skipped": HangVerdict.SKIPPED,
                 "size_mismatch": HangVerdict.COLLECTIVE_MISMATCH,
                 "op_mismatch": HangVerdict.OP_MISMATCH,
                 "missing_dump": HangVerdict.MISSING_DUMPS, "crashed": HangVerdict.NEVER_JOINED,
                 "cycle": HangVerdict.CYCLE}


@pytest.fixture(scope="session")
def hang_corpus() -> dict[str, Path]:
    from tests.torch_jobs.hang_corpus.generate import corpus

    return corpus()


def _truth(directory: Path) -> dict:
    return json.loads((directory / "truth.json").read_text())


def _analyze(directory: Path, *, stacks: bool = True) -> HangReport:
    table = read_dump_dir(directory / "dumps").table
    return analyze_collectives(table, expected_ranks=range(sc.WORLD_SIZE),
                               stacks=load_stack_dir(directory / "stacks") if stacks else {})


def _threshold() -> float:
    return float(
        yaml.safe_load((REPO_ROOT / "rules" / "policy.yaml").read_text())["confidence_threshold"]
    )


def test_corpus_is_big_enough_and_has_truth(hang_corpus: dict[str, Path]) -> None:
    assert len(hang_corpus) >= 20
    for name, directory in hang_corpus.items():
        truth = _truth(directory)
        assert truth["scenario"] == name and truth["world_size"] == 8
        dumps = sorted(p.name for p in (directory / "dumps").glob("rank_*.pkl"))
        want = 7 if name == "sigkill" else 8
        assert len(dumps) == want, (name, dumps)


@pytest.mark.parametrize("name", NAMES)
def test_exact_culprits_no_victims(hang_corpus: dict[str, Path], name: str) -> None:
    if py_spy_path() is None and name in P2P_BLOCKED:
        pytest.skip("py-spy not installed: gloo does not record send/recv, only the stacks show "
                    "those waits")
    truth = _truth(hang_corpus[name])
    report = _analyze(hang_corpus[name])
    assert report.culprit_ranks == tuple(truth["culprits"]), (report.reason, report.evidence[:6])
    named = {r for root in report.roots for r in root.ranks}
    assert named == set(truth["culprits"])
    assert not set(report.follow_ons) & set(truth["culprits"])
    if truth["culprits"] and name not in ("size_mismatch", "op_mismatch"):
        # everyone else is a follow-on: waits on a culprit, directly or through others
        assert set(report.follow_ons) | set(truth["culprits"]) == set(range(8))
    elif not truth["culprits"]:
        assert report.verdict == HangVerdict.NO_HANG


@pytest.mark.parametrize("name", [n for n in NAMES if n not in P2P_BLOCKED])
def test_exact_culprits_from_the_trace_alone(hang_corpus: dict[str, Path], name: str) -> None:
    """Without stacks, every scenario whose waits the flight recorder shows still gets its exact
    culprits.
    """
    truth = _truth(hang_corpus[name])
    report = _analyze(hang_corpus[name], stacks=False)
    assert report.culprit_ranks == tuple(truth["culprits"]), report.reason


@pytest.mark.parametrize("name", sorted(P2P_BLOCKED))
def test_unrecorded_send_recv_waits_come_from_the_stacks(
    hang_corpus: dict[str, Path], name: str
) -> None:
    """gloo records no send/recv: from the trace alone a rank blocked in recv looks as if it never
    joined; its Python stack shows the recv and the peer, and turns it into a follow-on of the real
    culprit."""
    if py_spy_path() is None:
        pytest.skip("py-spy not installed")
    truth = _truth(hang_corpus[name])
    alone = _analyze(hang_corpus[name], stacks=False)
    assert set(truth["culprits"]) <= set(alone.culprit_ranks) and alone.culprit_ranks != tuple(
        truth["culprits"]
    )
    report = _analyze(hang_corpus[name])
    assert report.culprit_ranks == tuple(truth["culprits"])
    assert any("blocked in recv with rank" in e for e in report.evidence)


@pytest.mark.parametrize("name", NAMES)
def test_culprit_kinds_are_distinct(hang_corpus: dict[str, Path], name: str) -> None:
    truth = _truth(hang_corpus[name])
    if not truth["culprits"] or (py_spy_path() is None and name in P2P_BLOCKED):
        pytest.skip("no culprit" if not truth["culprits"] else "py-spy not installed")
    report = _analyze(hang_corpus[name])
    kinds = {r: k for root in report.roots for r, k in root.kinds}
    for rank, kind in truth["kinds"].items():
        want = {KIND_OF_TRUTH[kind].value}
        if kind == "crashed" and py_spy_path() is None:
            # without a stack, a crashed rank looks stuck outside
            want.add(HangVerdict.STUCK_OUTSIDE.value)
        assert kinds[int(rank)] in want, (name, rank, kinds)


@pytest.mark.parametrize(
    "name",
    ["stuck_tp", "stuck_world", "pipeline_send_hang", "hang_plus_crash", "two_independent_apart"],
)
def test_stuck_rank_evidence_names_its_frame(hang_corpus: dict[str, Path], name: str) -> None:
    if py_spy_path() is None:
        pytest.skip("py-spy not installed")
    truth = _truth(hang_corpus[name])
    report = _analyze(hang_corpus[name])
    for rank, kind in truth["kinds"].items():
        if kind != "stuck_outside":
            continue
        frame = "save_checkpoint" if name == "stuck_world" else "DataLoader.__next__"
        assert any(e.startswith(f"rank {rank} is in {frame} (") for e in report.evidence), (
            report.evidence[:5]
        )
        root = next(root for root in report.roots if int(rank) in root.ranks)
        assert any(frame in w for w in root.where)


def test_every_independent_root_has_its_own_group_and_waiters(hang_corpus: dict[str, Path]) -> None:
    report = _analyze(hang_corpus["two_independent_apart"])
    assert [root.ranks for root in sorted(report.roots, key=lambda r: r.ranks)] == [(2,), (7,)]
    by_rank = {root.ranks[0]: root for root in report.roots}
    assert set(by_rank[2].waiting_ranks) == {0, 1, 3} and set(by_rank[7].waiting_ranks) == {4, 5, 6}
    # dozens of collectives apart
    assert by_rank[2].collective_seq_id != by_rank[7].collective_seq_id
    mixed = _analyze(hang_corpus["mismatch_then_hang"])
    assert {root.kind for root in mixed.roots} == {
        HangVerdict.COLLECTIVE_MISMATCH,
        HangVerdict.STUCK_OUTSIDE,
    }
    # the hang's own confidence, not the completed mismatch's
    assert mixed.roots[0].kind == HangVerdict.STUCK_OUTSIDE
    assert mixed.confidence >= _threshold()


def test_a_cycle_nothing_orders_is_reported_whole_below_the_policy_threshold(
    hang_corpus: dict[str, Path],
) -> None:
    report = _analyze(hang_corpus["unorderable_cycle"])
    assert report.unresolved_cycle and report.culprit_ranks == (2, 5)
    assert report.confidence < _threshold()
    assert [root.kind for root in report.roots] == [HangVerdict.CYCLE]


@pytest.mark.parametrize("name", ["skip_early_subgroup", "skip_early_dp", "invert_order"])
def test_a_skip_before_any_history_is_ordered_by_the_others_entry_order(
    hang_corpus: dict[str, Path], name: str
) -> None:
    report = _analyze(hang_corpus[name], stacks=False)
    assert not report.unresolved_cycle and report.confidence >= _threshold()
    assert any("outside the cycle" in e and "skipped" in e for e in report.evidence)


def test_hostile_and_truncated_dumps_are_named_and_the_rest_analysed(hang_corpus: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    source = hang_corpus["two_independent_apart"]
    dumps = tmp_path / "dumps"
    shutil.copytree(source / "dumps", dumps)
    # where the ranks were: rank 2 in its data loader waits on nobody
    if (source / "stacks").is_dir():
        shutil.copytree(source / "stacks", tmp_path / "stacks")
    (dumps / "rank_0.pkl").write_bytes(b"\x80\x02cos\nsystem\n(S'touch /tmp/pwned'\ntR.")  # hostile
    full = (dumps / "rank_4.pkl").read_bytes()
    (dumps / "rank_4.pkl").write_bytes(full[: len(full) // 2])  # truncated
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "analyze-hang",
            str(dumps),
            "--json",
            "--expected-ranks",
            "8",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warnings) == 2
    assert any("rank_0.pkl" in w for w in warnings) and any("rank_4.pkl" in w for w in warnings)
    document = json.loads(result.stdout)
    assert document["dumps"]["ranks_read"] == 6
    assert set(document["missing_dumps"]) == {0, 4}
    if py_spy_path() is not None:
        # both real roots still found from the other six dumps; the unreadable ones are not blamed
        # for them
        assert set(document["culprit_ranks"]) == {2, 7}
    else:
        assert 7 in document["culprit_ranks"]
