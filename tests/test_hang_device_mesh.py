"""Real gloo dump sets of 8-rank jobs whose groups come from torch's DeviceMesh (init_device_mesh:
groups named by new_group's counter, descs mesh_pp / mesh_dp / mesh_tp), in 3-D, 2-D and 1-D meshes,
with a pipeline send/recv on 'pp' that gloo never records (tests/data/device-mesh-hangs/README.md;
regenerate with `python -m tests.torch_jobs.device_mesh.generate DIR`). Each set in two forms:

- stacks: dumped by faultlens' FlightRecorderTrigger (pg_config repaired, each rank's own stack
  beside): the culprit set is exact, with the confidence to act on;
- raw: torch's own dump, trace only. A rank blocked in a pipeline send/recv then looks like a rank
  stuck in its own code, and several sets cannot be told apart (which of two silent pipeline peers
  stopped first): the analysis may name more ranks, but never a wrong set with the confidence to
  fail over on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from faultlens.collectors.sources.pystack import load_dump_dir_stacks
from faultlens.controller.hang_dump_dir import analyze_dump_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "tests" / "data" / "device-mesh-hangs"
THRESHOLD = float(
    yaml.safe_load((REPO_ROOT / "rules" / "policy.yaml").read_text())["confidence_threshold"]
)


def _sets(form: str) -> list[str]:
    return sorted(p.name for p in (DATA / form).iterdir() if p.is_dir())


def _truth(directory: Path) -> list[int]:
    return sorted(json.loads((directory / "truth.json").read_text())["culprits"])


def test_every_scenario_is_there_in_both_forms() -> None:
    assert _sets("stacks") == _sets("raw") and len(_sets("raw")) == 12


@pytest.mark.parametrize("name", _sets("stacks"))
def test_with_the_ranks_own_stacks_every_culprit_set_is_exact(name: str) -> None:
    directory = DATA / "stacks" / name
    stacks = load_dump_dir_stacks(directory / "dumps")
    assert len(stacks) == 8
    dumps, report = analyze_dump_dir(directory / "dumps", stacks=stacks)
    assert not dumps.errors and len(dumps.ranks) == 8
    assert sorted(report.culprit_ranks) == _truth(directory), (report.reason, report.evidence[:6])
    assert report.confidence >= THRESHOLD


@pytest.mark.parametrize("name", _sets("raw"))
def test_trace_only_never_names_a_wrong_set_with_the_confidence_to_act(name: str) -> None:
    directory = DATA / "raw" / name
    _, report = analyze_dump_dir(directory / "dumps", stacks={})
    if sorted(report.culprit_ranks) != _truth(directory):
        assert report.confidence < THRESHOLD, (
            report.culprit_ranks,
            report.confidence,
            report.reason,
        )


def test_silent_pipeline_peers_are_uncertain_without_stacks() -> None:
    # rank 2 stops before a data-parallel reduce_scatter; ranks 4 and 6 (pipeline stage 1) then wait
    # in a recv gloo does not record: by the trace alone all three stopped outside any collective
    _, report = analyze_dump_dir(DATA / "raw" / "B_rs" / "dumps", stacks={})
    assert 2 in report.culprit_ranks and report.confidence < THRESHOLD
    assert any("gloo records no send/recv" in line for line in report.evidence)
    # one silent rank alone is what the others wait on: named with the confidence to act
    _, single = analyze_dump_dir(DATA / "raw" / "A_tp" / "dumps", stacks={})
    assert single.culprit_ranks == (5,) and single.confidence >= THRESHOLD


def test_a_rank_that_never_entered_its_groups_is_placed_in_them_by_the_partition() -> None:
    # rank 0 never joins the first collective: raw gloo dumps name no group members, and rank 0
    # recorded none, so the entries show ranks 1, 2 and 3 each alone in its group. The mesh_dp
    # groups split the ranks in pairs; only rank 2's is short and only rank 0 is in none: it is rank
    # 2's partner, whom rank 2 waits on
    dumps, report = analyze_dump_dir(DATA / "raw" / "E_first" / "dumps", stacks={})
    assert report.culprit_ranks == (0,) and report.confidence >= THRESHOLD
    dp = [
        ranks
        for name, ranks in _configured(dumps.table).items()
        if 2 in ranks and name[1] == "mesh_dp"
    ]
    assert dp == [(0, 2)]
    # the mesh_tp groups are short twice (ranks 1 and 3 alone) with two ranks outside them (0 and
    # 2): left as seen
    tp = sorted(ranks for name, ranks in _configured(dumps.table).items() if name[1] == "mesh_tp")
    assert (1,) in tp and (3,) in tp


def _configured(table) -> dict[tuple[str, str], tuple[int, ...]]:
    """(pg_name, pg_desc) -> the pg_ranks the reader gave the group."""
    out = {}
    for row in table.select(["pg_name", "pg_desc", "pg_ranks"]).to_pylist():
        if row["pg_ranks"] is not None:
            out[(row["pg_name"], row["pg_desc"])] = tuple(row["pg_ranks"])
    return out


@pytest.mark.parametrize(
    ("form", "name", "skipper", "victim"),
    [
        ("raw", "F_skip", 3, 2),
        ("raw", "M_skip_early", 6, 7),
        ("stacks", "F_skip", 3, 2),
        ("stacks", "M_skip_early", 6, 7),
    ],
)
def test_a_skipper_is_named_when_its_cycle_also_waits_on_silent_ranks(
    form: str, name: str, skipper: int, victim: int
) -> None:
    # trace only: the skipper's tensor-parallel partner waits on it, it waits in the world
    # all_reduce on ranks blocked in pipeline send/recvs gloo does not record (silent): the cycle
    # has a way out, and the skip is still what the others' entry order shows
    _, report = analyze_dump_dir(DATA / form / name / "dumps", stacks={})
    kinds = {r: k for root in report.roots for r, k in root.kinds}
    assert kinds.get(skipper) == "skipped" and victim not in report.culprit_ranks
    assert report.confidence < THRESHOLD  # the silent ranks beside it stay uncertain
