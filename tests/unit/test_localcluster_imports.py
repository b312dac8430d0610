"""rig/localcluster's modules import one another without a circle.

Every import a module runs counts, the ones inside functions included (a function-local
import only delays a circle, it does not remove one). Imports under ``if TYPE_CHECKING:``
never run and do not count: they name ``LocalCluster`` in the signatures of the parts it
starts. What the parts share sits in modules below them (``errors.py``, ``crds.py``,
``demostage.py``), so that the graph is layered.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "rig.localcluster"
FOLDER = Path(__file__).resolve().parents[2] / "rig" / "localcluster"
INIT = "__init__"


def _modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in FOLDER.glob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: Iterable[ast.AST]) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in ``nodes`` that can run, at any depth."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node):
            found.extend(_imports(node.orelse))
        else:
            found.extend(_imports(ast.iter_child_nodes(node)))
    return found


def _targets(statement: ast.Import | ast.ImportFrom, names: set[str]) -> set[str]:
    """The package's modules that ``statement`` imports (``__init__`` for the package)."""
    targets: set[str] = set()
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.name == PACKAGE:
                targets.add(INIT)
            elif alias.name.startswith(PACKAGE + "."):
                targets.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
        return targets
    if statement.level > 1:
        return targets
    module = statement.module or ""
    if statement.level == 1:
        module = f"{PACKAGE}.{module}" if module else PACKAGE
    if module == PACKAGE:
        for alias in statement.names:
            # A submodule by name (``from rig.localcluster import demo``), else a name
            # the package's __init__ exports.
            targets.add(alias.name if alias.name in names else INIT)
    elif module.startswith(PACKAGE + "."):
        targets.add(module.removeprefix(PACKAGE + ".").split(".")[0])
    return targets


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports (itself left out)."""
    modules = _modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        edges: set[str] = set()
        for statement in _imports([tree]):
            edges |= _targets(statement, names)
        graph[name] = (edges & names) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each module that is on one (depth-first search)."""
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_the_graph_reader_sees_function_local_imports_and_skips_type_checking_ones() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from rig.localcluster.binaries import cache_dir\n"
        "if TYPE_CHECKING:\n"
        "    from rig.localcluster.cluster import LocalCluster\n"
        "def f():\n"
        "    from rig.localcluster import demo, LocalCluster\n"
        "    import rig.localcluster.nodes\n"
        "class C:\n"
        "    def g(self):\n"
        "        from .ports import free_port\n"
    )
    names = {"binaries", "cluster", "demo", "nodes", "ports"}
    found = set().union(*(_targets(s, names) for s in _imports([tree])))
    assert found == {"binaries", "demo", INIT, "nodes", "ports"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_rig_localcluster_imports_no_circle() -> None:
    graph = import_graph()
    # The modules that were on circles are read, so the test sees them.
    assert {"cluster", "controllers", "nodes", "realnode", "demo", "demo_lostnode"} <= set(graph)
    assert circles(graph) == [], graph


def test_the_parts_cluster_starts_do_not_import_it_when_they_run() -> None:
    graph = import_graph()
    for part in ("controllers", "nodes", "realnode", "reaper"):
        assert "cluster" not in graph[part] and INIT not in graph[part], (part, graph[part])
    assert "demo" not in graph["demo_lostnode"]
