"""`faultlens campaign`: the fault-injection campaign (controller/lab): real training jobs under
`faultlens run` with faults injected at chosen ranks, steps and nodes, each scored against the truth
of its scenario."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from faultlens.controller.cli.common import CliError, add_rules_dir_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("campaign", help="run the fault-injection campaign and score every "
                                                 "decision")
    cmd.add_argument("--scenarios", help="scenarios YAML (default rules/campaign.yaml)")
    add_rules_dir_arg(cmd)
    cmd.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios")
    cmd.add_argument("--ci", action="store_true", help="run only the CI subset (scenarios marked "
                                                       "ci: true)")
    cmd.add_argument("--out", default="./faultlens-campaign", help="where runs and results go "
                                                                   "(default %(default)s)")
    cmd.add_argument("--deadline", type=float, help="start no scenario after this many seconds")
    cmd.add_argument("--resume", action="store_true",
                     help="score scenarios already run under --out from their runs; run only the "
                          "others")
    cmd.add_argument("--list", action="store_true", help="list the scenarios and exit")
    cmd.add_argument("--json", action="store_true", help="print the scores and the summary as JSON")
    cmd.set_defaults(func=cmd_campaign)


def cmd_campaign(args: argparse.Namespace) -> int:
    from faultlens.controller.lab.campaign import run_campaign
    from faultlens.controller.lab.report import markdown
    from faultlens.controller.lab.scenarios import load_campaign

    campaign = load_campaign(args.scenarios or None)
    scenarios = campaign.select(args.only, ci=args.ci)
    if args.list:
        for s in scenarios:
            truth = "; ".join(
                f"{e.incident_class}/{'|'.join(e.causes)} -> {e.action}" for e in s.truth.incidents
            )
            print(
                f"{s.name:32s} {s.nodes}x{s.ranks} {Path(s.script).name:20s} {truth or 'healthy'}"
            )
        return 0
    if not scenarios:
        raise CliError("no scenario selected")

    def progress(result) -> None:  # type: ignore[no-untyped-def]
        if not args.json:
            status = "ok" if result.ok else "WRONG: " + "; ".join(result.problems)
            print(f"{result.name}: {status} ({result.wall_s:.0f} s)", flush=True)

    scores, summary = run_campaign(
        campaign,
        scenarios,
        Path(args.out),
        on_score=progress,
        deadline_s=args.deadline,
        resume=args.resume,
    )
    text = markdown(scores, summary)
    (Path(args.out) / "report.md").write_text(text + "\n")
    if args.json:
        json.dump(
            {"summary": summary, "scenarios": [s.to_dict() for s in scores]},
            sys.stdout,
            indent=1,
            default=str,
        )
        sys.stdout.write("\n")
    else:
        print(text)
    return 0 if all(s.ok for s in scores) else 1
