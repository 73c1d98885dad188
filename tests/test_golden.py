"""Golden files pin every rendered example. After an intended change, regenerate them with
``HALO_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and review the diff."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

import halo_sched
from helpers import REPO

GOLDEN = REPO / "tests" / "golden"
CASES = [
    ("ddp-cpu.yaml", "local", {}, "ddp-cpu.local.txt"),
    ("ddp-cpu.yaml", "slurm", {}, "ddp-cpu.sbatch"),
    ("ddp-gpu.yaml", "slurm", {}, "ddp-gpu.sbatch"),
    ("nomad-gpu.yaml", "nomad", {"format": "hcl"}, "nomad-gpu.nomad.hcl"),
    ("nomad-gpu.yaml", "nomad", {"format": "json"}, "nomad-gpu.nomad.json"),
    ("nomad-gpu.yaml", "slurm", {}, "nomad-gpu.sbatch"),
    ("rl-servers.yaml", "local", {}, "rl-servers.local.txt"),
    ("rl-servers.yaml", "slurm", {}, "rl-servers.sbatch"),
    ("rl-servers.yaml", "nomad", {"format": "hcl"}, "rl-servers.nomad.hcl"),
    ("rl-servers.yaml", "nomad", {"format": "json"}, "rl-servers.nomad.json"),
]


@pytest.mark.parametrize("example, backend, opts, golden", CASES, ids=[c[3] for c in CASES])
def test_rendered_example_matches_golden(example, backend, opts, golden):
    text = halo_sched.render(halo_sched.load(REPO / "examples" / example), backend, **opts)
    path = GOLDEN / golden
    if os.environ.get("HALO_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with HALO_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{golden} changed; if intended, regenerate with HALO_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("golden", [c[3] for c in CASES if c[3].endswith(".sbatch")])
def test_sbatch_goldens_pass_bash_n(golden):
    r = subprocess.run(["bash", "-n", str(GOLDEN / golden)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cli_render_matches_api(tmp_path):
    r = subprocess.run(["halo-sched", "render", "examples/nomad-gpu.yaml", "--backend", "nomad", "--format", "json"],
                       cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{os.path.dirname(os.sys.executable)}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads((GOLDEN / "nomad-gpu.nomad.json").read_text())
