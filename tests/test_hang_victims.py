"""Victims are never culprits by absence: the healthy ranks of a hang time out ("Timed out waiting"
in their own errors) and exit without a dump while the stuck rank dumped. From real dumps: the hang
corpus' stuck-rank sets (8-rank gloo jobs) with only the stuck ranks' dumps and stacks kept, and
the real torchrun 'hang' job (4 ranks) with rank 2's dump and the other ranks' own error files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from faultlens.attribution.detectors.hang import HangVerdict, analyze_collectives
from faultlens.attribution.policy.config import load_policy
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import load_dump_dir_stacks, load_stack_dir
from tests.conftest import REPO_ROOT

pytest.importorskip("torch")

THRESHOLD = load_policy().confidence_threshold
STUCK_SETS = ["stuck_world", "stuck_dp", "stuck_tp", "broadcast_stuck", "two_in_one_group"]


@pytest.fixture(scope="module")
def hang_corpus() -> dict[str, Path]:
    from tests.torch_jobs.hang_corpus.generate import corpus

    return corpus()


def _only_the_stuck(directory: Path, out: Path) -> tuple[Path, dict, list[int], list[int]]:
    truth = json.loads((directory / "truth.json").read_text())
    stuck = sorted(truth["culprits"])
    (out / "dumps").mkdir(parents=True)
    for rank in stuck:
        shutil.copy(directory / "dumps" / f"rank_{rank}.pkl", out / "dumps")
    stacks = {r: s for r, s in load_stack_dir(directory / "stacks").items() if int(r) in stuck}
    others = [r for r in range(truth["world_size"]) if r not in stuck]
    return out / "dumps", stacks, stuck, others


@pytest.mark.parametrize("name", STUCK_SETS)
def test_the_stuck_rank_is_named_not_the_ranks_that_timed_out(hang_corpus, tmp_path, name):
    dumps, stacks, stuck, others = _only_the_stuck(hang_corpus[name], tmp_path)
    table = read_dump_dir(dumps).table
    report = analyze_collectives(table, expected_ranks=range(8), stacks=stacks, timed_out=others)
    assert list(report.culprit_ranks) == stuck, report.reason
    assert not set(report.culprit_ranks) & set(others)
    assert list(report.follow_ons) == others and list(report.missing_dumps) == others
    assert report.roots[0].kind == HangVerdict.STUCK_OUTSIDE
    assert report.confidence >= THRESHOLD
    # the trace alone: the same ranks, below the failover threshold (a rank silent by the trace may
    # be in a gloo send/recv the recorder does not show)
    alone = analyze_collectives(table, expected_ranks=range(8), timed_out=others)
    assert list(alone.culprit_ranks) == stuck and alone.confidence < THRESHOLD


@pytest.mark.parametrize("name", STUCK_SETS[:2])
def test_a_missing_rank_that_did_not_say_it_waited_stays_unexplained(hang_corpus, tmp_path, name):
    """One rank without a dump gave no timeout of its own (killed, or its dump lost): nothing says
    who waited on whom, the old low-confidence answer stands."""
    dumps, stacks, _stuck, others = _only_the_stuck(hang_corpus[name], tmp_path)
    table = read_dump_dir(dumps).table
    report = analyze_collectives(
        table, expected_ranks=range(8), stacks=stacks, timed_out=others[1:]
    )
    assert report.verdict == HangVerdict.MISSING_DUMPS and report.confidence < THRESHOLD


def test_real_torchrun_hang_with_the_healthy_ranks_gone(torch_artifacts, tmp_path):
    """The real 4-rank job: rank 2 stuck outside any collective; ranks 1 and 3 time out ("Timed out
    waiting" in their torchrun error files), rank 0's error echoes their exit ("Connection closed
    by peer", a secondary pattern of rules/crash.yaml); only rank 2's dump and stack are kept."""
    run = torch_artifacts["hang"]
    secondary = yaml.safe_load((REPO_ROOT / "rules" / "crash.yaml").read_text())[
        "secondary_patterns"
    ]
    waiting = re.compile("|".join(["Timed out waiting", *secondary]))
    timed_out = sorted(
        int(path.parent.name)
        for path in run.glob("logdir/*/attempt_0/*/error.json")
        if waiting.search(path.read_text())
    )
    assert timed_out == [0, 1, 3]
    (tmp_path / "dumps").mkdir()
    shutil.copy(run / "dumps" / "rank_2.pkl", tmp_path / "dumps")
    stacks = {r: s for r, s in load_dump_dir_stacks(run / "dumps").items() if int(r) == 2}
    report = analyze_collectives(
        read_dump_dir(tmp_path / "dumps").table,
        expected_ranks=range(4),
        stacks=stacks,
        timed_out=timed_out,
    )
    assert report.culprit_ranks == (2,) and report.follow_ons == (0, 1, 3), report.reason
    assert report.confidence >= THRESHOLD
    without = analyze_collectives(
        read_dump_dir(tmp_path / "dumps").table, expected_ranks=range(4), stacks=stacks
    )
    assert without.verdict == HangVerdict.MISSING_DUMPS and without.confidence < THRESHOLD
