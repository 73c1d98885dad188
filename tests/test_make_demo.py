"""`make demo` runs what the README shows. The command comes from the Makefile's own demo recipe
(with $(BIN) the virtual environment this test runs in), so the test and the target cannot drift
apart: a changed recipe is what gets run here. The demo is the tour's `submit --wait`: the rest of
the README's tour that needs its jobs (status, logs, a submit that is cancelled, list) runs after
it as bench/tour.py runs it, and each line the README shows is found in what it printed."""
from __future__ import annotations

import importlib.util
import os
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
    # The rest of the tour, on this job: bench/tour.py's commands, the README's lines.
    tour = _tour()
    submitted = tour.Step(tour.SUBMIT, r.stderr.splitlines() + r.stdout.splitlines(), 0, 0)
    result = tour.run_tour(tour.tour_env(os.environ["HALO_SCHED_HOME"]), submitted, only=("submit", "ask", "cancel"))
    assert tour.output_problems(result) == []
    assert result["cancel"][-1].output[0].endswith("CANCELLED reason=cancelled by user"), result["cancel"][-1].output


def _tour():
    spec = importlib.util.spec_from_file_location("bench_tour", REPO / "bench" / "tour.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
