"""halo_sched/node holds what runs on the nodes (or beside them: the local supervisor), where
halo-sched need not be installed and only the node's Python is: its modules import the standard
library and each other, nothing else (halo_sched/node/__init__.py)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys

from helpers import REPO

NODE = REPO / "halo_sched" / "node"
# Imports outside the rule, each inside a function only: the bandwidth test runs where torchrun
# runs, so torch is there, and it imports torch in main() so that halo-sched can read its constants.
FUNCTION_LEVEL_ALLOWED = {"trainers/preflight_bw.py": {"torch"}}


def _module_name(path, repo=REPO) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, repo=REPO):
    """(line, imported module, at module level?) for every import statement of ``path``, at any
    depth: module level, in functions, in classes, under ``if``/``try``."""
    tree = ast.parse(path.read_text(), str(path))
    name = _module_name(path, repo)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            yield node.lineno, name, id(node) in top


def _layer_violations(repo=REPO) -> list[str]:
    root = repo / "halo_sched" / "node"
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for line, name, top_level in sorted(_imports(path, repo)):
            first = name.split(".")[0]
            if first in sys.stdlib_module_names or first == "__future__":
                continue
            if name == "halo_sched.node" or name.startswith("halo_sched.node."):
                continue
            if not top_level and first in FUNCTION_LEVEL_ALLOWED.get(rel, ()):
                continue
            out.append(f"halo_sched/node/{rel}:{line} imports {name}")
    return out


def test_node_modules_import_only_the_standard_library_and_each_other():
    assert list(NODE.rglob("*.py")), "no modules found under halo_sched/node"
    assert _layer_violations() == []


def test_the_check_sees_imports_at_every_depth_and_resolves_relative_ones(tmp_path):
    """The rule's own check: a forbidden import inside a function, a relative import that climbs
    out of the package, and one of the submitter's modules are each reported."""
    fake = tmp_path / "halo_sched" / "node"
    (fake / "sub").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "sub" / "__init__.py").write_text("from .. import processes\n")
    (fake / "sub" / "mod.py").write_text(
        "import json\nfrom ..failures import x\n"
        "def f():\n    import yaml\n"
        "class C:\n    def g(self):\n        from ...spec import JobSpec\n"
        "try:\n    from halo_sched.records import home\nexcept ImportError:\n    pass\n")
    assert _layer_violations(tmp_path) == [
        "halo_sched/node/sub/mod.py:4 imports yaml",
        "halo_sched/node/sub/mod.py:7 imports halo_sched.spec",
        "halo_sched/node/sub/mod.py:9 imports halo_sched.records",
    ]


def test_importing_every_node_module_loads_nothing_else():
    """At run time too: ``halo_sched/__init__.py`` stays lazy, so importing ``halo_sched.node.*``
    loads no third-party module and none of the submitter's side."""
    names = sorted(_module_name(p) for p in NODE.rglob("*.py"))
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    foreign = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
               and m not in ("halo_sched", "halo_sched.node") and not m.startswith("halo_sched.node.")
               and m.split(".")[0] not in ("__main__", "_distutils_hack", "sitecustomize", "usercustomize")
               and not m.startswith("_sysconfigdata_")]
    assert foreign == []


# ---- the command line: halo_sched/cli.py parses and dispatches; halo_sched/commands/ holds the
# commands, and its __init__.py what both write to the terminal ----------------------------------

PKG = REPO / "halo_sched"


def _imported(path, repo=REPO):
    """(line, module) for each import of ``path``, and for ``from X import y`` also ``X.y`` (it
    may be a module: ``from .. import cli``)."""
    found = set()
    for line, name, _ in _imports(path, repo):
        found.add((line, name))
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = {n for ln, n in found if ln == node.lineno}
            found |= {(node.lineno, f"{b}.{a.name}") for b in base for a in node.names}
    return found


def _cli_layer_violations(repo=REPO) -> list[str]:
    pkg = repo / "halo_sched"
    shared = pkg / "commands" / "__init__.py"
    out = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(repo).as_posix()
        in_commands = path.is_relative_to(pkg / "commands")
        for line, name in sorted(_imported(path, repo)):
            if name == "halo_sched.cli" and in_commands:
                out.append(f"{rel}:{line} imports halo_sched.cli (it runs the commands, not the other way)")
            if (name == "halo_sched.commands" or name.startswith("halo_sched.commands.")) and not in_commands \
                    and path != pkg / "cli.py":
                out.append(f"{rel}:{line} imports {name} (only the command line runs commands)")
            if path == shared and name.split(".")[0] not in sys.stdlib_module_names | {"__future__"}:
                out.append(f"{rel}:{line} imports {name} (it is on every command's start-up path)")
    return out


def test_the_command_line_layers():
    """The library never imports the commands (halo_sched/commands/ is the CLI's); the commands
    never import halo_sched.cli (which imports them); halo_sched/commands/__init__.py, loaded at
    every start-up, imports only the standard library."""
    assert (PKG / "commands" / "__init__.py").is_file()
    assert _cli_layer_violations() == []


