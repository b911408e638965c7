"""The fault-injection campaign as a benchmark: every scenario of rules/campaign.yaml (real DDP and pipeline jobs
under `faultlens run`, faults injected from outside the script), scored, and written into docs/benchmarks.md as
its own section ("## Fault-injection campaign": the aggregates, a table per fault type, one row per scenario),
labelled with the commit it ran on.

    PYTHONPATH=. python bench/bench_campaign.py [--only NAME ...] [--ci] [--out DIR] [--deadline S] [--no-docs]

One scenario runs at a time (each is 2 nodes x 2 ranks, or 2 x 1 for the CI subset: 4-6 Python processes with
torch, ~1.5 GB together). Latencies are wall clock from the injection (the injected process or the campaign logs
time.time() just before it acts) to the incident's detected_ts and the decision's issued_ts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import emit, machine  # noqa: E402

SECTION = "## Fault-injection campaign"


def commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.strip()
        return f"{rev} (branch {branch}{', uncommitted changes' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_section(docs: Path, body: str) -> None:
    """Replace this benchmark's own section of docs/benchmarks.md (or append it); other sections stay as they are."""
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    section = f"{SECTION}\n\n{body.rstrip()}\n\n"
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    docs.write_text(text)


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
    parser.add_argument("--resume", action="store_true", help="score scenarios already run under --out, run the rest")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/benchmarks.md")
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

    scores, summary = run_campaign(campaign, scenarios, Path(args.out), on_score=progress, deadline_s=args.deadline,
                                   resume=args.resume)
    command = "PYTHONPATH=. python bench/bench_campaign.py" + (" --ci" if args.ci else "") + (
        f" --only {' '.join(args.only)}" if args.only else "") + (f" --deadline {args.deadline:g}" if args.deadline
                                                                  else "")
    body = "\n".join([
        "Real training jobs (controller/lab/jobs: DDP, and a pipeline with new_group sub-groups and send/recv; gloo, "
        "CPU) under `faultlens run` on simulated nodes, faults injected without changing the script "
        "(controller/lab/inject.py via sitecustomize; signals, node and agent loss and a CPU hog from outside; "
        "Xid 79 / DBE / row-remap / thermal through the recorded NVML backend), each scored against the truth in "
        "rules/campaign.yaml. Also: `faultlens campaign [--only NAME ...]`.",
        "",
        f"    {command}",
        "",
        f"Runs made on commit {runs_rev}" + (f", scored on commit {rev}" if runs_rev != rev else "")
        + f", {started:%Y-%m-%d %H:%M} UTC, {machine()['cores']} cores (load average "
        f"{os.getloadavg()[0]:.0f} at the end), {summary['scenarios']} scenarios. This is the engine and supervisor "
        "as they were on that commit: the wrong rows are what the campaign found.",
        "",
        markdown(scores, summary),
    ])
    if not args.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", body)
    emit("campaign", {"commit": rev, "machine": machine(), **summary})
    (Path(args.out) / "summary.json").write_text(json.dumps({"commit": rev, **summary}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
