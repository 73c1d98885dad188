"""The rendered Nomad job, run as a Nomad client would start its tasks (tests/nomad/client_sim.py):
NOMAD_* environment, runtime interpolation of args and env, templates (the entry script with its
own delimiters, nomadService empty until node-0 registers), command + args — with real torchrun
processes and gloo."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

import halo_sched
import halo_sched.spec
from halo_sched.backends.nomad.render import job_payload
from helpers import HOSTILE_MORE, REPO, free_port, load_nomad_helper, loopback_hosts

client_sim = load_nomad_helper("client_sim")
pytestmark = pytest.mark.torch


def spec_for(nodes: int, port: int, timeout_s: int, reports: str):
    return halo_sched.spec.JobSpec.model_validate({
        "name": "sim-job", "nodes": nodes, "nproc_per_node": 1,
        "trainer": {"script": str(REPO / "examples" / "train_ddp.py"),
                    "args": ["--steps", "3", "--report-dir", reports, "--echo-env", "HOSTILE"]},
        "env": {"HOSTILE": HOSTILE_MORE, "OMP_NUM_THREADS": "1"},
        "rendezvous": {"port": port, "timeout_s": timeout_s},
        "nomad": {"driver": "raw_exec"},
    })


def host_env():
    env = dict(os.environ)
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    return env


def test_three_node_job_forms_one_world(tmp_path):
    reports = tmp_path / "reports"
    spec = spec_for(3, free_port(), 120, str(reports))
    job = job_payload(spec)["Job"]
    with client_sim.SimCluster(job, tmp_path / "nomad", host_env=host_env(), hosts=loopback_hosts(3)) as cluster:
        # One group of count 3 (node rank = NOMAD_ALLOC_INDEX), ranks 2 and 1 placed out of order
        # and before rank 0: they register too, but their template asks for index 0's
        # registration only, so it renders empty and they wait for it.
        assert [(g["Name"], g["Count"]) for g in job["TaskGroups"]] == [("trainer", 3)]
        cluster.place(["trainer[2]"])
        cluster.start()
        cluster.place(["trainer[1]"])
        cluster.start()
        time.sleep(2)
        assert sorted(r["Tags"] for r in cluster.services("sim-job-rdzv")) == [["halo-index-1"], ["halo-index-2"]]
        cluster.place(["trainer"])  # fills exactly the missing index, 0
        cluster.start()
        codes = cluster.wait(timeout=240)
        logs = {name: cluster.stdout(name) + cluster.stderr(name) for name in codes}
    assert set(codes.values()) == {0}, logs
    ranks = [json.loads((reports / f"rank{i}.json").read_text()) for i in range(3)]
    assert sorted((r["rank"], r["node_rank"]) for r in ranks) == [(0, 0), (1, 1), (2, 2)]
    # trainer[K] is node rank K, whatever order the allocations were placed and started in.
    for name, rank in (("sim-job.trainer[1]", 1), ("sim-job.trainer[2]", 2)):
        assert f"halo-sched: node {rank} of 3" in logs[name], logs[name]
    assert all(r["world_size"] == 3 and r["ok"] for r in ranks)
    for r in ranks:
        assert bytes.fromhex(r["env_hex"]["HOSTILE"]) == HOSTILE_MORE.encode()


def test_worker_without_leader_fails_within_rendezvous_timeout(tmp_path):
    spec = spec_for(2, free_port(), 3, str(tmp_path / "r"))
    job = job_payload(spec)["Job"]
    with client_sim.SimCluster(job, tmp_path / "nomad", host_env=host_env(), hosts=loopback_hosts(3)) as cluster:
        cluster.place(["trainer[1]"])  # half-placed: rank 0 never comes; rank 1's own registration is not index 0's
        t0 = time.monotonic()
        cluster.start()
        codes = cluster.wait(timeout=30)
        elapsed = time.monotonic() - t0
        (name, code), = codes.items()
        err = cluster.stderr(name)
    assert code != 0
    assert "rendezvous.timeout_s=3s" in err, err
    assert elapsed < 3 + 5
