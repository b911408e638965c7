"""A job that cannot start is not a node failure: the checks `faultlens run` makes before launch
(check_command: the script exists and compiles, or the `-m` module is found and compiles) and the
judgment after a start that failed everywhere (job_start_error: every node's ranks ended before any
step with the same error, the script's own).

A job error names no node: the same error on every node is the job's (its code, its config, its
environment), and a restart or failover would fail the same way."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import py_compile
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from faultlens.collectors.artifacts.torchrun_report import (
    TorchrunReportError,
    parse_torchrun_output,
)

MAX_BYTES = 1 << 20  # read at most this much of each worker log
REPORT_TAIL_BYTES = 64 << 10  # torchrun's failure report is read from this much of its stderr's end
TAIL_LINES = 12  # of the script's own stderr, shown with a job error

_PREFIX = re.compile(r"^\[default\d+\]:|^\[rank\d+\]:")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


@dataclass(frozen=True)
class JobError:
    """The job's own error: one line (the script's error), where it was seen, and the tail of that
    rank's stderr."""

    error: str
    path: Path | None = None
    stderr: tuple[str, ...] = ()


def check_command(
    command: Sequence[str], cwd: Path | None = None, *, imports: bool = True
) -> JobError | None:
    """Before launch: the training script (`script.py ARGS` or `-m module ARGS`) exists and compiles
    (py_compile), and (`imports`) the modules a script imports before any other statement are found.
    None when it does; otherwise the script's problem, as one line."""
    if not command:
        return JobError("no training command")
    base = Path(cwd) if cwd is not None else Path.cwd()
    if command[0] == "-m":
        if len(command) < 2:
            return JobError("-m without a module name")
        return _check_module(command[1], base)
    if command[0].startswith("-"):
        return None  # an interpreter option: torchrun's business
    path = Path(command[0])
    path = path if path.is_absolute() else base / path
    if not path.exists():
        return JobError(f"{command[0]}: no such file", path)
    if not path.is_file():
        return JobError(f"{command[0]}: not a file", path)
    problem = _compiles(path, command[0])
    if problem is None and imports:
        problem = _leading_imports_found(path, command[0])
    return problem


def _check_module(name: str, base: Path) -> JobError | None:
    """Find `name` without importing it where the file system says where it is (a package's
    __init__ may import torch), else as python -m would (importing its parents), then compile it."""
    search: list[str] | None = [str(base), *_sys_path()]
    spec = None
    for part in name.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            break
        search = list(spec.submodule_search_locations or [])
    if spec is None:  # a package that extends its own __path__ at import (faultlens does)
        spec, problem = _imported_spec(name, base)
        if problem is not None:
            return problem
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None  # a built-in or compiled module: nothing to compile
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: python runs its __main__
        origin = origin.parent / "__main__.py"
        if not origin.exists():
            return JobError(f"-m {name}: {name!r} is a package and cannot be directly executed")
    return _compiles(origin, str(origin))


def _imported_spec(
    name: str, base: Path
) -> tuple[importlib.machinery.ModuleSpec | None, JobError | None]:
    sys.path.insert(0, str(base))  # python -m looks in the working directory first
    try:
        spec = importlib.util.find_spec(name)
    except (Exception, SystemExit) as exc:  # the parent package fails to import: so would -m
        return None, JobError(f"-m {name}: {type(exc).__name__}: {exc}")
    finally:
        sys.path.remove(str(base))
    if spec is None:
        return None, JobError(f"-m {name}: No module named {name!r}")
    return spec, None


def _sys_path() -> list[str]:
    return [p for p in sys.path if p]


def _compiles(path: Path, shown: str) -> JobError | None:
    with tempfile.TemporaryDirectory() as scratch:
        try:
            py_compile.compile(str(path), cfile=str(Path(scratch) / "c.pyc"), doraise=True)
        except py_compile.PyCompileError as exc:
            error = exc.exc_value
            if isinstance(error, SyntaxError):
                where = f"line {error.lineno}" + (f":{error.offset}" if error.offset else "")
                text = (error.text or "").rstrip()
                return JobError(
                    f"{shown}: {type(error).__name__}: {error.msg} ({where})",
                    path,
                    (text,) if text else (),
                )
            return JobError(f"{shown}: {exc.exc_type_name}: {error}", path)
        except OSError as exc:
            return JobError(f"{shown}: cannot read: {exc.strerror or exc}", path)
    return None


