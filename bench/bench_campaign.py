"""The fault-injection campaign as a benchmark: every scenario of rules/campaign.yaml (real DDP and
pipeline jobs under `faultlens run`, faults injected from outside the script), scored, and written
into docs/benchmarks.md as its own section ("## Fault-injection campaign": the aggregates as one
table of figures, in bench/common.py's form), labelled with the commit it ran on; the tables per
fault type and per scenario go to <out>/report.md.

    PYTHONPATH=. python bench/bench_campaign.py [--only NAME ...] [--exclude PREFIX ...] [--ci]
    [--out DIR] [--deadline S] [--resume [--rerun NAME ...]] [--note TEXT] [--no-docs]

`--exclude user- ci-` is the original 48 scenarios (no users' scripts, no CI subset). With
`--resume`, finished runs under --out are scored again and the rest run; `--rerun NAME` runs NAME
again, its earlier run kept as <out>/NAME.run<k> and listed in the section's notes (right or wrong,
wall, latencies, load). Each scenario run here records the 1-minute load average at its end
(<out>/NAME/load.json); the notes give their range and name every wrong row with its problems.

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
import signal
import subprocess
import sys
import time
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


LOAD_FILE = "load.json"


def record_load(run_dir: Path) -> None:
    """The load average at the end of a scenario just run here, once."""
    path = run_dir / LOAD_FILE
    if run_dir.is_dir() and not path.exists():
        one, five, _ = os.getloadavg()
        path.write_text(json.dumps({"load_1m": round(one, 1), "load_5m": round(five, 1),
                                    "ts": round(time.time(), 1)}) + "\n")


def read_load(run_dir: Path) -> float | None:
    try:
        return float(json.loads((run_dir / LOAD_FILE).read_text())["load_1m"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def set_aside(out: Path, name: str) -> Path | None:
    """Keep a finished run of `name` as <out>/<name>.run<k> (the next free k), so it runs again."""
    run = out / name
    if not (run / "artifacts.json").exists():
        return None
    k = 1
    while (out / f"{name}.run{k}").exists():
        k += 1
    run.rename(out / f"{name}.run{k}")
    return out / f"{name}.run{k}"


def earlier_runs(out: Path, name: str) -> list[Path]:
    """The runs of `name` set aside by --rerun, oldest first."""
    runs = [p for p in out.glob(f"{name}.run*") if p.name[len(name) + 4:].isdigit()
            and (p / "artifacts.json").exists()]
    return sorted(runs, key=lambda p: int(p.name[len(name) + 4:]))


def problems(result: Any) -> str:
    """A wrong row's problems in a note: the first, and how many more (all in report.md)."""
    first, more = result.problems[0], len(result.problems) - 1
    return first + (f" and {more} more" if more else "") + (
        f"; timed out after {result.wall_s:.0f} s" if result.timed_out else "")


def run_line(result: Any, load: float | None) -> str:
    """One run of a scenario in a note: right or wrong (why), wall, first latencies, load."""
    first = result.checks[0] if result.checks else None
    lat = ""
    if first is not None and first.latency_incident_s is not None:
        lat = (f", fault -> incident / decision {first.latency_incident_s:.1f} / "
               + (f"{first.latency_decision_s:.1f} s" if first.latency_decision_s is not None
                  else "- s"))
    verdict = "right" if result.ok else f"wrong ({problems(result)})"
    return (f"{verdict}, {result.wall_s:.0f} s{lat}, load "
            + (f"{load:.0f}" if load is not None else "not recorded"))


