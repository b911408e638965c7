"""Group membership from gloo's raw dumps (pg_config keyed '' with no ranks): what the entries
still tell. A group's members are the ranks that recorded it; where the groups of one part (one
desc, or a creation run of desc-less groups named by torch's counter) split the job, the ranks no
group of the part holds complete the short ones: one short group takes them all, several are
completed by the offset pattern every whole group of the part shares (a mesh dim's groups are
translates of one another). Real sets: tests/data/skip-before-history/raw (made by
tests/torch_jobs/skip_history/generate.py), checked against the job's own groups (truth.json)."""

from __future__ import annotations

import json

import pytest

from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from faultlens.collectors.artifacts.flight_recorder.groups import complete_partitions
from tests.conftest import DATA_DIR

RAW = DATA_DIR / "skip-before-history" / "raw"
#: sets where every group's members are known from the raw dumps alone
EXACT = {"pair_4", "pair_8", "chain2_4", "chain2_8", "chain3_8"}


def rebuilt(name: str) -> dict[str, tuple[int, ...]]:
    table = read_dump_dir(RAW / name / "dumps").table
    names = table.column("pg_name").to_pylist()
    ranks = table.column("pg_ranks").to_pylist()
    return {n: tuple(r) for n, r in zip(names, ranks, strict=True) if r is not None}


def true_groups(name: str) -> set[tuple[int, ...]]:
    truth = json.loads((RAW / name / "truth.json").read_text())
    groups = {tuple(sorted(g)) for table in truth["groups"].values() for g in table}
    return groups | {tuple(range(truth["world_size"]))}


@pytest.mark.parametrize("name", sorted(p.name for p in RAW.iterdir()))
def test_no_group_is_given_a_rank_it_does_not_hold(name: str) -> None:
    truth = true_groups(name)
    for group, ranks in rebuilt(name).items():
        assert any(set(ranks) <= set(g) for g in truth), (group, ranks)
        if name in EXACT:
            assert ranks in truth, (group, ranks)


def test_a_skipped_pair_is_completed_from_its_creation_run() -> None:
    """pair_8: pairs '1'..'4' from new_group without a desc; rank 6 skipped the first all_reduce of
    '4', so only rank 7 recorded it: the run's other pairs hold every rank but 6."""
    assert rebuilt("pair_8")["4"] == (6, 7)


def test_two_short_groups_of_one_desc_are_completed_by_the_mesh_pattern() -> None:
    """chain3_8: PP groups '9' and '11' each recorded by one rank (ranks 4 and 6 never reached
    them); the whole ones, [1, 5] and [3, 7], place rank 4 with 0 and rank 6 with 2."""
    groups = rebuilt("chain3_8")
    assert (groups["9"], groups["11"]) == ((0, 4), (2, 6))


@pytest.mark.parametrize("members, outside", [
    # the whole groups disagree on the pattern: nothing is guessed
    ({"1": {0, 4}, "2": {1, 6}, "3": {2}, "4": {3}}, {5, 7}),
    # a short group two placements fit: nothing is guessed
    ({"1": {0, 2}, "2": {3}, "3": {4, 6}, "4": {7}}, {1, 5}),
    # the part does not split the job (sizes cannot add up)
    ({"1": {0, 1}, "2": {2}, "3": {4}}, {3, 5, 6}),
])
def test_what_the_pattern_cannot_place_is_left_as_the_entries_say(
        members: dict[str, set[int]], outside: set[int]) -> None:
    covered = set().union(*members.values())
    descs = dict.fromkeys(members, "PIPELINE_MODEL_PARALLEL_GROUP")
    assert complete_partitions(members, descs, covered | outside) == {}


def _chain3_4(drop: int | None = None) -> tuple[object, set[int]]:
    import pyarrow.compute as pc

    from faultlens.attribution.detectors.hang import analyze_collectives
    from tests.test_hang_skip_history import timed_out

    table = read_dump_dir(RAW / "chain3_4" / "dumps").table
    if drop is not None:
        table = table.filter(pc.not_equal(table.column("rank"), drop))
    exits = timed_out("chain3_4") - {drop}
    return analyze_collectives(table, expected_ranks=range(4), timed_out=exits), exits


def test_groups_only_their_waiter_recorded_are_tried_with_every_member_the_ids_allow() -> None:
    """chain3_4: groups [2, 3], [1, 2], [0, 1] (no desc) each recorded only by the rank that waits
    in it. Rank 0's local id of '3' is 1 (it belongs to no earlier group), rank 1's of '2' too: so
    '1' can only be [2, 3], '2' [1, 2] or [1, 3], '3' [0, 1], [0, 2] or [0, 3]. All six
    memberships name rank 3, which skipped '1': the answer does not depend on the unknown part."""
    report, _ = _chain3_4()
    assert report.culprit_ranks == (3,), report.reason
    assert set(report.follow_ons) == {0, 1, 2}
    assert any("'1' ([2] + one of [3]), '2' ([1] + one of [2, 3]), '3' ([0] + one of [1, 2, 3])"
               in line and "all 6 memberships give this answer" in line
               for line in report.evidence), report.evidence


@pytest.mark.parametrize("drop", [0, 1, 2])
def test_where_the_memberships_do_not_agree_nothing_is_named_at_failover(drop: int) -> None:
    """The same dumps with one waiter's dump lost: a membership with the lost rank in it cannot be
    ordered, so the memberships give no one answer and the report stays as it was, below the
    failover threshold."""
    from faultlens.attribution.policy.config import load_policy

    report, _ = _chain3_4(drop)
    assert report.confidence < load_policy().confidence_threshold, report.reason
    assert not any("memberships give this answer" in line for line in report.evidence)