def _leading_imports_found(path: Path, shown: str) -> JobError | None:
    """The modules the script imports first, before any other statement, are found (without
    importing them) where its ranks will look: the script's directory, then this interpreter's path
    (torchrun runs the ranks with this interpreter and environment). Such an import runs on every
    rank before anything else, so a module found nowhere fails every rank the same way: said here,
    in a second, instead of after the launch. Only absolute imports are looked up, by their
    top-level name; the check stops at the first other statement (a sys.path change, a try, a
    condition) and after a module of the script's own directory (it may extend the path). A module
    this check finds but the ranks do not is still judged after the start (job_start_error)."""
    try:
        source = path.read_bytes()
        tree = ast.parse(source, filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None  # _compiles said what there is to say
    text_lines = source.decode("utf-8", "replace").splitlines()
    search = [str(path.parent), *_sys_path()]
    body = list(tree.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    for statement in body:
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            names = [statement.module]
        else:
            return None
        for name in names:
            top = name.partition(".")[0]
            if top == "__future__" or top in sys.builtin_module_names:
                continue
            found = _find_top_level(top, search)
            if found is None:
                line = text_lines[statement.lineno - 1].rstrip() if text_lines else ""
                return JobError(
                    f"{shown}: line {statement.lineno}: ModuleNotFoundError: No module named "
                    f"{top!r}",
                    path,
                    (line,) if line else (),
                )
            if found.origin and Path(found.origin).parent.resolve() == path.parent.resolve():
                return None  # the script's own module: it may change where the rest is found
            if found.submodule_search_locations and any(
                Path(p).parent.resolve() == path.parent.resolve()
                for p in found.submodule_search_locations
            ):
                return None
    return None


def _find_top_level(name: str, search: list[str]) -> importlib.machinery.ModuleSpec | None:
    """A top-level module's spec from the path finder (then the meta path: frozen modules, editable
    installs' finders), importing nothing."""
    spec = importlib.machinery.PathFinder.find_spec(name, search)
    if spec is not None:
        return spec
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except Exception:  # a third-party finder's own problem: not the script's
            return importlib.machinery.ModuleSpec(name, None)
        if spec is not None:
            return spec
    return None


def _lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES)
    except OSError:
        return []
    return [_PREFIX.sub("", line).rstrip() for line in data.decode("utf-8", "replace").splitlines()]


def _last_line(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return None


def node_start_over(torchrun_stderr: Path) -> bool:
    """torchrun has given up on this node's workers: its failure report (the ChildFailedError block,
    every failed local rank listed, closed by its '=====' line) is complete in the tail of its
    stderr. It is written once the agent has stopped the rest of the group, seconds before the agent
    itself exits (its rendezvous and store shutdown), so a start that failed everywhere is judged
    from it without waiting out each agent's teardown."""
    try:
        with open(torchrun_stderr, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - REPORT_TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return False
    if " FAILED" not in text:
        return False
    try:
        output = parse_torchrun_output(text, source=str(torchrun_stderr))
    except TorchrunReportError:
        return False  # being written: not over yet
    return bool(output.reports)


def job_start_error(attempt_dir: Path, nodes: Sequence[str]) -> JobError | None:
    """An attempt that ended before any step on every node: the job's own error when each node's
    ranks that wrote anything ended on the same last line (the script's error), or, all silent,
    when every node's torchrun report gives the same non-zero exit code. None when the nodes
    disagree (a node of its own failed, the others echoed it): that is for the crash analysis."""
    attempt_dir = Path(attempt_dir)
    errors: dict[str, set[str]] = {}
    shown: tuple[Path, list[str]] | None = None
    for node in nodes:
        found: set[str] = set()
        for log in sorted((attempt_dir / "logs" / node).glob("**/stderr.log")):
            lines = _lines(log)
            last = _last_line(lines)
            if last is not None:
                found.add(last)
                shown = shown or (log, lines)
        errors[node] = found
    lines_seen = set().union(*errors.values()) if errors else set()
    if len(lines_seen) == 1 and all(errors.values()):
        assert shown is not None
        log, lines = shown
        tail = tuple(line for line in lines if line.strip())[-TAIL_LINES:]
        return JobError(next(iter(lines_seen)), log, tail)
    if lines_seen:
        return None
    codes = set()
    for node in nodes:
        report = _lines(attempt_dir / f"torchrun-{node}.stderr")
        node_codes = {int(m.group(1)) for line in report if (m := _EXIT.match(line))}
        if not node_codes:
            return None
        codes |= node_codes
    if len(codes) == 1 and next(iter(codes)) > 0:
        return JobError(
            f"every rank exited with code {next(iter(codes))} before its first step, "
            "writing nothing to stderr"
        )
    return None
