"""Independent roots on NCCL-like Megatron dump sets (built: 8-32 ranks, TP x DP x PP groups): every
independent culprit is named whatever another group did, a stalled rank is a culprit in its own
right, a skip before any periodic history is ordered by the other ranks' own entry order, and a
cycle nothing orders stays below the policy's threshold."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from faultlens.attribution.detectors.hang import HangReport, HangVerdict, analyze_collectives
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from tests import fr_builders as fb
from tests.conftest import REPO_ROOT

TP, DP, PP = "TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"
PROGRAM = [fb.Step(TP), fb.Step(DP, "nccl:all_gather"), fb.Step(TP, "nccl:broadcast"),
           fb.Step(PP, "nccl:all_reduce", ((8,),))]


def _analyze(directory: Path) -> HangReport:
    return analyze_collectives(read_dump_dir(directory).table)


def _stall(dumps: dict[int, dict], rank: int, desc: str, seq: int) -> None:
    """`rank` joined its `desc` group's collective `seq` and never completed it (nor anything it
    enqueued after: a hung GPU stream), while its peers completed it: what a GPU error looks like in
    NCCL dumps."""
    entries = dumps[rank]["entries"]
    start = next(
        i
        for i, e in enumerate(entries)
        if e["process_group"][1] == desc and e["collective_seq_id"] == seq
    )
    for e in entries[start:]:
        e.update(state="started", retired=False, time_discovered_completed_ns=None)


@pytest.mark.parametrize(("shape", "stop", "stall"), [
    ((4, 2, 2), (9, 3, 0), (14, 2)),   # 16 ranks: the stall two steps before the other stops
    ((4, 2, 2), (9, 3, 2), (14, 3)),   # near in time
    ((2, 4, 2), (3, 4, 0), (12, 1)),   # the stall long before
    ((4, 4, 2), (21, 3, 1), (6, 2)),   # 32 ranks
])
def test_a_stalled_rank_is_a_culprit_whatever_another_group_did(
    tmp_path: Path, shape: tuple, stop: tuple, stall: tuple
) -> None:
    tp, dp, pp = shape
    groups = fb.megatron_like(tp, dp, pp)
    dumps = fb.Job(groups, PROGRAM, 6, [fb.Fault(*stop)]).run()
    stalled_rank, seq = stall
    _stall(dumps, stalled_rank, TP, seq)
    report = _analyze(fb.write_set(tmp_path, dumps))
    assert report.culprit_ranks == tuple(sorted({stop[0], stalled_rank})), report.reason
    kinds = {r: k for root in report.roots for r, k in root.kinds}
    assert kinds[stalled_rank] == HangVerdict.STALLED.value
    assert kinds[stop[0]] in (HangVerdict.NEVER_JOINED.value, HangVerdict.STUCK_OUTSIDE.value)
    assert len(report.roots) == 2
    assert report.stalled == (stalled_rank,)


@pytest.mark.parametrize(("shape", "faults"), [
    ((2, 2, 2), [(1, 3, 0), (6, 3, 0)]),
    ((4, 2, 2), [(9, 2, 0), (14, 2, 2)]),
    ((2, 4, 2), [(0, 1, 1), (13, 4, 0)]),
    ((4, 2, 2), [(2, 2, 0), (7, 2, 0), (12, 3, 1)]),
])
def test_every_independent_stuck_rank_is_named(tmp_path: Path, shape: tuple, faults: list) -> None:
    report = _analyze(fb.write_set(tmp_path, fb.Job(fb.megatron_like(*shape), PROGRAM, 6,
                                                    [fb.Fault(*f) for f in faults]).run()))
    named = {f[0] for f in faults}
    # a later fault can be unreachable (its rank blocked first, waiting on an earlier culprit): then
    # it is a follow-on, never a culprit; every reachable one is named
    assert set(report.culprit_ranks) <= named and report.culprit_ranks
    assert not set(report.culprit_ranks) & set(report.follow_ons)
    for root in report.roots:
        assert root.waiting_ranks and root.pg_name is not None and root.evidence


@pytest.mark.parametrize(
    ("shape", "rank", "index"),
    [((2, 2, 2), 2, 0), ((2, 2, 2), 5, 1), ((4, 2, 2), 9, 3), ((2, 4, 2), 6, 0)],
)
def test_a_skip_at_the_first_step_is_ordered_without_history(
    tmp_path: Path, shape: tuple, rank: int, index: int
) -> None:
    dumps = fb.Job(
        fb.megatron_like(*shape), PROGRAM, 4, [fb.Fault(rank, 0, index, kind="skip")]
    ).run()
    report = _analyze(fb.write_set(tmp_path, dumps))
    assert report.culprit_ranks == (rank,), report.reason
    assert not report.unresolved_cycle and report.follow_ons


def test_a_cycle_nothing_orders_is_whole_and_below_the_threshold(tmp_path: Path) -> None:
    # ranks 1 and 2 share a pair group no other group plays the part of; at the first step rank 2
    # runs the world collective first, rank 1 the pair's: each waits on the other and no rank or
    # history orders them
    groups = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("PAIR", (1, 2))}
    config = fb.pg_config(groups)

    def e(rid: int, seq: int, name: str) -> dict:
        return fb.entry(
            record_id=rid,
            seq=seq,
            group=(name, groups[name][0]),
            pg_id=int(name),
            state="scheduled",
            retired=False,
        )

    dumps = {0: [e(0, 1, "0")], 1: [e(0, 1, "1")], 2: [e(0, 1, "0")], 3: [e(0, 1, "0")]}
    report = _analyze(
        fb.write_set(tmp_path, {r: fb.dump(x, config, rank=r) for r, x in dumps.items()})
    )
    threshold = yaml.safe_load((REPO_ROOT / "rules" / "policy.yaml").read_text())[
        "confidence_threshold"
    ]
    assert report.culprit_ranks == (1, 2) and report.unresolved_cycle
    assert report.confidence < threshold


def test_report_dict_carries_every_root(tmp_path: Path) -> None:
    dumps = fb.Job(
        fb.megatron_like(2, 2, 2), PROGRAM, 6, [fb.Fault(1, 3, 0), fb.Fault(6, 3, 0)]
    ).run()
    document = _analyze(fb.write_set(tmp_path, dumps)).to_dict()
    assert sorted(r for root in document["roots"] for r in root["ranks"]) == [1, 6]
    assert all(root["kind"] and root["waiting_ranks"] for root in document["roots"])
    assert set(document["follow_ons"]) == {0, 2, 3, 4, 5, 7}


@pytest.mark.parametrize("rank", [0, 3, 5, 7])
def test_a_gloo_rank_whose_last_entry_is_not_yet_retired_is_no_stall(
    tmp_path: Path, rank: int
) -> None:
    """gloo entries are always 'scheduled'; `retired` depends on when each rank dumped: a dump taken
    at the end of a run just before its last collective was retired is no evidence of a stall (real
    case: torch_artifacts 'mismatch', whose rank 3 dumped before its final barrier was retired)."""
    dumps = fb.Job(fb.megatron_like(2, 2, 2), PROGRAM, 3, [], comm="gloo").run()
    dumps[rank]["entries"][-1]["retired"] = False
    report = _analyze(fb.write_set(tmp_path, dumps))
    assert report.culprit_ranks == () and report.verdict != HangVerdict.STALLED


def _without_descs(dumps: dict[int, dict]) -> dict[int, dict]:
    """The same set as a job whose groups were made without group_desc (new_group / new_subgroups):
    every group but the default one is 'undefined'."""
    for top in dumps.values():
        for e in top["entries"]:
            name, desc = e["process_group"]
            e["process_group"] = (name, desc if desc == "default_pg" else "undefined")
        for config in top["pg_config"].values():
            if config["desc"] != "default_pg":
                config["desc"] = "undefined"
    return dumps


@pytest.mark.parametrize(
    ("shape", "rank", "index"),
    [((2, 2, 2), 2, 0), ((2, 2, 2), 5, 1), ((4, 2, 2), 9, 3), ((2, 4, 2), 6, 0)],
)
def test_a_skip_at_the_first_step_is_ordered_without_descs(tmp_path: Path, shape: tuple, rank: int,
                                                           index: int) -> None:
    """Groups without a desc play the part of the groups created beside them (one size, disjoint):
    the other TP groups still order a TP skip."""
    dumps = _without_descs(
        fb.Job(fb.megatron_like(*shape), PROGRAM, 4, [fb.Fault(rank, 0, index, kind="skip")]).run()
    )
    report = _analyze(fb.write_set(tmp_path, dumps))
    assert report.culprit_ranks == (rank,), report.reason
    assert not report.unresolved_cycle
    # leaving out the step's first TP all_reduce pairs its TP broadcast with the peers' all_reduce:
    # the trace shows an op mismatch first (with descs the same); any other skip is a skip, a cycle
    # or not (9, 3: the PP all_reduce that ends the step, which the rank's next step's one pairs
    # with until it has finished)
    want = HangVerdict.OP_MISMATCH if index == 0 else HangVerdict.SKIPPED
    assert dict(report.roots[0].kinds)[rank] == want.value, report.reason


@pytest.mark.parametrize("descs", [True, False])
@pytest.mark.parametrize(("rank", "seq"), [(5, 2), (2, 1), (7, 4)])
def test_a_one_against_one_mismatch_is_decided_by_the_groups_playing_its_part(
    tmp_path: Path, rank: int, seq: int, descs: bool
) -> None:
    """A size mismatch in a DP group of two (one rank against one) names the rank whose sizes the
    other DP groups' same collective does not have, never its peer. The job ran on (every member
    completed it): a collective mismatch, below the failover threshold."""
    dumps = fb.Job(fb.megatron_like(2, 2, 2), PROGRAM, 6).run()
    dumps = dumps if descs else _without_descs(dumps)
    changed = next(e for e in dumps[rank]["entries"]
                   if e["process_group"][0] in fb.groups_named(fb.megatron_like(2, 2, 2), DP)
                   and e["collective_seq_id"] == seq)
    changed["input_sizes"] = [[2, 2048]]
    report = _analyze(fb.write_set(tmp_path, dumps))
    assert report.culprit_ranks == (rank,), report.reason
    assert dict(report.roots[0].kinds)[rank] == HangVerdict.COLLECTIVE_MISMATCH.value
    assert report.verdict == HangVerdict.COLLECTIVE_MISMATCH and report.confidence < 0.6
