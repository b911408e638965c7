"""Entry point of the `faultlens` console script."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from faultlens.errors import FaultlensError

# Each module adds its subcommands with register(subparsers); the order here is the order in --help.
# Entries are module names (a bare name is under faultlens.controller.cli; the lab's commands live
# in the lab, which nothing outside it imports), imported only when one of their commands runs
# (controller/cli/lazy.py), or module objects (imported up front).
LAB_COMMANDS = "faultlens.controller.lab.commands"
COMMAND_MODULES: list = [
    "run_cmds",
    "store_cmds",
    "ingest_cmds",
    "gpu_cmds",
    "decision_cmds",
    "hang_cmds",
    "attribution_cmds",
    f"{LAB_COMMANDS}.sim_cmds",
    "goodput_cmds",
    f"{LAB_COMMANDS}.campaign_cmds",
    "doctor_cmds",
    "slurm_cmds",
    "serve_cmds",
    "view_cmds",
]


def module_name(entry: str) -> str:
    """The full module name of a COMMAND_MODULES entry."""
    return entry if "." in entry else f"faultlens.controller.cli.{entry}"


def _module(entry):
    return importlib.import_module(module_name(entry)) if isinstance(entry, str) else entry


def build_parser(command: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The whole CLI; `lazy`: modules whose commands do not include `command` are listed from their
    source (names and help only) instead of imported; when the source names the module that
    registers `command`, the parser holds that module's commands alone (the others are needed
    only by --help and by an unknown command's error, which build the whole list)."""
    from faultlens.controller.cli.lazy import listed_commands, owner_of

    parser = argparse.ArgumentParser(
        prog="faultlens",
        description="Fault attribution for large distributed training jobs: crash, hang or "
                    "straggler; "
        "which node, rank and GPU; why; and what to do.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    owner = owner_of(command, COMMAND_MODULES) if lazy and command else None
    if owner is not None:
        _module(owner).register(subparsers)
        return parser
    for entry in COMMAND_MODULES:
        listed = listed_commands(entry) if lazy and isinstance(entry, str) else None
        if listed is not None and command not in {name for name, _ in listed}:
            for name, text in listed:
                subparsers.add_parser(name, help=text)
            continue
        _module(entry).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    whole_process = argv is None  # the console script, not a caller in the same process
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(command, lazy=True)
    args = parser.parse_args(argv)
    rules = getattr(args, "rules", None)
    # `--rules DIR` (a file stays the command's own argument)
    if rules is not None and Path(rules).is_dir():
        from faultlens.resources import use_rules_dir  # (importlib.resources: only when asked)

        use_rules_dir(rules)
        args.rules = None
    try:
        code = int(args.func(args) or 0)
    except FaultlensError as exc:  # the one place an error becomes a message and an exit code
        message = str(exc).replace("\n", " ") or type(exc).__name__
        print(f"faultlens {args.command}: error: {message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"faultlens {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    if whole_process and getattr(args, "exit_at_once", False):
        _exit_at_once(code)
    return code


def _exit_at_once(code: int) -> None:
    """End the process now, its output flushed: a command that closed everything it opened (sets
    args.exit_at_once) skips the interpreter's teardown of pandas, pyarrow and DuckDB, seconds on a
    loaded machine after the verdict was printed (faultlens run's job error)."""
    import contextlib
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
