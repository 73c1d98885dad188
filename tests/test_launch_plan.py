"""The launch plan (halo_sched/launch.py): one immutable description of a job that every renderer
reads; what a backend needs after rendering comes from it, never from the rendered text."""
from __future__ import annotations

from pathlib import Path

import pytest

import halo_sched
from halo_sched.backends.base import DryRun
from halo_sched.backends.slurm import SlurmScheduler
from halo_sched.launch import compile_launch
from halo_sched.node.contract import DERIVED_PORTS, NAMES

SPEC = """
name: plan-job
nodes: 2
nproc_per_node: 1
trainer: {script: train.py}
servers:
  - {name: policy, nodes: 2, command: [serve], port: 8000, group_port: 29700, gpus_per_node: 1, image: srv:1}
  - {name: ref-model, nodes: 1, command: [serve], port: 8001}
"""


def test_the_plan_is_immutable_and_holds_each_fact():
    launch = compile_launch(halo_sched.loads(SPEC + "slurm: {signal: 'HUP@60', extra_args: ['--clusters=far']}\n"))
    with pytest.raises(AttributeError):
        launch.name = "other"  # type: ignore[misc]
    hash(launch.trainer), hash(launch.servers), hash(launch.rendezvous)  # all-tuple fields: hashable
    assert [(r.name, r.offset, r.nodes, r.port, r.gpus, r.image) for r in launch.servers] == [
        ("policy", 2, 2, 8000, 1, "srv:1"), ("ref-model", 4, 1, 8001, 0, None)]
    assert launch.all_nodes == 5 and launch.max_gpus == 1
    assert launch.servers[1].urls_var == NAMES.role_urls("ref-model") == "HALO_SERVER_REF_MODEL_URLS"
    assert launch.rendezvous.port is None and launch.rendezvous.derived == DERIVED_PORTS
    assert launch.rendezvous.avoid == (8000, 8001, 29700)
    assert (launch.warning.signal, launch.warning.carrier) == ("HUP", "URG")
    assert launch.cluster == "far"
    assert launch.job_id == launch.name == "plan-job"
    assert compile_launch(launch.spec, "plan-job-1").job_id == "plan-job-1"


def test_slurm_record_takes_the_output_file_from_the_plan(tmp_path, monkeypatch):
    """The record's output file is the plan's, whatever text the dry run carries (it used to be
    read back out of the script's ``#SBATCH --output=`` line, and a script without one gave
    sbatch's default, a file the job never writes)."""
    monkeypatch.chdir(tmp_path)
    spec = halo_sched.loads(SPEC)
    fields = SlurmScheduler().record_fields(DryRun("slurm", spec, "#!/bin/bash\n"), "far:42")
    assert fields == {"outputs": [str(Path(tmp_path) / "halo-plan-job-42.out")], "scheduler": {"cluster": "far"}}


def test_preemption_check_asks_the_plans_cluster():
    """``scontrol show config`` goes to the cluster the plan names, without a rendered script."""
    asked = []

    class Transport:
        name = "stand-in"

        def show_config(self, cluster):
            asked.append(cluster)
            return None

    spec = halo_sched.loads(SPEC + "slurm: {signal: 'USR2@60', extra_args: ['--clusters=far']}\n")
    SlurmScheduler(transport=Transport()).preemption_check(spec)
    assert asked == ["far"]
