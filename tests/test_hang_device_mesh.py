"""Real gloo dump sets of 8-rank jobs whose groups come from torch's DeviceMesh (init_device_mesh: groups named by
new_group's counter, descs mesh_pp / mesh_dp / mesh_tp), in 3-D, 2-D and 1-D meshes, with a pipeline send/recv on
'pp' that gloo never records (tests/data/device-mesh-hangs/README.md; regenerate with
`python -m tests.torch_jobs.device_mesh.generate DIR`). Each set in two forms:

- stacks: dumped by faultlens' FlightRecorderTrigger (pg_config repaired, each rank's own stack beside): the
  culprit set is exact, with the confidence to act on;
- raw: torch's own dump, trace only. A rank blocked in a pipeline send/recv then looks like a rank stuck in its own
  code, and several sets cannot be told apart (which of two silent pipeline peers stopped first): the analysis may
  name more ranks, but never a wrong set with the confidence to fail over on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from faultlens.collectors.sources.pystack import load_dump_dir_stacks
from faultlens.controller.hang_dump_dir import analyze_dump_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT / "tests" / "data" / "device-mesh-hangs"
THRESHOLD = float(yaml.safe_load((REPO_ROOT / "rules" / "policy.yaml").read_text())["confidence_threshold"])


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
        assert report.confidence < THRESHOLD, (report.culprit_ranks, report.confidence, report.reason)


def test_silent_pipeline_peers_are_uncertain_without_stacks() -> None:
    # rank 2 stops before a data-parallel reduce_scatter; ranks 4 and 6 (pipeline stage 1) then wait in a recv
    # gloo does not record: by the trace alone all three stopped outside any collective
    _, report = analyze_dump_dir(DATA / "raw" / "B_rs" / "dumps", stacks={})
    assert 2 in report.culprit_ranks and report.confidence < THRESHOLD
    assert any("gloo records no send/recv" in line for line in report.evidence)
    # one silent rank alone is what the others wait on: named with the confidence to act
    _, single = analyze_dump_dir(DATA / "raw" / "A_tp" / "dumps", stacks={})
    assert single.culprit_ranks == (5,) and single.confidence >= THRESHOLD


def test_a_rank_that_recorded_nothing_beside_lone_waits_is_named_low() -> None:
    # rank 0 never joins the first collective; raw gloo dumps name no group members, so ranks 1, 2 and 3 each wait
    # alone (as far as the dumps say) in a group rank 0 is in: rank 0, which recorded nothing, is named, below
    # any failover (an empty flight recorder would look the same)
    _, report = analyze_dump_dir(DATA / "raw" / "E_first" / "dumps", stacks={})
    assert report.culprit_ranks == (0,) and report.confidence < THRESHOLD
    assert report.verdict.value == "never_joined"
    assert "recorded no collective at all" in report.reason
