"""bench/compare_results.py: run_all's published results read back from docs/benchmarks.md, and a change in result
told apart from a figure that moved."""

from __future__ import annotations

import json
from pathlib import Path

from bench.compare_results import compare, load, report
from bench.run_all import BENCHMARKS

REPO = Path(__file__).resolve().parents[1]


def test_the_published_results_are_read_back_from_the_docs() -> None:
    published = load(REPO / "docs" / "benchmarks.md")
    assert {"sink", "query", "hang", "eval", "demo_vs_torchrun"} <= set(published)
    assert set(published) <= {b.key for b in BENCHMARKS}
    assert all(isinstance(result, dict) and result for result in published.values())


def test_a_flag_that_flips_is_a_change_and_a_time_is_a_ratio(tmp_path: Path) -> None:
    before = {"eval": {"measured": {"software_failovers": 0, "culprit_node_f1": 1.0, "ok": True},
                       "machine": {"cpu": "a"}, "_seconds": 10.0}}
    after = {"eval": {"measured": {"software_failovers": 1, "culprit_node_f1": 0.5, "ok": True},
                      "machine": {"cpu": "b"}, "_seconds": 20.0}}
    changes, figures = compare(before["eval"], after["eval"])
    assert changes == ["| measured.software_failovers | 0 | 1 |"]
    assert figures == ["| measured.culprit_node_f1 | 1 | 0.5 | 0.50 |"]
    (tmp_path / "a.json").write_text(json.dumps(before))
    (tmp_path / "b.json").write_text(json.dumps(after))
    text = report(load(tmp_path / "a.json"), load(tmp_path / "b.json"))
    assert "Changes in result:" in text and "machine" not in text and "_seconds" not in text
