"""The engine stands alone: it imports no model class, no front and no tool; and no module of the package
imports itself back through others (the import graph has no cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import hf_packed_ss

PACKAGE = Path(hf_packed_ss.__file__).parent
ENGINE = PACKAGE / "engine"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(relative level, module) of every import in a file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def test_the_engine_imports_no_model_front_or_tool():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) >= 10
    for path in files:
        depth = len(path.relative_to(ENGINE).parts) - 1  # 0 for engine/x.py, 1 for engine/layouts/x.py
        for level, module in _imports(path):
            if level:
                assert level <= depth + 1, (path, level, module)  # stays inside engine/
            else:
                top = module.split(".")[0]
                assert top != "hf_packed_ss", (path, module)
                assert not module.startswith("transformers.models"), (path, module)  # no model class


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports, read statically from every import statement (those inside
    functions too): relative imports resolved, and ``from pkg import name`` an import of the submodule
    ``pkg.name`` where there is one (of ``pkg`` itself for the names that are not submodules)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, node.module] if node.module else parts)
                else:
                    base = node.module or ""
                if base not in modules:
                    continue
                subs = {f"{base}.{alias.name}" for alias in node.names} & modules.keys()
                edges |= subs
                if len(subs) < len(node.names):
                    edges.add(base)
        # importing a submodule first runs its packages' ``__init__``s (those above the importer already run)
        edges |= {parent for edge in edges for parent in _parents(edge)
                  if parent in modules and parent not in _parents(name) and parent != package}
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle through the component's first module (a shortest path back to it, breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return sorted(component)


def test_the_import_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert len(graph) >= 60
    assert "hf_packed_ss.engine.batch_cache" in graph["hf_packed_ss.engine.lockstep"]  # from .batch_cache import
    assert "hf_packed_ss.engine.lockstep" in graph["hf_packed_ss.engine.batch"]  # from . import lockstep
    assert "hf_packed_ss.tools.loading" in graph["hf_packed_ss.tools.bench.probe"]  # from ..loading, in a function
    assert "hf_packed_ss.models.smollm2" in graph["hf_packed_ss.bundled"]  # from ..models import smollm2
    assert "hf_packed_ss.tools.bench" in graph["hf_packed_ss.tools.loading"]  # runs bench/__init__.py first
    cycle = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_cycles(cycle) == [["a", "b", "c", "a"]]


def test_the_package_has_no_import_cycles():
    assert import_cycles(import_graph()) == []


if __name__ == "__main__":  # python tests/test_architecture.py: print the cycles, if any
    for found in import_cycles(import_graph()):
        print(" -> ".join(found))
