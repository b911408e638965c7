"""Start-up without importing every command: the names and help lines of a command module's
subcommands read from its source (the `subparsers.add_parser("name", help="...")` calls in its
`register`), so `faultlens --help` and `faultlens sql` import only what they run (no torch, sklearn,
numba, OpenTelemetry or pandas for them)."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

CLI_DIR = Path(__file__).resolve().parent
# the directory faultlens.controller is installed from (controller/)
PACKAGE_DIR = CLI_DIR.parent


def _source(module: str) -> Path:
    """The source file of a command module: a bare name under controller/cli, else a
    faultlens.controller.* name (found from the path, so listing imports nothing)."""
    if "." not in module:
        return CLI_DIR / f"{module}.py"
    parts = module.split(".")
    if parts[:2] != ["faultlens", "controller"]:
        raise OSError(f"not a faultlens.controller module: {module}")
    return PACKAGE_DIR.joinpath(*parts[2:]).with_suffix(".py")


def _literal(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _register_source(text: str) -> str:
    """The source of the module's top-level `def register(` alone (parsing it, not the whole
    module, is most of a start's listing cost), else the whole text."""
    start = text.find("\ndef register(")
    if start < 0:
        return text
    lines = text[start + 1 :].split("\n")
    end = 1
    while end < len(lines) and (not lines[end] or lines[end][0] in " \t#)"):
        end += 1
    return "\n".join(lines[:end]) + "\n"


@lru_cache(maxsize=64)
def listed_commands(module: str) -> tuple[tuple[str, str | None], ...] | None:
    """(name, help) of each top-level subcommand the command module `module` registers; None when
    its source does not say them literally (then the module is imported to know)."""
    try:
        text = _source(module).read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        tree = ast.parse(_register_source(text))
    except SyntaxError:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return None
    register = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register"), None
    )
    if register is None or not register.args.args:
        return None
    receiver = register.args.args[0].arg
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(register):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_parser" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == receiver):
            continue
        name = _literal(node.args[0]) if node.args else None
        if name is None:
            return None
        help_kw = next((k.value for k in node.keywords if k.arg == "help"), None)
        if help_kw is not None and _literal(help_kw) is None:
            return None
        found.append((name, _literal(help_kw)))
    return tuple(found) or None


def owner_of(command: str, entries: list) -> str | None:
    """The command module (a COMMAND_MODULES entry) that registers `command`, found from the
    sources: a text search for its `add_parser("command"` call, confirmed by that module's listing
    (one parse, not one per module). None when no module's source says it literally."""
    needles = (f'add_parser("{command}"', f"add_parser('{command}'")
    for entry in entries:
        if not isinstance(entry, str):
            continue
        try:
            text = _source(entry).read_text(encoding="utf-8")
        except OSError:
            continue
        if not any(needle in text for needle in needles):
            continue
        listed = listed_commands(entry)
        if listed is not None and command in {name for name, _ in listed}:
            return entry
    return None
