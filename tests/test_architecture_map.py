"""docs/architecture.md is the map of the house: every module under halo_sched/ is named there
(its own row, or a folder's row naming the file), so a module added without a word on what it
holds fails here."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _unnamed(doc: str, modules: list[str]) -> list[str]:
    rows = [line for line in doc.splitlines() if line.startswith("|")]
    firsts = [r.split("|")[1] for r in rows]
    missing = []
    for m in modules:
        if any(f"`{m}`" in first for first in firsts):  # its own row
            continue
        parts = m.split("/")
        # A folder's row (`backends/slurm/`) naming the file by the rest of its path.
        for i in range(1, len(parts)):
            folder, rest = "/".join(parts[:i]) + "/", parts[i:]
            named_rows = [r for r in rows if f"`{folder}`" in r.split("|")[1]]
            if any(all(f"`{p}/`" in r for p in rest[:-1]) and f"`{rest[-1]}`" in r for r in named_rows):
                break
        else:
            missing.append(m)
    return missing


def test_every_module_is_on_the_map():
    doc = (REPO / "docs" / "architecture.md").read_text()
    modules = sorted(str(p.relative_to(REPO / "halo_sched")) for p in (REPO / "halo_sched").rglob("*.py"))
    assert len(modules) > 50
    # The node runtime's shell files too: carried as the modules are (halo_sched/node/CARRIED).
    modules += sorted(str(p.relative_to(REPO / "halo_sched")) for p in (REPO / "halo_sched" / "node").glob("*.sh"))
    assert _unnamed(doc, modules) == []


def test_the_map_check_can_fail():
    doc = "| `backends/slurm/` | `render.py`, `transport/` (`cli.py`) |\n| `core.py` | x |\n"
    assert _unnamed(doc, ["core.py", "backends/slurm/render.py", "backends/slurm/transport/cli.py"]) == []
    assert _unnamed(doc, ["cli.py", "backends/slurm/status.py", "backends/nomad/render.py"]) == [
        "cli.py", "backends/slurm/status.py", "backends/nomad/render.py"]
