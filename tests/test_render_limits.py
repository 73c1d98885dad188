"""The rendered job is for a person to review (issue 30): at most 200 lines of SLURM batch script
(comments included, the carried node runtime after its last line not counted) and 300 lines of
Nomad HCL for every example, and the whole Nomad job (HCL and API JSON) at most 40 kB at any node
count: every allocation carries the whole job (hashicorp/nomad#27442). Figures: bench/sizes.py."""
from __future__ import annotations

import json

import pytest

import halo_sched
from halo_sched.backends.nomad.render import job_payload, render_hcl
from halo_sched.node_runtime import runtime

from helpers import REPO

SLURM_LINES = 200
HCL_LINES = 300
NOMAD_BYTES = 40_000
NOMAD_EXAMPLES = ("nomad-gpu", "rl-servers")
SLURM_EXAMPLES = ("ddp-cpu", "sweep", "ddp-gpu", "nomad-gpu", "rl-servers")
HCL_EXAMPLES = ("nomad-gpu", "rl-servers")


def _spec(name, **update):
    spec = halo_sched.load(REPO / "examples" / f"{name}.yaml")
    return spec.model_copy(update=update) if update else spec


def _before_the_runtime(text: str) -> str:
    """The batch script up to the carried node runtime's comment line (not counted)."""
    at = text.find(runtime().base64_lines())
    assert at > 0, "the batch script carries no node runtime"
    return text[:at].rsplit("\n", 2)[0] + "\n"


@pytest.mark.parametrize("name", SLURM_EXAMPLES)
def test_every_sbatch_script_reads_in_at_most_200_lines(name):
    lines = _before_the_runtime(halo_sched.render(_spec(name), "slurm")).count("\n")
    assert lines <= SLURM_LINES, f"examples/{name}.yaml renders {lines} lines of batch script (at most {SLURM_LINES})"


@pytest.mark.parametrize("name", HCL_EXAMPLES)
def test_every_nomad_job_reads_in_at_most_300_lines_of_hcl(name):
    lines = halo_sched.render(_spec(name), "nomad").count("\n")
    assert lines <= HCL_LINES, f"examples/{name}.yaml renders {lines} lines of HCL (at most {HCL_LINES})"


@pytest.mark.parametrize("nodes", (2, 16, 256))
@pytest.mark.parametrize("name", NOMAD_EXAMPLES)
def test_the_nomad_job_stays_under_40_kB_at_any_node_count(name, nodes):
    spec = _spec(name, nodes=nodes)
    hcl = render_hcl(spec).encode()
    api = (json.dumps(job_payload(spec), indent=2, ensure_ascii=False) + "\n").encode()
    assert runtime().base64[:76].encode() not in hcl + api  # the node runtime travels in the Variable
    assert len(hcl) <= NOMAD_BYTES, f"{name} at {nodes} nodes: {len(hcl):,} B of HCL"
    assert len(api) <= NOMAD_BYTES, f"{name} at {nodes} nodes: {len(api):,} B of API JSON"
