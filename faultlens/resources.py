"""Where faultlens finds its rule files and its own files: the one place that knows.

Rules: the YAML files under rules/ ship in the package (`faultlens.rules`, package data) and are
found through importlib.resources, so a wheel install reads the same files as a source checkout. A
user's rules directory overrides them file by file: `--rules DIR` on a command that reads rules, or
FAULTLENS_RULES=DIR in the environment (what `--rules DIR` sets, so the processes a command starts
read the same rules). A file the directory does not have comes from the package; a directory that
does not exist makes every rule file unreadable (the loader's one-line error names the path), never
silently the shipped ones.

An explicit file (`--policy FILE`, `--thresholds FILE`, FAULTLENS_XID_CATALOG=FILE, ...) beats both.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from pathlib import Path

from faultlens import environment

# a directory of rule files that replace the shipped ones of the same name
RULES_ENV = environment.RULES.name
RULES_PACKAGE = "faultlens.rules"


def shipped_rule_file(name: str) -> Path:
    """The packaged copy of rules/<name> (whatever FAULTLENS_RULES says)."""
    resource = importlib.resources.files(RULES_PACKAGE).joinpath(name)
    # installed from a directory (wheel or checkout); zip imports are not supported
    return Path(str(resource))


def shipped_rules_dir() -> Path:
    """The directory of the packaged rule files."""
    return shipped_rule_file("policy.yaml").parent


def rules_override() -> Path | None:
    """The user's rules directory (FAULTLENS_RULES), or None."""
    value = (environment.RULES.get() or "").strip()
    return Path(value).expanduser() if value else None


def rule_file(name: str) -> Path:
    """rules/<name> as this process should read it: the user's directory's copy when it has one (or
    when the directory is missing, so that the error names it), else the packaged one."""
    override = rules_override()
    if override is not None:
        candidate = override / name
        if candidate.is_file() or not override.is_dir():
            return candidate
    return shipped_rule_file(name)


def use_rules_dir(path: str | os.PathLike[str]) -> Path:
    """Make `path` the rules directory of this process and of the processes it starts (`--rules
    DIR`).
    """
    directory = Path(path).expanduser().resolve()
    os.environ[RULES_ENV] = str(directory)
    return directory


def rooms_root() -> Path:
    """The directory that holds collectors/, attribution/, controller/: the checkout's root, or the
    installed `faultlens` package directory. Paths of shipped non-rule files (the campaign's job
    scripts) are relative to it."""
    spec = importlib.util.find_spec("faultlens.controller")
    if spec is None or spec.origin is None:  # pragma: no cover - the package is incomplete
        raise ImportError("faultlens.controller is not importable")
    return Path(spec.origin).resolve().parents[1]


def shipped_path(relative: str) -> Path:
    """A path the shipped rule files use (`rules/x.yaml`, `controller/lab/jobs/ddp_train.py`), found
    where it is installed; rules/... go through rule_file (so FAULTLENS_RULES applies)."""
    parts = Path(relative).parts
    if len(parts) == 2 and parts[0] == "rules":
        return rule_file(parts[1])
    return rooms_root() / relative


def import_root() -> Path:
    """The directory to put on PYTHONPATH so that a child process imports this same faultlens: the
    checkout's root or the site-packages directory the wheel is in (never a room itself, which would
    make `collectors` a top-level package)."""
    spec = importlib.util.find_spec("faultlens")
    if spec is None or spec.origin is None:  # pragma: no cover
        raise ImportError("faultlens is not importable")
    return Path(spec.origin).resolve().parents[1]
