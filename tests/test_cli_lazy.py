"""The lazy start-up lists exactly the commands (names, order, help lines) the eager CLI registers,
and each command still parses its full options when it is the one run."""

from __future__ import annotations

import argparse

from faultlens.controller.cli.main import build_parser


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return [(name, helps.get(name)) for name in action.choices]


def test_lazy_listing_matches_the_eager_parser():
    eager = _commands(build_parser())
    assert _commands(build_parser(lazy=True)) == eager
    assert [name for name, _ in eager][:2] == ["demo", "run"] and ("report", eager[-1][1]) == eager[
        -1
    ]


def test_the_command_run_gets_its_real_parser():
    for argv, dest in (
        (["sql", "SELECT 1"], "query"),
        (["jobs", "--json"], "fmt"),
        (["incident", "inc-1"], "incident_id"),
        (["retention", "--days", "3", "--dry-run"], "dry_run"),
    ):
        args = build_parser(argv[0], lazy=True).parse_args(argv)
        assert hasattr(args, dest) and args.func is not None


def test_every_command_module_is_listed_from_its_source_lab_included():
    from faultlens.controller.cli.lazy import listed_commands
    from faultlens.controller.cli.main import COMMAND_MODULES

    assert [entry for entry in COMMAND_MODULES if listed_commands(entry) is None] == []


def test_a_command_imports_no_other_command_module():
    import ast
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys\n"
        "from faultlens.controller.cli.main import build_parser\n"
        "build_parser(sys.argv[1], lazy=True)\n"
        "print(sorted(m for m in sys.modules if m.endswith('_cmds')))\n"
    )
    for command, module in (("sql", "store_cmds"), ("analyze-hang", "hang_cmds"),
                            ("simulate", "sim_cmds")):
        out = subprocess.run(
            [sys.executable, "-c", code, command], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, timeout=300,
        ).stdout
        assert [name.rsplit(".", 1)[-1] for name in ast.literal_eval(out)] == [module], out
