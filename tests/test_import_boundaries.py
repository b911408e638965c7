"""The one-way data flow of docs/architecture.md, checked on the source: collectors imports nothing
of attribution or controller; attribution imports only collectors' contracts (the store room, the
rule loader, the error base, the declared environment, and the few vocabularies other rooms share).
Read with ast from the files, so a lazy import inside a function counts too (a room named at top
level: tests/test_wheel.py).

Inside the rooms: no import circle (the module graph of faultlens has no strongly connected
component of more than one module), no module imports a private name of another, nothing outside the
lab imports the lab, the report and the demo import nothing of the CLI, and the package root imports
no room when it loads."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

#: the rooms and the package root: top-level directories installed as faultlens.<room> (setup.py),
#: and faultlens/ itself
ROOMS = ("collectors", "attribution", "controller", "faultlens")

# what attribution may import from collectors: the store contract (schema, layout, the sink
# incidents are written through), the rule-file loader and its models, the error base, the declared
# environment variables, and the vocabularies the node side defines and attribution reads (XID
# catalog, process-event sources, py-spy stacks)
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
            # `from package import module` names the module: record package.name (a class or
            # function name under a module is within that module)
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
    assert _imports(module) == [
        (2, "faultlens.controller.cli.main"),
        (3, "faultlens.attribution.engine"),
    ]
    assert _within("faultlens.controller.cli.main", ("faultlens.controller",))
    assert not _within("faultlens.collectors.environmental", ("faultlens.environment",))


# ------------------------------------------------------------------ the module graph of faultlens


@dataclass(frozen=True)
class ImportStatement:
    """One import statement of a faultlens module, its names made absolute."""

    line: int
    module: str  # `import module` / `from module import ...` (a relative import made absolute)
    names: tuple[str, ...]  # the names a `from` import takes; () for a plain `import`
    at_load: bool  # run when the module loads: False for a lazy import inside a function


def _module_name(root: Path, path: Path) -> str:
    """faultlens.<room>.<...> of a file under a room (faultlens/ is the package root itself)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[0] != "faultlens":
        parts.insert(0, "faultlens")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_files(root: Path) -> dict[str, Path]:
    return {_module_name(root, path): path
            for room in ROOMS for path in sorted((root / room).rglob("*.py"))}


@functools.cache
def _parsed(source: str, filename: str) -> ast.Module:
    """A file's tree, parsed once for all the checks below (keyed by its text: a file the checker's
    own tests rewrite is parsed again)."""
    return ast.parse(source, filename=filename)


