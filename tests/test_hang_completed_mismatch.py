"""A mismatch every member completed (real gloo jobs, tests/data/completed-mismatch: an uneven
broadcast, an all_reduce of another dtype, in the world and in a pair group, 4 and 8 ranks, raw
and repaired dumps): a collective mismatch, no hang, the ranks that differ and the collective named,
below the policy's failover threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faultlens.attribution.detectors.hang import HangVerdict, analyze_collectives
from faultlens.attribution.policy.config import load_policy
from faultlens.collectors.artifacts.flight_recorder import read_dump_dir
from tests.conftest import DATA_DIR

SETS = sorted((DATA_DIR / "completed-mismatch").glob("*/*/truth.json"))


@pytest.mark.parametrize(
    "truth_file", SETS, ids=lambda p: f"{p.parent.parent.name}-{p.parent.name}"
)
def test_completed_mismatch_is_no_hang(truth_file: Path) -> None:
    truth = json.loads(truth_file.read_text())
    table = read_dump_dir(truth_file.parent / "dumps").table
    report = analyze_collectives(table, expected_ranks=range(truth["world_size"]))
    assert report.verdict == HangVerdict.COLLECTIVE_MISMATCH, report.reason
    assert list(report.culprit_ranks) == truth["odd_ranks"]
    assert report.confidence < load_policy().confidence_threshold
    assert report.op == f"gloo:{truth['op']}"
    if truth["group"] == "world":
        assert report.pg_name == "0"
    else:
        assert report.pg_desc in (truth["group"], "undefined") or report.pg_name != "0"
    assert report.never_joined == () and report.stalled == () and report.follow_ons == ()
    assert "no hang" in report.reason and "matching" not in report.reason
    (root,) = report.roots
    assert root.kind == HangVerdict.COLLECTIVE_MISMATCH and root.waiting_ranks == ()


def test_every_set_is_there() -> None:
    assert len(SETS) == 8
