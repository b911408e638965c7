"""The built wheel, installed non-editable into a fresh virtual environment, works on its own (issue
14).

The wheel is built from a copy of the package's files (`pip wheel --no-deps --no-build-isolation`),
installed with `pip --python <fresh venv> install --no-deps --no-index`, and run from a temporary
directory outside the checkout with no PYTHONPATH and no FAULTLENS_* variables. The fresh venv
borrows this test environment's site-packages for the dependencies through a path-only .pth file (a
path line adds the directory without running that directory's own .pth files, so an editable install
of the checkout there stays inert): no network, well under a minute.

Over a real kernel log (tests/data/gpu/node-kern.log: Xid 48 and Xid 79 lines) it runs `faultlens
--help`, `faultlens ingest kmsg`, `faultlens attribute` (the XID catalog, crash rules and
thresholds) and `faultlens decide` (the policy), all from the installed package's rules; `import
collectors` fails there. A user's rules directory (`--rules DIR`, FAULTLENS_RULES) replaces a
shipped file.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from faultlens.resources import RULES_ENV, rule_file, shipped_rule_file
from tests.conftest import DATA_DIR, REPO_ROOT

ROOMS = ("collectors", "attribution", "controller")
PACKAGE_FILES = ("pyproject.toml", "setup.py", "README.md", "faultlens", *ROOMS, "rules")
KERN_LOG = DATA_DIR / "gpu" / "node-kern.log"
OVERRIDE_REASON = "site override, escalate to the operator and do not drain"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    faultlens: Path
    run_dir: Path
    env: dict[str, str]

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(a) for a in args],
            cwd=self.run_dir,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=300,
        )


def _borrowed_site_packages() -> list[str]:
    """This interpreter's site-packages directories, without any directory that makes a room
    importable at top level (a checkout on PYTHONPATH)."""
    out = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if "site-packages" not in path.parts and "dist-packages" not in path.parts:
            continue
        if any((path / room).is_dir() for room in ROOMS) or not path.is_dir():
            continue
        out.append(str(path))
    return list(dict.fromkeys(out))


def _clean_env(venv: Path, tmp: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("FAULTLENS_", "PYTHON", "PIP_", "VIRTUAL_ENV", "COV_", "PYTEST"))}
    return {
        **keep,
        "PATH": os.pathsep.join([str(venv / "bin"), "/usr/bin", "/bin"]),
        "TMPDIR": str(tmp),
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
        "COLUMNS": "100",
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    # a copy, so that building leaves no build/ or egg-info in the checkout
    for name in PACKAGE_FILES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(source, src / name)
    dist = work / "dist"
    env = _clean_env(Path(sys.executable).parent.parent, work)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            str(dist),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATH": os.environ.get("PATH", "")},
        cwd=work,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = list(dist.glob("faultlens-*.whl"))
    assert len(wheels) == 1, wheels

    venv = work / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                                   "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "borrowed-test-deps.pth").write_text("\n".join(_borrowed_site_packages()) + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheels[0]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATH": os.environ.get("PATH", "")},
        cwd=work,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    run_dir = work / "run"
    run_dir.mkdir()
    return Installed(
        wheels[0], venv, python, venv / "bin" / "faultlens", run_dir, _clean_env(venv, work)
    )


def test_wheel_holds_every_rule_file_and_only_the_faultlens_package(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    shipped = sorted(p.name for p in (REPO_ROOT / "rules").glob("*.yaml"))
    assert shipped and all(f"faultlens/rules/{name}" in names for name in shipped), shipped
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"faultlens", "faultlens-0.1.0.dist-info"}, tops
    for room in ROOMS:
        assert f"faultlens/{room}/__init__.py" in names
    # what the campaign needs at run time: its sitecustomize and its job scripts
    assert "faultlens/controller/lab/site/sitecustomize.py" in names
    assert any(n.startswith("faultlens/controller/lab/jobs/") and n.endswith(".py") for n in names)
    entry_points = (
        zipfile.ZipFile(installed.wheel).read("faultlens-0.1.0.dist-info/entry_points.txt").decode()
    )
    assert "faultlens = faultlens.controller.cli.main:main" in entry_points
    assert "restore = faultlens.controller.restore:RestoreHook" in entry_points


def test_installed_package_imports_only_as_faultlens(installed: Installed) -> None:
    for room in ROOMS:
        result = installed.run(installed.python, "-c", f"import {room}")
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (
            room,
            result.stderr,
        )
    probe = ("import json, faultlens, faultlens.collectors, faultlens.resources as r\n"
             "print(json.dumps({'pkg': faultlens.__file__, 'room': faultlens.collectors.__file__,"
             " 'path': list(faultlens.__path__), 'rule': str(r.rule_file('policy.yaml'))}))")
    result = installed.run(installed.python, "-c", probe)
    assert result.returncode == 0, result.stderr
    where = json.loads(result.stdout)
    prefix = str(installed.venv.resolve())
    assert all(
        str(Path(p).resolve()).startswith(prefix)
        for p in (where["pkg"], where["room"], *where["path"])
    )
    assert where["rule"].startswith(prefix) and where["rule"].endswith(
        "faultlens/rules/policy.yaml"
    ), where


@dataclass(frozen=True)
class Attributed:
    store: Path
    undecided_copies: tuple[Path, Path]
    ingest: subprocess.CompletedProcess
    incidents: list[dict]


@pytest.fixture(scope="module")
def attributed(installed: Installed) -> Attributed:
    """A store from the real kernel log, ingested and attributed by the installed CLI; two undecided
    copies.
    """
    store = installed.run_dir / "store"
    ingested = installed.run(
        installed.faultlens, "ingest", "kmsg", KERN_LOG, "--utc", "--store", store
    )
    assert ingested.returncode == 0, ingested.stderr
    result = installed.run(installed.faultlens, "attribute", "--store", store, "--json")
    assert result.returncode == 0, result.stderr
    copies = (installed.run_dir / "store-flag", installed.run_dir / "store-env")
    for copy in copies:
        shutil.copytree(store, copy)
    return Attributed(store, copies, ingested, json.loads(result.stdout))


def test_installed_cli_ingests_attributes_and_decides_from_packaged_rules(
    installed: Installed, attributed: Attributed
) -> None:
    helped = installed.run(installed.faultlens, "--help")
    assert helped.returncode == 0, helped.stderr
    assert all(word in helped.stdout for word in ("attribute", "decide", "ingest"))
    assert "8 GPU events" in attributed.ingest.stdout + attributed.ingest.stderr
    # Xid 48 (DBE) and Xid 79 (fallen off the bus): components from the packaged rules/xid.yaml
    assert {(i["class"], i["cause"]) for i in attributed.incidents} == {
        ("health", "hbm"),
        ("health", "pcie"),
    }
    assert all(i["culprit_nodes"] == ["gpu-node-07"] for i in attributed.incidents)

    decided = installed.run(installed.faultlens, "decide", "--store", attributed.store, "--json")
    assert decided.returncode == 0, decided.stderr
    decisions = json.loads(decided.stdout)
    assert [d["action"] for d in decisions] == ["drain", "drain"]
    # packaged policy.yaml
    assert all(d["reason"].startswith("critical GPU health event") for d in decisions)


def _override_dir(tmp_path: Path) -> Path:
    """A user's rules directory with its own policy.yaml only (health events escalate instead of
    draining).
    """
    directory = tmp_path / "site-rules"
    directory.mkdir()
    text = shipped_rule_file("policy.yaml").read_text()
    pattern = re.compile(r"(- id: health-drain\n\s+when: \{class: \[health\]\}\n\s+action: "
                         r")drain(\n\s+reason: ).*")
    assert pattern.search(text), "rules/policy.yaml's health-drain rule changed: update this test"
    (directory / "policy.yaml").write_text(
        pattern.sub(rf"\1escalate\2{OVERRIDE_REASON}", text, count=1)
    )
    return directory


def test_user_rules_directory_overrides_the_packaged_file(
    installed: Installed, attributed: Attributed, tmp_path: Path
) -> None:
    site_rules = _override_dir(tmp_path)
    flag_store, env_store = attributed.undecided_copies
    by_flag = installed.run(
        installed.faultlens, "decide", "--store", flag_store, "--json", "--rules", site_rules
    )
    by_env = installed.run(installed.faultlens, "decide", "--store", env_store, "--json",
                           env={RULES_ENV: str(site_rules)})
    for result in (by_flag, by_env):
        assert result.returncode == 0, result.stderr
        decisions = json.loads(result.stdout)
        assert [d["action"] for d in decisions] == ["escalate", "escalate"], decisions
        assert all(d["reason"].startswith(OVERRIDE_REASON) for d in decisions)


def test_rules_directory_falls_back_per_file_and_a_missing_one_is_named(
    tmp_path: Path, monkeypatch
) -> None:
    site_rules = _override_dir(tmp_path)
    monkeypatch.setenv(RULES_ENV, str(site_rules))
    assert rule_file("policy.yaml") == site_rules / "policy.yaml"
    # not in the directory: the packaged one
    assert rule_file("crash.yaml") == shipped_rule_file("crash.yaml")
    from faultlens.attribution.policy import load_policy

    assert load_policy().source == str(site_rules / "policy.yaml")
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv(RULES_ENV, str(missing))
    from faultlens.attribution.rules import RulesError, load_thresholds

    with pytest.raises(RulesError) as caught:  # never silently the shipped file
        load_thresholds()
    assert str(missing / "thresholds.yaml") in str(caught.value) and "\n" not in str(caught.value)


def _top_level_references(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in ROOMS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] if node.module.split(".")[0] in ROOMS else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = re.fullmatch(
                rf"(?:-m )?((?:{'|'.join(ROOMS)})(?:\.[A-Za-z_]\w*)+)(?::\w+)?", node.value
            )
            found += [match.group(1)] if match else []
    return found


def test_no_module_of_the_tree_names_a_room_at_top_level() -> None:
    """Every import and module string is faultlens.*: a top-level `collectors...` would import a
    second copy of the module in a checkout and fail in a wheel (after a merge: rerun the rewrite
    script)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "*.py"], capture_output=True, text=True
    )
    files = (
        [REPO_ROOT / n for n in listed.stdout.split()]
        if listed.returncode == 0
        else list(REPO_ROOT.rglob("*.py"))
    )
    offenders = []
    for path in files:
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [
            f"{path.relative_to(REPO_ROOT)}: {name}" for name in _top_level_references(tree)
        ]
    assert not offenders, offenders
