"""The import graph of halo_sched has no cycle.

Every import counts: at module level, inside functions and under ``if TYPE_CHECKING:`` alike (an
import inside a function hides a cycle from Python's start-up, and a type-only one from the
interpreter, not from a reader: base.py -> known.py -> base.py for a type was one). The package
``__init__`` Python runs before a submodule is left out (a package importing its own modules is
no cycle). tests/test_layers.py checks the same graph against the layers. A cycle is reported as the chain of modules that closes it.
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


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth (functions, classes, ``if TYPE_CHECKING:``)."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


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
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import y\n")
    (pkg / "d.py").write_text("def f():\n    from . import c\n")
    g = graph(pkg)
    assert g["pkg.a"] == {"pkg.b"} and g["pkg.b"] == {"pkg.a"} and g["pkg.c"] == {"pkg.d"}
    # A cycle closed by a type-only import is a cycle too.
    assert cycles(g) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.c", "pkg.d", "pkg.c"]]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


# ---- no unused public function ----------------------------------------------------------------

#: Public methods a pipeline calls that nothing inside halo_sched calls (docs/library.md).
LIBRARY_SURFACE = {"Job.result_async"}


def unused_public(root: Path = PACKAGE) -> list[str]:
    """Each public function, class or method (``name``, ``Class.name``) whose name occurs in no
    other place of the package's source, templates or pyproject.toml than its definition and
    ``__all__``: code only tests call is not the product's. ``cmd_*`` run by name (cli.COMMANDS)."""
    import re
    from collections import Counter

    sources = {p: p.read_text() for p in sorted(root.rglob("*.py"))}
    rest = "".join(p.read_text() for p in sorted(root.rglob("*.j2")) + sorted(root.rglob("*.sh")))
    pyproject = root.parent / "pyproject.toml"
    rest += pyproject.read_text() if pyproject.is_file() else ""
    text = "".join(re.sub(r"__all__\s*=\s*\[[^\]]*\]", "", s) for s in sources.values()) + rest
    words = Counter(re.findall(r"\w+", text))
    out = []
    for path, src in sources.items():
        tree = ast.parse(src, str(path))
        for node in tree.body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
            if isinstance(node, ast.ClassDef):
                names += [f"{node.name}.{m.name}" for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            for qual in names:
                name = qual.rpartition(".")[2]
                if name.startswith("_") or name.startswith("cmd_") or qual in LIBRARY_SURFACE:
                    continue
                if words[name] <= 1:  # its definition alone
                    out.append(f"{path.relative_to(root.parent).as_posix()}: {qual}")
    return out


def test_no_unused_public_function():
    assert unused_public() == []


def test_the_unused_check_can_fail(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import used\n")
    (pkg / "a.py").write_text("def used():\n    pass\n\n\ndef only_tests():\n    pass\n\n\ndef _private():\n    pass\n\n\n"
                              "class C:\n    def spoken(self):\n        pass\n\n    def silent(self):\n        pass\n\n\n"
                              "__all__ = ['only_tests', 'used']\n")
    (pkg / "b.py").write_text("def f(c):\n    return c.spoken()\n")
    assert unused_public(pkg) == ["pkg/a.py: only_tests", "pkg/a.py: C", "pkg/a.py: C.silent", "pkg/b.py: f"]
