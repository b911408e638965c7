"""One error base (issue 14): every error class of the project derives from FaultlensError and keeps
its other bases; the CLI turns any FaultlensError into one line and its exit code in one place
(controller/cli/main.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

from faultlens.errors import FaultlensError
from tests.conftest import REPO_ROOT

ROOMS = ("collectors", "attribution", "controller")
# modules that need a real training process or optional packages to import
SKIP = (
    "faultlens.controller.demo.train",
    "faultlens.controller.lab.jobs",
    "faultlens.controller.lab.site",
)


def _error_classes() -> list[type[BaseException]]:
    found = []
    for room in ROOMS:
        for info in pkgutil.walk_packages([str(REPO_ROOT / room)], f"faultlens.{room}."):
            if info.name.startswith(SKIP):
                continue
            module = importlib.import_module(info.name)
            for _, value in inspect.getmembers(module, inspect.isclass):
                if issubclass(value, BaseException) and value.__module__ == module.__name__:
                    found.append(value)
    return found


def test_every_project_error_class_derives_from_faultlens_error():
    classes = _error_classes()
    assert len(classes) >= 35
    assert [c.__qualname__ for c in classes if not issubclass(c, FaultlensError)] == []


def test_callers_that_catch_the_builtin_bases_still_catch_them():
    from faultlens.collectors.rule_loader import RuleFileError
    from faultlens.collectors.store.layout import StoreError
    from faultlens.controller.hooks.base import HookError

    assert issubclass(StoreError, OSError) and issubclass(RuleFileError, ValueError)
    assert issubclass(HookError, RuntimeError)


@pytest.mark.parametrize(
    ("message", "code"), [("store s3://x: cannot list\n(a second line)", 2), ("gone", 3)]
)
def test_the_cli_translates_any_faultlens_error_in_one_place(
    monkeypatch, capsys, tmp_path, message, code
):
    from faultlens.attribution.reading.store import QueryError
    from faultlens.controller.cli import main as cli_main
    from faultlens.controller.cli import store_cmds

    class Gone(FaultlensError):
        exit_code = 3

    error = QueryError(message) if code == 2 else Gone(message)

    def failing(args):
        raise error

    monkeypatch.setattr(store_cmds, "cmd_tables", failing)
    assert cli_main.main(["tables", "--store", str(tmp_path)]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"faultlens tables: error: {message.replace(chr(10), ' ')}"]


def test_an_error_no_command_catches_reaches_the_user_as_one_line(tmp_path):
    """`faultlens jobs` on a store path that is a file: the store's own error, no traceback, exit 2.
    """
    not_a_store = tmp_path / "store"
    not_a_store.write_text("a file")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "faultlens.controller.cli.main",
            "incident",
            "x",
            "--store",
            str(not_a_store),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(
        "faultlens incident: error: "
    )
