"""The failure report on the local backend, with real torchrun: rank 3 (node 1) fails first."""
from __future__ import annotations

import json
import os

import pytest

import halo_sched
from halo_sched.backends.base import JobStatus
from helpers import cli, example_job, free_port

pytestmark = pytest.mark.torch

TRAINER = "tests/trainers/first_failure.py"


@pytest.mark.parametrize("how, record, others", [
    # Not decorated with @record: exit code and stderr tail only; the others fail later at
    # gloo's error or timeout, or are stopped when node 1 ends.
    ("raise", False, "wait"),
    # @record (error.json), others asleep until the supervisor stops node 0.
    ("exit", True, "sleep"),
])
def test_first_failure_is_rank_3_on_node_1(tmp_path, how, record, others):
    job = example_job(tmp_path, free_port(), trainer={"script": TRAINER, "args": ["--how", how, "--others", others,
                                                                                   "--timeout", "6"]})
    env = {**os.environ, "TRAINER_RECORD": "1" if record else "0"}
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    last = r.stderr.strip().splitlines()[-1]
    error = "ValueError: rank 3 fails on purpose" if how == "raise" else "rank 3: exiting 3 on purpose"
    code = 1 if how == "raise" else 3
    assert f" [rank 3 (node 1, host " in last and f", local rank 1) exit {code} at " in last, last
    said = last.split("FAILED: ", 1)[1]  # the rank's own words lead
    assert said.startswith(error) or (how == "exit" and said.startswith("SystemExit: 3")), last

    st = halo_sched.job(job_id, "local").status()
    assert st.status is JobStatus.FAILED and st.failure.first.rank == 3
    # Every other rank that failed on its own did so after rank 3. (Victims, stopped by torchrun or
    # the supervisor once rank 3 died, carry a whole-second time that may read earlier.)
    assert all(f.time >= st.failure.first.time for f in st.failure.failures if not f.stopped)

    # No --backend: the job record says local.
    s = json.loads(cli("status", job_id, "--json").stdout)
    assert s["failure"]["first"]["rank"] == 3 and s["failure"]["first"]["node"] == 1
    logs = cli("logs", job_id, "--rank", "3").stdout.splitlines()
    assert logs and all(line.startswith("[node 1 rank 3] ") for line in logs)
    assert any("world of 4 formed" in line for line in logs)
    home = os.environ["HALO_SCHED_HOME"]
    d = os.path.join(home, "local", job_id)
    assert os.path.getsize(os.path.join(d, "node-1.log")) > 0  # each node's output in its own file
    listed = cli("list").stdout
    assert job_id in listed and "[rank 3 (node 1" in listed


def test_a_missing_trainer_script_is_the_first_thing_said(tmp_path):
    job = example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, trainer={"script": str(tmp_path / "train.py")})
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    said = last.split(" FAILED: ", 1)[1]
    assert said.startswith(f"can't open file '{tmp_path / 'train.py'}': No such file or directory [rank 0 (node 0"), last
    job_id = r.stdout.strip().splitlines()[-1]
    st = cli("status", job_id)
    assert f"FAILED: can't open file '{tmp_path / 'train.py'}': No such file or directory [" in st.stdout, st.stdout
