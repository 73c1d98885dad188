"""Golden files pin every rendered example. After an intended change, regenerate them with
``HALO_UPDATE_GOLDEN=1 pytest tests/test_golden.py``, review the diff, commit, and run again
without it: a run that regenerates writes the files and FAILS, so it can never pass a change
unseen."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest

import halo_sched
from halo_sched.spec import load, with_changes
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
    # The preflight gate with a bandwidth floor: the one rendering that min_busbw changes.
    ("ddp-gpu.yaml+gate", "slurm", {}, "ddp-gpu-gate-busbw.sbatch"),
    # retry: with a job's own fault: the step loop that restarts in place (node/restart.py).
    ("ddp-cpu.yaml+retry", "slurm", {}, "ddp-cpu-retry.sbatch"),
]
# Cases named "EXAMPLE+VARIANT": the example with these fields set on top.
VARIANTS = {"gate": {"preflight": {"gate": True, "min_busbw": "20GB/s"}},
            "retry": {"retry": {"attempts": 3, "on": ["node", "job"]}}}


def _rendered(example, backend, opts) -> str:
    """The example rendered from its JobSpec, as `halo-sched render` reads it (from the checkout's
    top: a job file's relative script is given to the nodes from the submit directory)."""
    name, _, variant = example.partition("+")
    with contextlib.chdir(REPO):
        spec = load(REPO / "examples" / name)
        if variant:
            spec = with_changes(spec, VARIANTS[variant])
        return halo_sched.render(spec, backend, **opts)


def test_regenerating_golden_files_fails_the_run():
    """HALO_UPDATE_GOLDEN=1 writes every golden file that changed, then fails."""
    if not os.environ.get("HALO_UPDATE_GOLDEN"):
        pytest.skip("HALO_UPDATE_GOLDEN is not set: the golden files are compared, not written")
    written = []
    for example, backend, opts, golden in CASES:
        path, text = GOLDEN / golden, _rendered(example, backend, opts)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(golden)
    pytest.fail(f"regenerated {len(written)} golden files ({', '.join(written) or 'none changed'}); review and commit, "
                "rerun without HALO_UPDATE_GOLDEN")


@pytest.mark.parametrize("example, backend, opts, golden", CASES, ids=[c[3] for c in CASES])
def test_rendered_example_matches_golden(example, backend, opts, golden):
    text = _rendered(example, backend, opts)
    path = GOLDEN / golden
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
