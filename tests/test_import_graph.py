"""mdtrain's modules import one way: no circle, counting imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import mdtrain

# The package as installed: the checkout under an editable install, the wheel's copy in
# the matrix legs (whose source copy leaves mdtrain/ out).
PACKAGE = Path(mdtrain.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path, modules: set[str]) -> set[str]:
    """The mdtrain modules `path` imports anywhere in its code (a function's body too)."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
            # `from mdtrain import lite0` imports the module mdtrain.lite0
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    return imported & modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the mdtrain modules it imports, for every module of the package."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports_of(path, modules) - {name} for name, path in paths.items()}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (`[a, b, a]`), or None: a depth-first search for a back edge."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return [*path[path.index(imported) :], imported]
            if imported not in state and (circle := visit(imported)):
                return circle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module)):
            return circle
    return None


def test_no_import_circle_among_mdtrain_modules():
    graph = import_graph()
    assert "mdtrain.lite0" in graph and "mdtrain.models" in graph["mdtrain.training"]
    circle = find_circle(graph)
    assert circle is None, " -> ".join(circle)


def test_a_circle_is_found_where_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None
