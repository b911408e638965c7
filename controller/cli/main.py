"""Entry point of the `faultlens` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from controller.cli import (
    attribution_cmds,
    campaign_cmds,
    decision_cmds,
    goodput_cmds,
    gpu_cmds,
    hang_cmds,
    ingest_cmds,
    run_cmds,
    sim_cmds,
    store_cmds,
)
from controller.cli.common import CliError

# Each module adds its subcommands with register(subparsers); the order here is the order in --help.
COMMAND_MODULES = [run_cmds, store_cmds, ingest_cmds, gpu_cmds, decision_cmds, hang_cmds, attribution_cmds, sim_cmds,
                   goodput_cmds, campaign_cmds]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faultlens",
        description="Fault attribution for large distributed training jobs: crash, hang or straggler; "
        "which node, rank and GPU; why; and what to do.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"faultlens {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"faultlens {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
