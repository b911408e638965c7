"""docs/benchmarks.md in the one form bench/common.py renders (every section, hand-kept or
written by run_all and bench_campaign), and bench/compare_results.py: the published figures read
back, and a change in result told apart from a figure that moved."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_campaign import SECTION as CAMPAIGN
from bench.bench_campaign import campaign_figures
from bench.common import (
    DOC_HEADER,
    Figure,
    Section,
    parse_document,
    parse_section,
    render_document,
    render_section,
    write_section,
)
from bench.compare_results import compare, compare_figures, figure_value, load, report
from bench.run_all import BENCHMARKS, section

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


# --- the published form: docs/benchmarks.md has exactly the shape bench/common.py renders ---------

#: a raw result of bench/bench_timer.py, small
TIMER = {"faultlens_us_per_section": 1.2, "naive_contextmanager_pandas_us_per_section": 2.4,
         "speedup_vs_naive": 2.0, "target_us_per_section": 5.0,
         "writer_thread_us_per_step_row": 7.0}


def test_the_published_file_is_in_the_renderers_shape() -> None:
    """Every section of docs/benchmarks.md, read back and rendered again, is the file as it is: the
    hand-kept sections have the shape the writers (run_all, bench_campaign) produce."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    header, sections = parse_document(text)
    assert header == DOC_HEADER
    assert render_document(DOC_HEADER, sections) == text
    titles = [s.title for s in sections]
    assert len(titles) == len(set(titles))
    assert {b.title for b in BENCHMARKS} | {CAMPAIGN} <= set(titles)


def test_a_small_result_renders_to_one_table() -> None:
    section = Section("Tiny bench", "Compares: one | two.", ("python -m bench.tiny --n 3",),
                      (Figure("time a step", "1.5 s", "<= 2 s", "torch 3.0 s", "2.0x", "abc1234",
                              "2026-12-04 10:00"), Figure("same answers", "yes")),
                      ("A quiet machine.",))
    text = render_section(section)
    assert text.splitlines() == [
        "## Tiny bench", "", "Compares: one | two.", "", "    python -m bench.tiny --n 3", "",
        "| figure | value | target | anchor (same run) | ratio | commit | date |",
        "|---|---|---|---|---|---|---|",
        "| time a step | 1.5 s | <= 2 s | torch 3.0 s | 2.0x | abc1234 | 2026-12-04 10:00 |",
        "| same answers | yes | - | - | - | - | - |", "", "- A quiet machine."]
    assert parse_section(text) == section
    piped = Section("Piped", "x", ("c",), (Figure("a | b", "1 s"),))
    assert parse_section(render_section(piped)) == piped


def test_run_all_publishes_a_raw_result_in_place(tmp_path: Path) -> None:
    """run_all's section of a raw result: the benchmark's figures stamped with the run's commit
    and date; write_section replaces the section of that title and keeps the others."""
    timer = next(b for b in BENCHMARKS if b.key == "timer")
    raw = {**TIMER, "_commit": "abc1234", "_date": "2026-12-04 10:00"}
    published = section(timer, raw, quick=False)
    assert published.figures[0] == Figure(
        "time per section on the training thread", "1.2 µs", "<= 5.0 µs",
        "contextmanager + list of dicts + pandas 2.4 µs", "2.0x", "abc1234", "2026-12-04 10:00")
    docs = tmp_path / "benchmarks.md"
    other = Section("Other", "kept", ("c",), (Figure("f", "1"),))
    write_section(docs, other)
    write_section(docs, published)
    write_section(docs, section(timer, {**raw, "faultlens_us_per_section": 1.5}, quick=False))
    sections = parse_document(docs.read_text())[1]
    assert [s.title for s in sections] == ["Other", timer.title]
    assert sections[1].figures[0].value == "1.5 µs"


def test_a_published_figure_moves_by_ratio_and_a_count_is_a_result(tmp_path: Path) -> None:
    """compare_results on a published file: each figure's value cell, a number with a unit or a
    fraction a measured figure, anything else a result; a raw result goes through its figures."""
    assert figure_value("2.47 s (3.79 s CPU), culprit right") == 2.47
    assert figure_value("2,316,815 rows/s") == 2316815.0
    assert figure_value("0.92") == 0.92
    assert [figure_value(cell) for cell in ("0", "72/72, 0, 0", "2 of 2", "yes")] == [None] * 4
    timer = next(b for b in BENCHMARKS if b.key == "timer")
    raw = dict(TIMER)
    docs = tmp_path / "benchmarks.md"
    write_section(docs, section(timer, raw, quick=False))
    after = {**raw, "faultlens_us_per_section": 2.4, "speedup_vs_naive": 1.0}
    text = report(load(docs), {"timer": after})
    assert "| time per section on the training thread | 1.2 µs | 2.4 µs | 2.00 |" in text
    assert "No change in result" in text
    changes, figures = compare_figures({"culprit right": "yes", "exact": "72/72"},
                                       {"culprit right": "no", "exact": "72/72"})
    assert changes == ["| culprit right | yes | no |"] and figures == []