def test_the_command_line_layer_check_reports_each_kind(tmp_path):
    pkg = tmp_path / "halo_sched"
    (pkg / "commands").mkdir(parents=True)
    for rel in ("__init__.py", "cli.py"):
        (pkg / rel).write_text("")
    (pkg / "commands" / "__init__.py").write_text("import sys\nimport yaml\n")
    (pkg / "commands" / "x.py").write_text("def f():\n    from .. import cli\n")
    (pkg / "core.py").write_text("from .commands import show\n")
    assert _cli_layer_violations(tmp_path) == [
        "halo_sched/commands/__init__.py:2 imports yaml (it is on every command's start-up path)",
        "halo_sched/commands/x.py:2 imports halo_sched.cli (it runs the commands, not the other way)",
        "halo_sched/core.py:1 imports halo_sched.commands (only the command line runs commands)",
        "halo_sched/core.py:1 imports halo_sched.commands.show (only the command line runs commands)",
    ]


def test_each_command_is_found_and_start_up_imports_none():
    """Every line of cli.COMMANDS names a function of halo_sched/commands/; importing the CLI loads
    none of the command modules (each is imported when its command runs)."""
    code = (
        "import json, sys\nfrom halo_sched import cli\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('halo_sched.commands.'))\n"
        "found = {name: callable(cli._command(name)) for name in cli.COMMANDS}\n"
        "print(json.dumps([loaded, found]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded, found = json.loads(r.stdout)
    assert loaded == []
    assert found and all(found.values()), found


# ---- the submitter's side in layers: each imports only its own layer and the ones below ---------

#: Lowest first; a module imports from its own layer and those below it, never from above, at
#: any depth (a function's import, one under ``if TYPE_CHECKING:``). ``X.*``: every module under
#: X; an exact name wins over a folder's. ``""`` is the package itself (``halo_sched/__init__.py``,
#: the library's surface). docs/architecture.md draws the same table.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("node", ("node", "node.*")),
    ("foundations", ("errors", "values", "logtags", "store", "db", "retry", "outage", "exactly_once",
                     "templating", "layout", "node_runtime", "sbatch_options")),
    ("job file", ("jobfile_rules", "models", "spec")),
    ("launch plan", ("launch", "servers")),
    ("history", ("jobstate", "records", "ledger", "notify")),
    ("backends", ("backends", "backends.*", "known", "outcome")),
    ("runs and the commands' core", ("core", "runs", "ettr", "keeper", "timeline", "preflight")),
    ("surface", ("", "cli", "commands", "commands.*")),
)


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index of ``module``'s layer (a dotted name under halo_sched); None when unplaced."""
    name = module.removeprefix("halo_sched").removeprefix(".")
    best: tuple[int, int] | None = None  # (specificity, layer)
    for i, (_, names) in enumerate(layers):
        for n in names:
            if n == name:
                return i
            if n.endswith(".*") and name.startswith(n[:-1]):
                if best is None or len(n) > best[0]:
                    best = (len(n), i)
    return best[1] if best else None


def _upward_imports(root=PKG, layers=LAYERS) -> list[str]:
    from test_imports import graph

    g = graph(root)
    out = [f"{m} is in no layer (tests/test_layers.py LAYERS, docs/architecture.md)" for m in sorted(g)
           if layer_of(m, layers) is None]
    for m in sorted(g):
        low = layer_of(m, layers)
        for target in sorted(g[m]):
            high = layer_of(target, layers)
            if low is not None and high is not None and high > low:
                out.append(f"{m} ({layers[low][0]}) imports {target} ({layers[high][0]})")
    return out


def test_no_module_imports_from_a_higher_layer():
    assert _upward_imports() == []


def test_the_layer_check_sees_every_import_and_every_module(tmp_path):
    """The check's own test: an import inside a function (launch.py reading the ledger, as it
    once did), a type-only one, and a module no layer names are each reported."""
    pkg = tmp_path / "halo_sched"
    (pkg / "backends").mkdir(parents=True)
    for rel in ("__init__.py", "backends/__init__.py", "backends/base.py", "errors.py", "ledger.py"):
        (pkg / rel).write_text("")
    (pkg / "launch.py").write_text("from .errors import E\ndef f():\n    from . import ledger\n")
    (pkg / "records.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .backends.base import Scheduler\n")
    (pkg / "extra.py").write_text("")
    assert _upward_imports(pkg) == [
        "halo_sched.extra is in no layer (tests/test_layers.py LAYERS, docs/architecture.md)",
        "halo_sched.launch (launch plan) imports halo_sched.ledger (history)",
        "halo_sched.records (history) imports halo_sched.backends.base (backends)",
    ]
    assert layer_of("halo_sched.jobstate") == 4 and layer_of("halo_sched.backends.slurm.render") == 5
    assert layer_of("halo_sched") == 7 and layer_of("halo_sched.node.trainers.preflight_bw") == 0


def test_the_map_draws_the_same_layers():
    """docs/architecture.md's layer table names the layers of LAYERS, in their order."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    start = doc.index("| layer (lowest first) | modules |")
    rows = [ln.split("|")[1].strip() for ln in doc[start:].splitlines()[2:] if ln.startswith("|")]
    rows = rows[:next((i for i, r in enumerate(rows) if not r), len(rows))]
    assert rows[:len(LAYERS)] == [name for name, _ in LAYERS]
