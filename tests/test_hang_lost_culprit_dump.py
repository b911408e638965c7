"""A culprit whose own flight-recorder dump is lost (its node's disk full, a stuck process that
never wrote it, a dump collected late): the ranks that dumped still show who never arrived, and a
lost dump makes the evidence weaker, never stronger. So no healthy rank is ever named at a
confidence the policy fails over on, and where the peers' entries point at the rank without a
dump, it is named (at MISSING_DUMP_CONFIDENCE at most, by its absence alone).

The family, from real dumps:

- every set of the hang corpus and the held-out set (gloo, 8-16 ranks) with each culprit's dump
  removed, its stack kept (taken, the dump lost), gone too, or no stacks at all (the sets whose
  waits are gloo send/recv, which only stacks show, are left out there, as in their own tests);
- the corpus' stuck sets with the culprit's dump removed and each blocked waiter's dump lagging its
  own entry into the collective it waits in (the campaign's sigstop case): a waiter whose stack is
  blocked in its peers' op, and the survivor of the culprit's TP/DP pair, were named at 0.80-0.85;
- the real sets: the NCCL set (tests/data/nccl-fr-gpu_error_2nd) without each culprit's dump, and
  the campaign's DDP sets (tests/data/ddp-stopped-rank, the stopped rank wrote no dump) without one
  more healthy rank's.

Single-culprit sets name their culprit in every case but the trace-alone runs left out above; a
second, independent culprit whose dump is lost beside a culprit that dumped is noted, not named (a
lost dump beside a root is far more often a follow-on's: missing_roots.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest

from faultlens.attribution.detectors.hang import analyze_collectives
from faultlens.attribution.detectors.hang.report import MISSING_DUMP_CONFIDENCE
from faultlens.attribution.incident import IncidentClass
from faultlens.attribution.policy.config import load_policy
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.sources.pystack import StackPlace, load_stack_dir, where

pytest.importorskip("torch")

from tests.test_hang_corpus import P2P_BLOCKED as CORPUS_P2P_BLOCKED
from tests.test_hang_heldout import P2P_BLOCKED as HELDOUT_P2P_BLOCKED
from tests.torch_jobs.lost_dumps import without

DATA = Path(__file__).parent / "data"
STUCK_SETS = ["stuck_world", "stuck_dp", "stuck_tp", "broadcast_stuck", "two_in_one_group"]
MODES = ("culprit-stack-kept", "culprit-stack-gone", "none")


def _threshold() -> float:
    return load_policy().threshold_for(IncidentClass.COLLECTIVE_HANG)


@pytest.fixture(scope="module")
def sets() -> dict[str, Path]:
    from tests.torch_jobs.hang_corpus.generate import corpus
    from tests.torch_jobs.hang_heldout.generate import heldout

    found = {f"corpus/{name}": path for name, path in corpus().items()}
    found.update({f"heldout/{name}": path for name, path in heldout().items()})
    return found


@pytest.fixture(scope="module")
def culprit_lost(
    sets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[str, str, int, set[int], object]]:
    """(set, stack mode, the culprit whose dump is lost, the culprits, the report) for every
    culprit of every set (the set read without the culprit's file, as the reader would see it)."""
    workdir = tmp_path_factory.mktemp("culprit-lost")
    needs_stacks = CORPUS_P2P_BLOCKED | HELDOUT_P2P_BLOCKED
    out = []
    for name, directory in sorted(sets.items()):
        truth = json.loads((directory / "truth.json").read_text())
        culprits = {int(r) for r in truth["culprits"]}
        if not culprits:
            continue
        stacks = load_stack_dir(directory / "stacks")
        for lost in sorted(culprits):
            kept = read_dump_dir(
                without(directory / "dumps", workdir / name / str(lost), lost)
            ).table
            for mode in MODES:
                if mode == "none" and name.split("/")[-1] in needs_stacks:
                    continue
                own = {
                    r: s
                    for r, s in stacks.items()
                    if mode == "culprit-stack-kept" or (mode != "none" and r != lost)
                }
                report = analyze_collectives(
                    kept, expected_ranks=range(truth["world_size"]), stacks=own
                )
                out.append((name, mode, lost, culprits, report))
    return out


def test_a_lost_culprit_dump_never_fails_a_healthy_rank_over(culprit_lost: list) -> None:
    threshold = _threshold()
    wrong = [
        f"{name} [{mode}] without rank {lost}'s dump: named {list(r.culprit_ranks)} at "
        f"{r.confidence}, culprits {sorted(culprits)}: {r.reason[:200]}"
        for name, mode, lost, culprits, r in culprit_lost
        if r.confidence >= threshold and set(r.culprit_ranks) - culprits
    ]
    assert len(culprit_lost) >= 150
    assert not wrong, "\n".join(wrong)


def test_the_rank_without_a_dump_is_named_where_its_peers_point_at_it(culprit_lost: list) -> None:
    """A single culprit is named in every case, its own dump lost; named by its absence alone (no
    stack of its own), it stands at MISSING_DUMP_CONFIDENCE at most, above the failover
    threshold."""
    single = [case for case in culprit_lost if len(case[3]) == 1]
    assert len(single) >= 100
    missed = [
        f"{name} [{mode}]: named {list(r.culprit_ranks)}, lost {lost}: {r.reason[:200]}"
        for name, mode, lost, _, r in single
        if lost not in r.culprit_ranks
    ]
    assert not missed, "\n".join(missed)
    for name, mode, lost, _, r in single:
        root = next(root for root in r.roots if lost in root.ranks)
        if mode != "culprit-stack-kept" and lost not in r.never_joined:
            assert root.confidence <= MISSING_DUMP_CONFIDENCE, (name, mode, root.reason)


@pytest.mark.parametrize("name", STUCK_SETS)
def test_a_lagging_waiter_beside_a_lost_culprit_dump_is_no_culprit(
    sets: dict[str, Path], name: str, tmp_path: Path
) -> None:
    """The culprit's dump lost, and a waiter's dump written just before it entered the collective
    its stack is blocked in (its last entry left out): each such waiter in turn, with every stack
    but the culprit's and with them all. (Where the waiter's only peer in the group it lags in
    is the culprit, nothing that dumped tells them apart: the waiter may be named, below the
    threshold.)"""
    directory = sets[f"corpus/{name}"]
    truth = json.loads((directory / "truth.json").read_text())
    culprits = set(truth["culprits"])
    stacks = load_stack_dir(directory / "stacks")
    waiters = [
        r
        for r, s in sorted(stacks.items())
        if r not in culprits and where(s).kind == StackPlace.IN_COLLECTIVE
    ]
    assert waiters
    threshold, wrong, checked = _threshold(), [], 0
    for lost in sorted(culprits):
        base = read_dump_dir(without(directory / "dumps", tmp_path / str(lost), lost)).table
        for waiter in waiters:
            mine = pc.equal(base.column("rank"), waiter)
            last = pc.max(pc.filter(base.column("record_id"), mine)).as_py()
            lagging = base.filter(
                pc.fill_null(
                    pc.invert(pc.and_(mine, pc.equal(base.column("record_id"), last))), True
                )
            )
            for own in (stacks, {r: s for r, s in stacks.items() if r != lost}):
                report = analyze_collectives(
                    lagging, expected_ranks=range(truth["world_size"]), stacks=own
                )
                checked += 1
                healthy = set(report.culprit_ranks) - culprits
                if report.confidence >= threshold and healthy:
                    wrong.append(
                        f"lost {lost}, lagging {waiter}: named "
                        f"{list(report.culprit_ranks)} at {report.confidence}: "
                        f"{report.reason[:200]}"
                    )
    assert checked >= 2 * len(waiters)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("lost", [9, 14])
def test_the_real_nccl_set_without_a_culprits_dump(lost: int, tmp_path: Path) -> None:
    """The real NCCL set (culprits 9 and 14) without one culprit's dump: no healthy rank at a
    failover confidence; the culprit that dumped stays named."""
    source = DATA / "nccl-fr-gpu_error_2nd"
    for path in source.glob("_dump_*"):
        if path.name != f"_dump_{lost}":
            shutil.copyfile(path, tmp_path / path.name)
    report = analyze_collectives(read_dump_dir(tmp_path).table, expected_ranks=range(16))
    other = ({9, 14} - {lost}).pop()
    assert other in report.culprit_ranks, report.reason
    named = set(report.culprit_ranks) - {9, 14}
    assert not named or report.confidence < _threshold(), report.reason


@pytest.mark.parametrize("name", ["sigstop-one-rank", "stuck-gil", "sigstop-lagging-dump"])
@pytest.mark.parametrize("also_lost", [0, 1, 3])
def test_the_real_ddp_sets_with_one_more_dump_lost(
    name: str, also_lost: int, tmp_path: Path
) -> None:
    """The campaign's DDP sets: the stopped rank 2 wrote no dump; one more healthy rank's is lost
    too. Nothing tells which of the two the others wait on: neither is failed over, and the
    healthy ranks that dumped are never named."""
    from faultlens.collectors.sources.pystack import load_dump_dir_stacks

    dumps = DATA / "ddp-stopped-rank" / name / "dumps"
    stacks = {r: s for r, s in load_dump_dir_stacks(dumps).items() if r != also_lost}
    kept = tmp_path / "dumps"
    shutil.copytree(
        dumps,
        kept,
        ignore=lambda _d, names: [
            n for n in names if n.startswith(f"rank_{also_lost}.") or n == f"rank_{also_lost}"
        ],
    )
    table = read_dump_dir(kept).table
    report = analyze_collectives(table, expected_ranks=range(4), stacks=stacks)
    assert not set(report.culprit_ranks) - {2, also_lost}, report.reason
    if also_lost in report.culprit_ranks:
        assert report.confidence < _threshold(), report.reason