def test_the_campaign_publishes_the_aggregates_rows() -> None:
    """bench_campaign's table has the rows of the campaign report's aggregates, in their order."""
    from faultlens.controller.lab.report import aggregates

    summary = {"scenarios": 2, "passed": 1, "class_accuracy": 0.5, "culprit_node_exact": 1.0,
               "cause_family_right": 1.0, "action_right": 0.5, "healthy_nodes_excluded": 0,
               "software_failed_over_more_than_once": 0, "incidents_on_healthy_runs": 0,
               "healthy_runs": 1, "healthy_runs_with_cpu_hog": 0, "restores_right": "1/1",
               "finished_as_expected": "2/2",
               "median_latency": {"crash": {"n": 1, "fault_to_incident_s": 0.9,
                                            "fault_to_decision_s": 1.2}}}
    rows = [line.strip("|").split(" | ") for line in aggregates(summary).splitlines()[2:]]
    figures = campaign_figures(summary, "abc1234", "2026-12-04 10:00")
    assert [(f.figure, f.value) for f in figures] == [(k.strip(), v.strip()) for k, v in rows]
    assert figures[-1].target == "<= 2 s"


def _score(name: str, problems: tuple[str, ...] = (), wall_s: float = 90.0,
           timed_out: bool = False):  # type: ignore[no-untyped-def]
    from faultlens.controller.lab.score import Check, ScenarioScore

    check = Check("crash/software -> restart", "crash/software -> restart", True, None, None, True,
                  True, 1.3, 2.5)
    return ScenarioScore(name, "Python exception one rank", False, False, "crash", (check,), (),
                         True, (), (), 0, False, None, (), None, True, True, 0, timed_out, wall_s,
                         problems)


def test_the_campaign_notes_name_the_load_the_wrong_rows_and_every_run_of_a_rerun_row(
    tmp_path: Path,
) -> None:
    """bench_campaign's notes: the load each run recorded, each wrong row with its first problem,
    and a row run again (--rerun keeps the earlier run as NAME.run<k>) with every run's outcome."""
    from bench.bench_campaign import earlier_runs, record_load, run_line, run_notes, set_aside

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "artifacts.json").write_text("{}")
        record_load(tmp_path / name)
    (tmp_path / "a" / "load.json").write_text('{"load_1m": 31.0}')
    record_load(tmp_path / "a")  # recorded once: a later scoring does not overwrite it
    assert json.loads((tmp_path / "a" / "load.json").read_text()) == {"load_1m": 31.0}
    assert set_aside(tmp_path, "a") == tmp_path / "a.run1" and not (tmp_path / "a").exists()
    assert set_aside(tmp_path, "a") is None  # nothing finished to keep
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "artifacts.json").write_text("{}")
    assert set_aside(tmp_path, "a") == tmp_path / "a.run2"
    (tmp_path / "a.run10").mkdir()  # unfinished: not a run
    (tmp_path / "ab.run1").mkdir()  # another scenario's
    assert earlier_runs(tmp_path, "a") == [tmp_path / "a.run1", tmp_path / "a.run2"]

    first = _score("a", ("incident 2: class (want crash, got -)", "incident 2: cause"), 220.0,
                   timed_out=True)
    line = run_line(first, 31.0)
    assert line == ("wrong (incident 2: class (want crash, got -) and 1 more; timed out after "
                    "220 s), 220 s, fault -> incident / decision 1.3 / 2.5 s, load 31")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "load.json").write_text('{"load_1m": 6.0}')
    (tmp_path / "b" / "load.json").write_text('{"load_1m": 12.0}')
    notes = run_notes([_score("a"), _score("b", ("action (want restart, got escalate)",))],
                      tmp_path, {"a": [line], "b": []})
    assert notes[0] == ("1-minute load average at the end of each scenario (2 of 2 recorded): "
                        "6-12, median 12.")
    assert notes[1] == "Wrong in this run: b (action (want restart, got escalate))."
    assert notes[2] == (f"Run 2 times: a: run 1 {line}; run 2 right, 90 s, fault -> incident / "
                        "decision 1.3 / 2.5 s, load 6 (the table counts the last).")
    assert len(notes) == 3
