"""Every FAULTLENS_* environment variable is declared in faultlens/environment.py (issue 14): the
docs page is generated from it, no code reads one except through it, every one the tree mentions is
declared, and the module stays import-light (the training process imports it)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from faultlens import environment
from tests.conftest import REPO_ROOT

CODE_ROOTS = ("collectors", "attribution", "controller", "bench", "scripts")
TOKEN = re.compile(r"FAULTLENS_[A-Z0-9_]*[A-Z0-9]")
# names in the tree that are not variables faultlens or its examples read
NOT_VARIABLES = {
    "FAULTLENS_FR": "the FAULTLENS_FR_* family, named in prose",
    "FAULTLENS_HOOK_SECRET": "an example secret_env name in a hooks file (the user picks the name)",
}


def _tracked(*suffixes: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    ).stdout.split()
    return [REPO_ROOT / f for f in out if f.endswith(suffixes) and (REPO_ROOT / f).is_file()]


def _is_variable(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(TOKEN.fullmatch(node.value))
    )


def reads_outside_the_module(tree: ast.AST) -> list[tuple[int, str]]:
    """Places that read a FAULTLENS_* variable by its literal name: environ.get("X") / getenv("X") /
    environ["X"] / "X" in environ, and NAME = "X" (a second declaration)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and _is_variable(node.args[0]):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("get", "getenv", "pop", "setdefault", "environ"):
                found.append((node.lineno, f"{name}({node.args[0].value!r})"))
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _is_variable(node.slice)
        ):
            found.append((node.lineno, f"[{node.slice.value!r}]"))
        elif (
            isinstance(node, ast.Compare)
            and _is_variable(node.left)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
        ):
            found.append((node.lineno, f"{node.left.value!r} in ..."))
        elif isinstance(node, ast.Assign) and _is_variable(node.value):
            found.append((node.lineno, f"= {node.value.value!r}"))
    return found


def test_the_docs_page_is_generated_from_the_module():
    page = REPO_ROOT / "docs" / "environment.md"
    assert page.read_text() == environment.markdown(), (
        "regenerate: python -m faultlens.environment > docs/environment.md"
    )
    for variable in environment.VARIABLES:
        assert variable.name.startswith("FAULTLENS_") and variable.meaning and variable.readers


def test_no_code_reads_a_faultlens_variable_except_through_the_module():
    offenders = []
    for path in _tracked(".py"):
        relative = path.relative_to(REPO_ROOT)
        if relative.parts[0] not in CODE_ROOTS or relative == Path("faultlens/environment.py"):
            continue
        for line, what in reads_outside_the_module(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{relative}:{line}: {what}")
    assert not offenders, "read these through faultlens.environment:\n" + "\n".join(offenders)


def test_the_check_finds_each_shape_of_read():
    code = ('import os\nA = os.environ.get("FAULTLENS_NODE")\nB = os.getenv("FAULTLENS_STORE")\n'
            'C = os.environ["FAULTLENS_JOB_ID"]\nD = "FAULTLENS_CLUSTER" in os.environ\nE = '
            '"FAULTLENS_ATTEMPT"\n'
            'os.environ["FAULTLENS_NODE"] = "n"\nF = {"FAULTLENS_NODE": "n"}\n')
    assert sorted(line for line, _ in reads_outside_the_module(ast.parse(code))) == [2, 3, 4, 5, 6]


def test_every_faultlens_variable_the_tree_mentions_is_declared():
    undeclared: dict[str, set[str]] = {}
    for path in _tracked(".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".ipynb", "Dockerfile"):
        relative = path.relative_to(REPO_ROOT)
        if relative.parts[0] == "tests":
            continue  # the test harness's own knobs
        for token in TOKEN.findall(path.read_text(errors="replace")):
            if token not in NOT_VARIABLES:
                try:
                    environment.by_name(token)
                except KeyError:
                    undeclared.setdefault(token, set()).add(str(relative))
    assert not undeclared, undeclared


def test_reading_helpers(monkeypatch):
    env = {
        "FAULTLENS_FR_MAX_WORLD_SIZE": "12",
        "FAULTLENS_FR_STACK_TRACES": "off",
        "FAULTLENS_NODE": "",
    }
    assert environment.FR_MAX_WORLD_SIZE.get_int(env) == 12
    assert environment.FR_MAX_STRING_BYTES.get_int(env) == 4 * 1024 * 1024  # the declared default
    assert (
        environment.FR_MAX_WORLD_SIZE.get_int({"FAULTLENS_FR_MAX_WORLD_SIZE": "many"}, default=3)
        == 3
    )
    assert environment.FR_STACK_TRACES.get_bool(env) is False
    assert environment.FR_DUMP_ON_SIGTERM.get_bool(env) is None
    assert (
        environment.NODE.get(env) is None
        and environment.NODE.raw(env) == ""
        and environment.NODE.is_set(env)
    )
    monkeypatch.setenv("FAULTLENS_STORE", "s3://bucket/store")
    assert environment.STORE.get() == "s3://bucket/store"
    monkeypatch.delenv("FAULTLENS_STORE")
    assert environment.STORE.get() == "./faultlens-store" and environment.STORE.raw() is None


def test_the_module_imports_nothing_heavy():
    code = "import sys, faultlens.environment; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
        ).stdout.split()
    )
    assert not loaded & {
        "yaml",
        "pyarrow",
        "pydantic",
        "jsonschema",
        "numpy",
        "pandas",
        "torch",
        "fsspec",
    }
