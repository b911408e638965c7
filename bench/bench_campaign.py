"""The fault-injection campaign as a benchmark: every scenario of rules/campaign.yaml (real DDP and
pipeline jobs under `faultlens run`, faults injected from outside the script), scored, and written
into docs/benchmarks.md as its own section ("## Fault-injection campaign": the aggregates as one
table of figures, in bench/common.py's form), labelled with the commit it ran on; the tables per
fault type and per scenario go to <out>/report.md.

    PYTHONPATH=. python bench/bench_campaign.py [--only NAME ...] [--ci] [--out DIR] [--deadline S]
    [--no-docs]

One scenario runs at a time (each is 2 nodes x 2 ranks, or 2 x 1 for the CI subset: 4-6 Python
processes with torch, ~1.5 GB together). Latencies are wall clock from the injection (the injected
process or the campaign logs time.time() just before it acts) to the incident's detected_ts and the
decision's issued_ts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import NONE, Figure, Section, emit, machine, write_section  # noqa: E402

SECTION = "Fault-injection campaign"
#: the acceptance each aggregate answers to (the campaign's issue); latencies from the injection
TARGETS = {"class right": "1.0", "culprit node exact": ">= 0.97", "healthy nodes excluded": "0",
           "software bugs failed over more than once": "0", "incidents on healthy runs": "0",
           "restores right": "all", "finished / stopped as expected": "all",
           "crash": "<= 2 s", "node_loss": "<= 5 s",
           "hang": "<= 15 s after progress stops (the 10 s floor is in the figure)"}


def commit() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        branch = subprocess.run(
            ["git", "rev-parse", "--abbrev-ref", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        return f"{rev} (branch {branch}{', uncommitted changes' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def campaign_figures(summary: dict[str, Any], commit: str, date: str) -> tuple[Figure, ...]:
    """The campaign's aggregates (controller/lab/report.py `aggregates`, the same rows) as published
    figures, each with the acceptance it answers to."""
    healthy = (f"{summary['incidents_on_healthy_runs']} on {summary['healthy_runs']} runs "
               f"({summary['healthy_runs_with_cpu_hog']} with a CPU hog)")
    rows = [("scenarios (all checks right)", f"{summary['scenarios']} ({summary['passed']})",
             f"{summary['scenarios']}"),
            ("class right", summary["class_accuracy"], None),
            ("culprit node exact", summary["culprit_node_exact"], None),
            ("cause family right", summary["cause_family_right"], None),
            ("action right", summary["action_right"], None),
            ("healthy nodes excluded", summary["healthy_nodes_excluded"], None),
            ("software bugs failed over more than once",
             summary["software_failed_over_more_than_once"], None),
            ("incidents on healthy runs", healthy, None),
            ("restores right", summary["restores_right"], None),
            ("finished / stopped as expected", summary["finished_as_expected"], None)]
    for cls in ("crash", "node_loss", "hang", "slowdown", "data"):
        item = (summary.get("median_latency") or {}).get(cls) or {}
        if item.get("n"):
            rows.append((f"median fault -> incident / decision, {cls} (n={item['n']})",
                         f"{item['fault_to_incident_s']} s / {item['fault_to_decision_s']} s",
                         TARGETS.get(cls)))
    if summary.get("not_run"):
        rows.append(("not run (campaign deadline)", ", ".join(summary["not_run"]), None))
    return tuple(Figure(label, str(value), target or TARGETS.get(label, NONE), commit=commit,
                        date=date) for label, value, target in rows)


def main() -> int:
    from faultlens.controller.lab.campaign import interleave, run_campaign
    from faultlens.controller.lab.report import markdown
    from faultlens.controller.lab.scenarios import DEFAULT_SCENARIOS, load_campaign

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS))
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--ci", action="store_true")
    parser.add_argument("--out", default="/tmp/faultlens-campaign")
    parser.add_argument("--deadline", type=float, help="start no scenario after this many seconds")
    parser.add_argument("--resume", action="store_true", help="score scenarios already run under "
                                                              "--out, run the rest")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument(
        "--section",
        default=SECTION,
        help="the docs/benchmarks.md section the result goes to (a family run with --only has its "
        "own: the whole campaign's stays as it was)",
    )
    args = parser.parse_args()
    campaign = load_campaign(args.scenarios)
    scenarios = interleave(campaign.select(args.only, ci=args.ci))
    rev, started = commit(), dt.datetime.now(dt.UTC)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    marker = out / "runs-commit.txt"
    runs_rev = marker.read_text().strip() if args.resume and marker.exists() else rev
    marker.write_text(runs_rev + "\n")

    def progress(result) -> None:  # type: ignore[no-untyped-def]
        print(f"# {result.name}: {'ok' if result.ok else 'WRONG: ' + '; '.join(result.problems)} "
              f"({result.wall_s:.0f} s)", file=sys.stderr, flush=True)

    scores, summary = run_campaign(
        campaign,
        scenarios,
        Path(args.out),
        on_score=progress,
        deadline_s=args.deadline,
        resume=args.resume,
    )
    command = (
        "PYTHONPATH=. python bench/bench_campaign.py"
        + (" --ci" if args.ci else "")
        + (f" --only {' '.join(args.only)}" if args.only else "")
        + (f" --deadline {args.deadline:g}" if args.deadline else "")
        + (f' --section "{args.section}"' if args.section != SECTION else "")
    )
    (out / "report.md").write_text(markdown(scores, summary) + "\n")
    scripts = sorted({Path(s.script).name for s in scenarios})
    section = Section(
        args.section,
        (
            "Real training jobs (controller/lab/jobs: DDP, and a pipeline with new_group "
            "sub-groups and send/recv; gloo, CPU) under `faultlens run` on simulated nodes, "
            "faults injected without changing the script (controller/lab/inject.py via "
            "sitecustomize; signals, "
            "node and agent loss and a CPU hog from outside; Xid 79 / DBE / row-remap / thermal "
            "through the recorded NVML backend), each scored against the truth in "
            "rules/campaign.yaml. Also: `faultlens campaign [--only NAME ...]`."
            if args.section == SECTION
            else f"{len(scenarios)} scenarios of rules/campaign.yaml run on their own (scripts: "
            f"{', '.join(scripts)}) under `faultlens run` on simulated nodes, faults injected "
            "without changing the script, scored against the truth in rules/campaign.yaml as the "
            "whole campaign is."
        ),
        (command,),
        campaign_figures(summary, runs_rev.split(" ", 1)[0], f"{started:%Y-%m-%d %H:%M}"),
        (f"Runs made on commit {runs_rev}"
         + (f", scored on commit {rev}" if runs_rev != rev else "")
         + f", {machine()['cores']} cores (load average {os.getloadavg()[0]:.0f} at the end), "
         f"{summary['scenarios']} scenarios: the engine and supervisor as they were on that "
         "commit.",
         "The tables per fault type and per scenario (expected, observed, excluded, restore, the "
         f"problems of each wrong row): {out}/report.md of the run."))
    if not args.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", section)
    emit("campaign", {"commit": rev, "machine": machine(), **summary})
    (Path(args.out) / "summary.json").write_text(
        json.dumps({"commit": rev, **summary}, indent=1, default=str)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