def _statements(root: Path, path: Path) -> list[ImportStatement]:
    """Every import of a faultlens module in `path`, lazy ones included, relative ones made
    absolute."""
    name = _module_name(root, path)
    package = (name if path.name == "__init__.py" else name.rpartition(".")[0]).split(".")
    found: list[ImportStatement] = []

    def visit(node: ast.AST, at_load: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(ImportStatement(node.lineno, alias.name, (), at_load)
                         for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . import x, from ..y import z
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            names = tuple(alias.name for alias in node.names)
            found.append(ImportStatement(node.lineno, module, names, at_load))
        function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, at_load and not function)

    visit(_parsed(path.read_text(), str(path)), True)
    return [s for s in found if _within(s.module, ("faultlens",))]


def _target(module: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name lies in: its longest prefix that is a module of the tree."""
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or None


def _targets(statement: ImportStatement, modules: dict[str, Path]) -> set[str]:
    """The modules an import statement imports: `from package import module` names
    package.module when that is a module, else (a name defined in it) the module itself."""
    if not statement.names:
        return {t for t in [_target(statement.module, modules)] if t}
    found = set()
    for name in statement.names:
        submodule = f"{statement.module}.{name}"
        target = submodule if submodule in modules else _target(statement.module, modules)
        if target:
            found.add(target)
    return found


def _module_graph(root: Path) -> dict[str, set[str]]:
    """faultlens module -> the faultlens modules it imports (lazily or not), itself left out."""
    modules = _module_files(root)
    return {name: {t for s in _statements(root, path) for t in _targets(s, modules)} - {name}
            for name, path in modules.items()}


def _import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without
    recursion: a long import chain is no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    work: list[tuple[str, Iterator[str]]] = []  # the depth-first path, each with successors left

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(graph.get(node, ())))))

    for start in sorted(graph):
        if start in index:
            continue
        enter(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    enter(successor)
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:  # every successor seen: node is done
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:  # the root of a component: pop it
                    component = [stack.pop()]
                    while component[-1] != node:
                        component.append(stack.pop())
                    on_stack.difference_update(component)
                    if len(component) > 1:
                        circles.append(sorted(component))
    return sorted(circles)


def _private_imports(root: Path) -> list[str]:
    """`from faultlens.x import _name` (not a dunder) in a module other than faultlens.x."""
    bad = []
    for name, path in _module_files(root).items():
        for statement in _statements(root, path):
            private = [n for n in statement.names if n.startswith("_") and not n.startswith("__")]
            if private and statement.module != name:
                bad.append(f"{path.relative_to(root)}:{statement.line}: imports "
                           f"{', '.join(private)} from {statement.module}")
    return bad


def _importers(root: Path, imported: tuple[str, ...], *, within: tuple[str, ...] = ("faultlens",),
               outside: tuple[str, ...] = (), at_load_only: bool = False) -> list[str]:
    """The imports of anything under `imported` by the modules within `within` and not within
    `outside` (only those run when the module loads, with at_load_only)."""
    bad = []
    for name, path in _module_files(root).items():
        if not _within(name, within) or _within(name, outside):
            continue
        for statement in _statements(root, path):
            if at_load_only and not statement.at_load:
                continue
            named = [statement.module] if _within(statement.module, imported) else [
                f"{statement.module}.{n}" for n in statement.names
                if _within(f"{statement.module}.{n}", imported)]
            if named:
                bad.append(f"{path.relative_to(root)}:{statement.line}: imports {', '.join(named)}")
    return bad


#: the rooms, as modules (the package root is not one of them)
ROOM_MODULES = tuple(f"faultlens.{room}" for room in ROOMS if room != "faultlens")


def test_no_room_has_an_import_circle() -> None:
    """An import circle makes the order modules load in matter (a name not yet defined when the
    other module asks for it) and joins the modules in it into one: none of any length, lazy imports
    included."""
    assert [" <-> ".join(circle) for circle in _import_circles(_module_graph(REPO_ROOT))] == []


def test_no_module_imports_a_private_name_of_another() -> None:
    """A leading underscore says: used inside this module only. A name another module needs is
    public."""
    assert _private_imports(REPO_ROOT) == []


def test_nothing_outside_the_lab_imports_the_lab() -> None:
    """The lab (fault injection, the simulator, campaigns) is the top of controller: nothing ships
    on it. The CLI names the lab's command modules as strings (controller/cli/main.py
    COMMAND_MODULES) and imports them only when one of their commands runs."""
    lab = ("faultlens.controller.lab",)
    assert _importers(REPO_ROOT, lab, outside=lab) == []


def test_the_report_and_the_demo_import_nothing_of_the_cli() -> None:
    """The CLI shows the report and runs the demo, never the other way round."""
    assert _importers(REPO_ROOT, ("faultlens.controller.cli",),
                      within=("faultlens.controller.report", "faultlens.controller.demo")) == []


def test_the_package_root_imports_no_room_when_it_loads() -> None:
    """faultlens/ (environment, errors, resources) is what a training process imports: loading it
    must not load a room (a lazy import inside a function is allowed)."""
    assert _importers(REPO_ROOT, ROOM_MODULES, outside=ROOM_MODULES, at_load_only=True) == []


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_circle_check_sees_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    """The checker itself: a circle closed by a lazy `from package import module` is found, and one
    across rooms through a relative import; importing a name of a module that imports nothing back
    closes none."""
    for room in ROOMS:
        _write(tmp_path, f"{room}/__init__.py", "")
    _write(tmp_path, "controller/a.py", "from faultlens.controller.b import helper\n")
    _write(tmp_path, "controller/b.py", "def helper():\n    from faultlens.controller import a\n")
    _write(tmp_path, "controller/c.py", "from faultlens.controller.b import helper\n")
    _write(tmp_path, "controller/d.py", "from faultlens.controller import c\n")
    graph = _module_graph(tmp_path)
    assert graph["faultlens.controller.b"] == {"faultlens.controller.a"}
    assert graph["faultlens.controller.d"] == {"faultlens.controller.c"}
    assert _import_circles(graph) == [["faultlens.controller.a", "faultlens.controller.b"]]
    _write(tmp_path, "controller/b.py", "def helper():\n    return 1\n")
    assert _import_circles(_module_graph(tmp_path)) == []
    _write(tmp_path, "collectors/x.py", "import faultlens.attribution.y\n")
    _write(tmp_path, "attribution/y.py", "from faultlens.attribution import z\n")
    _write(tmp_path, "attribution/z.py",
           "from .. import collectors\nfrom ..collectors.x import f\n")
    graph = _module_graph(tmp_path)
    assert graph["faultlens.attribution.z"] == {"faultlens.collectors", "faultlens.collectors.x"}
    assert _import_circles(graph) == [
        ["faultlens.attribution.y", "faultlens.attribution.z", "faultlens.collectors.x"]]


def test_the_private_import_check_sees_a_private_name(tmp_path: Path) -> None:
    """The checker itself: a private name from another module is found, lazily imported too; a
    dunder is not, nor a module's own name."""
    _write(tmp_path, "attribution/__init__.py",
           "from faultlens.attribution import _x\n_x = 1\n")
    _write(tmp_path, "attribution/m.py", "_cache = {}\n__version__ = '1'\n")
    _write(tmp_path, "attribution/n.py", "from faultlens.attribution.m import __version__\n"
           "def f():\n    from faultlens.attribution.m import _cache\n")
    assert _private_imports(tmp_path) == [
        "attribution/n.py:3: imports _cache from faultlens.attribution.m"]


def test_the_importer_checks_see_the_lab_the_cli_and_a_room_loaded_by_the_root(
        tmp_path: Path) -> None:
    """The checker itself: the lab imported from outside it, the CLI from the report, and a room
    loaded with the package root are found; the lab importing itself, the lab named in a string and
    a lazy import in the root are not."""
    _write(tmp_path, "controller/lab/__init__.py", "")
    _write(tmp_path, "controller/lab/inject.py", "from faultlens.controller.lab import plan\n")
    _write(tmp_path, "controller/lab/plan.py", "")
    _write(tmp_path, "controller/cli/main.py", "LAB = 'faultlens.controller.lab.commands'\n")
    _write(tmp_path, "controller/report/html.py",
           "def f():\n    import faultlens.controller.cli\n")
    _write(tmp_path, "controller/restore.py", "from faultlens.controller import lab, cli\n")
    _write(tmp_path, "faultlens/__init__.py", "def f():\n    import faultlens.controller\n")
    _write(tmp_path, "faultlens/errors.py", "from faultlens.collectors.store import schema\n")
    lab = ("faultlens.controller.lab",)
    assert _importers(tmp_path, lab, outside=lab) == [
        "controller/restore.py:1: imports faultlens.controller.lab"]
    assert _importers(tmp_path, ("faultlens.controller.cli",),
                      within=("faultlens.controller.report",)) == [
        "controller/report/html.py:2: imports faultlens.controller.cli"]
    assert _importers(tmp_path, ROOM_MODULES, outside=ROOM_MODULES, at_load_only=True) == [
        "faultlens/errors.py:1: imports faultlens.collectors.store"]
