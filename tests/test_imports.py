"""The import graph of halo_sched has no cycle.

Every import counts: at module level and inside functions alike (an import inside a function hides
a cycle from Python's start-up, not from a reader). Imports under ``if TYPE_CHECKING:`` never run
and are left out, and so is the package ``__init__`` Python runs before a submodule (a package
importing its own modules is no cycle). A cycle is reported as the chain of modules that closes it.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "halo_sched"


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def edges(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from pkg import sub` imports the submodule; `from mod import name` the module.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out |= {t for t in targets if t in known and t != name}
    return out


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(root)
    return {name: edges(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One closing chain per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(_chain(g, set(comp)))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def _chain(g: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(g[v] & comp):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(comp)


def test_the_graph_sees_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n")
    g = graph(pkg)
    assert g["pkg.a"] == {"pkg.b"} and g["pkg.b"] == {"pkg.a"} and g["pkg.c"] == set()
    assert cycles(g) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)
