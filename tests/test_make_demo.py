"""`make demo` runs what the README shows. The command comes from the Makefile's own demo recipe
(with $(BIN) the virtual environment this test runs in), so the test and the target cannot drift
apart: a changed recipe is what gets run here."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.torch


def demo_recipe() -> list[str]:
    """The demo target's recipe lines, as written in the Makefile."""
    text = (REPO / "Makefile").read_text()
    m = re.search(r"^demo:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert m, "no demo target with a recipe in the Makefile"
    return [line[1:] for line in m.group(1).splitlines()]


def demo_command() -> str:
    (line,) = demo_recipe()
    command = line.replace("$(BIN)", str(Path(sys.executable).parent))
    # Any other make variable would mean the recipe changed shape: say so rather than guess it.
    assert "$(" not in command and "${" not in command, f"demo recipe uses a variable this test does not know: {line}"
    return command


def test_the_recipe_is_the_readme_command():
    assert demo_recipe() == ["$(BIN)/halo-sched submit examples/ddp-cpu.yaml --backend local --wait"]


def test_make_demo_trains_across_two_nodes():
    command = demo_command()
    # The demo's rendezvous port is the example's fixed 29500: another run on this machine may
    # hold it for a while (then halo-sched refuses at once, naming it); wait for it, bounded.
    deadline = time.monotonic() + 300
    while True:
        r = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=300)
        if not (r.returncode == 1 and "rendezvous.port" in r.stderr and "in use" in r.stderr):
            break
        assert time.monotonic() < deadline, r.stderr
        time.sleep(5)
    assert r.returncode == 0, r.stderr[-3000:]
    # The README's lines: rank 0's check, then the final state and the job id alone on stdout.
    assert re.search(r"^\[node 0\] \[rank 0\] world: 4 ranks on 2 nodes \(node ranks \[0, 1\]\); all_reduce sum 6 "
                     r"\(expected 6\); replicas in sync: True; final loss [0-9.]+; OK$", r.stderr, re.M), r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"ddp-cpu-\d{8}-\d{6}-[0-9a-f]{6}", job_id), r.stdout
    assert f"halo-sched: {job_id} COMPLETED exit=0" in r.stderr