def run_notes(scores: list[Any], out: Path, history: dict[str, list[str]]) -> list[str]:
    """The notes the runs themselves give: the load they ran under, each wrong row and its
    problems, and every row run more than once with each run's outcome."""
    notes = []
    loads = sorted(v for v in (read_load(out / s.name) for s in scores) if v is not None)
    if loads:
        notes.append(f"1-minute load average at the end of each scenario ({len(loads)} of "
                     f"{len(scores)} recorded): {loads[0]:.0f}-{loads[-1]:.0f}, median "
                     f"{loads[len(loads) // 2]:.0f}.")
    wrong = [s for s in scores if not s.ok]
    notes.append("Wrong in this run: " + ("; ".join(f"{s.name} ({problems(s)})" for s in wrong)
                                           if wrong else "none") + ".")
    for s in scores:
        if history.get(s.name):
            runs = [*history[s.name], run_line(s, read_load(out / s.name))]
            notes.append(f"Run {len(runs)} times: {s.name}: "
                         + "; ".join(f"run {i} {line}" for i, line in enumerate(runs, 1))
                         + " (the table counts the last).")
    return notes


def stop_on_signal() -> None:
    """SIGTERM, and SIGINT even where a background shell left it ignored, stop the campaign as
    Ctrl-C does: the running scenario's supervisor, agents and ranks are stopped and reaped."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> int:
    from faultlens.controller.lab.campaign import interleave, run_campaign
    from faultlens.controller.lab.report import markdown
    from faultlens.controller.lab.runner import load_artifacts
    from faultlens.controller.lab.scenarios import DEFAULT_SCENARIOS, load_campaign
    from faultlens.controller.lab.score import score

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS))
    parser.add_argument("--only", nargs="+")
    parser.add_argument("--exclude", nargs="+", default=[], metavar="PREFIX",
                        help="leave out scenarios whose name starts with one of these "
                        "(--exclude user- ci-: the original 48)")
    parser.add_argument("--ci", action="store_true")
    parser.add_argument("--out", default="/tmp/faultlens-campaign")
    parser.add_argument("--deadline", type=float, help="start no scenario after this many seconds")
    parser.add_argument("--resume", action="store_true", help="score scenarios already run under "
                                                              "--out, run the rest")
    parser.add_argument("--rerun", nargs="+", default=[], metavar="NAME",
                        help="run these again (their earlier run is kept as <out>/NAME.run<k> and "
                        "listed in the section's notes)")
    parser.add_argument("--note", action="append", default=[],
                        help="a note for the published section (repeatable)")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument(
        "--section",
        default=SECTION,
        help="the docs/benchmarks.md section the result goes to (a family run with --only has its "
        "own: the whole campaign's stays as it was)",
    )
    args = parser.parse_args()
    stop_on_signal()
    campaign = load_campaign(args.scenarios)
    scenarios = interleave([s for s in campaign.select(args.only, ci=args.ci)
                            if not s.name.startswith(tuple(args.exclude))])
    missing = sorted(set(args.rerun) - {s.name for s in scenarios})
    if missing:
        parser.error(f"--rerun: not among the scenarios run: {', '.join(missing)}")
    rev, started = commit(), dt.datetime.now(dt.UTC)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.rerun:
        set_aside(out, name)
    by_name = {s.name: s for s in scenarios}
    # the runs already here are scored, not run: their load is their own run's (or unknown)
    ran_before = {n for n in by_name if args.resume and (out / n / "artifacts.json").exists()}
    history = {
        name: [run_line(score(by_name[name], load_artifacts(run)), read_load(run))
               for run in earlier_runs(out, name)]
        for name in by_name
    }
    marker = out / "runs-commit.txt"
    runs_rev = marker.read_text().strip() if args.resume and marker.exists() else rev
    marker.write_text(runs_rev + "\n")

    def progress(result) -> None:  # type: ignore[no-untyped-def]
        print(f"# {result.name}: {'ok' if result.ok else 'WRONG: ' + '; '.join(result.problems)} "
              f"({result.wall_s:.0f} s)", file=sys.stderr, flush=True)
        if result.name not in ran_before:
            record_load(out / result.name)

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
        + (f" --exclude {' '.join(args.exclude)}" if args.exclude else "")
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
         *run_notes(scores, out, history),
         *args.note,
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
