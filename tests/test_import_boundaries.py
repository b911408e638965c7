"""The one-way data flow of docs/architecture.md, checked on the source: collectors imports nothing of attribution
or controller; attribution imports only collectors' contracts (the store room, the rule loader, the error base,
the declared environment, and the few vocabularies other rooms share). Read with ast from the files, so a lazy
import inside a function counts too (a room named at top level: tests/test_wheel.py)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# what attribution may import from collectors: the store contract (schema, layout, the sink incidents are written
# through), the rule-file loader and its models, the error base, the declared environment variables, and the
# vocabularies the node side defines and attribution reads (XID catalog, process-event sources, py-spy stacks)
ATTRIBUTION_MAY_IMPORT = (
    "faultlens.collectors.store",
    "faultlens.collectors.rule_loader",
    "faultlens.collectors.rule_model",
    "faultlens.errors",
    "faultlens.environment",
    "faultlens.collectors.sources.xid_catalog",
    "faultlens.collectors.sources.process_events",
    "faultlens.collectors.sources.pystack",
)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` names the module: record package.name (a class or function name
            # under a module is within that module)
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(room: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    bad = []
    for path in sorted((REPO_ROOT / room).rglob("*.py")):
        for line, module in _imports(path):
            if _within(module, forbidden) and not _within(module, allowed):
                bad.append(f"{path.relative_to(REPO_ROOT)}:{line}: imports {module}")
    return bad


def test_collectors_import_nothing_of_attribution_or_controller() -> None:
    assert _violations("collectors", ("faultlens.attribution", "faultlens.controller")) == []


def test_attribution_imports_only_the_contracts_of_collectors_and_nothing_of_controller() -> None:
    assert _violations("attribution", ("faultlens.collectors", "faultlens.controller"),
                       ATTRIBUTION_MAY_IMPORT) == []


def test_the_boundary_check_sees_a_violation(tmp_path: Path) -> None:
    """The checker itself: a lazy import inside a function is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from faultlens.controller.cli import main\n"
                      "    import faultlens.attribution.engine\n")
    assert _imports(module) == [(2, "faultlens.controller.cli.main"), (3, "faultlens.attribution.engine")]
    assert _within("faultlens.controller.cli.main", ("faultlens.controller",))
    assert not _within("faultlens.collectors.environmental", ("faultlens.environment",))
