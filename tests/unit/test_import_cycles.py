"""The package's import graph has no cycle: no module needs, to run, one that needs it back.

The scan parses each module of ``sa_jobqueue`` (no import) and follows its imports of the
package: those at module level and those inside functions alike, since a lazy import still
ties the two modules together when it runs (it only hides the knot from import time). An
import under ``if TYPE_CHECKING:`` is for mypy only and does not count. Importing
``a.b.c`` runs the ``__init__`` of ``a.b`` too, unless the importer lives inside it (a package
is already importing when one of its own modules runs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sa_jobqueue"


def _modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``body``, nested ones included, but those for mypy only."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node):
            yield from _imports(node.orelse)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _imports([child])
                elif isinstance(child, ast.excepthandler):
                    yield from _imports(child.body)


def _runs(name: str, target: str, explicit: bool, modules: dict[str, Path]) -> set[str]:
    """What module ``name`` runs by importing ``target`` (a module, or a name in one).

    ``explicit``: ``target`` itself is wanted (its attribute), not only a submodule of it.
    """
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]  # an attribute of a module
    if target not in modules:
        return set()
    parts = name.split(".")
    ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
    steps = target.split(".")
    parents = {".".join(steps[:i]) for i in range(1, len(steps))}
    runs = parents - ancestors
    if explicit or target not in ancestors:
        runs.add(target)
    return runs - {name}


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of the package that importing it (or calling it) runs."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges |= _runs(name, alias.name, True, modules)
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE.name:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    # ``from . import x`` needs the package only as far as it is importing.
                    edges |= _runs(name, submodule, True, modules)
                    edges |= _runs(name, source, False, modules)
                else:
                    edges |= _runs(name, source, True, modules)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _describe(cycle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(cycle)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in cycle)


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + " | ".join(_describe(c, graph) for c in cycles)


def test_the_scan_sees_a_cycle() -> None:
    """The search itself: a knot of three modules and a tail is found, and only the knot."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_scan_reads_the_package() -> None:
    """The graph holds edges the package is known to have (a scan that finds none passes)."""
    graph = _graph()
    assert "sa_jobqueue.cli._arguments" in graph["sa_jobqueue.cli"]
    assert "sa_jobqueue.web._app" in graph["sa_jobqueue.web"]
    assert "sa_jobqueue.ops" in graph["sa_jobqueue.cli._stats"]


def test_web_does_not_import_the_cli() -> None:
    """The dashboard stands on ``ops`` and ``_sql``, never on the command line's modules."""
    graph = _graph()
    leaks = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("sa_jobqueue.web")
        for target in targets
        if target.startswith("sa_jobqueue.cli")
    )
    assert not leaks
