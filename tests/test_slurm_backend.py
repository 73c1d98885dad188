"""halo-sched's own SLURM jobs on the real local cluster (tests/cluster/): one slurmctld and
three slurmd "nodes" on this machine, all at NodeAddr 127.0.0.1, real torchrun with gloo."""
from __future__ import annotations

import json
import time

import pytest

from helpers import HOSTILE_MORE, REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.fixture
def env(slurm_cluster):
    return slurm_env(slurm_cluster)


def _job(tmp_path, **overrides):
    path = example_job(tmp_path, free_port(), **overrides)
    data = path.read_text().replace("script: examples/train_ddp.py", f"script: {REPO / 'examples' / 'train_ddp.py'}")
    path.write_text(data)
    return path


def test_example_job_forms_one_world_from_slurm_nodeid(tmp_path, env):
    reports = tmp_path / "reports"
    job = _job(tmp_path, env={"OMP_NUM_THREADS": "1", "HOSTILE": HOSTILE_MORE},
               trainer={"script": "examples/train_ddp.py",
                        "args": ["--steps", "5", "--report-dir", str(reports), "--echo-env", "HOSTILE"]})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    assert job_id.isdigit()
    assert "COMPLETED" in r.stderr
    # A short job can start and end between two polls (pending jobs are polled further apart);
    # when its RUNNING was seen, it names both nodes.
    assert "RUNNING" not in r.stderr or "RUNNING on 2 nodes" in r.stderr, r.stderr

    ranks = [json.loads((reports / f"rank{i}.json").read_text()) for i in range(4)]
    assert sorted((x["rank"], x["node_rank"]) for x in ranks) == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert all(x["world_size"] == 4 and x["ok"] for x in ranks)
    for x in ranks:
        assert bytes.fromhex(x["env_hex"]["HOSTILE"]) == HOSTILE_MORE.encode()

    # srun --label tags each line with the task = node rank; the batch script names the master.
    logs = cli("logs", job_id, "--backend", "slurm", cwd=tmp_path, env=env).stdout
    assert "master 127.0.0.1:" in logs
    # logs tags each line [node K] (and [node K rank R] for a rank's own output).
    assert "[node 0] halo-sched: node 0 of 2" in logs and "[node 1] halo-sched: node 1 of 2" in logs
    assert "[node 0 rank 0] world: 4 ranks on 2 nodes (node ranks [0, 1])" in logs
    st = json.loads(cli("status", job_id, "--backend", "slurm", "--json", env=env).stdout)
    assert st["status"] == "COMPLETED" and st["exit_code"] == 0


def test_failing_rank_fails_the_job(tmp_path, env):
    job = _job(tmp_path, trainer={"script": "examples/train_ddp.py", "args": ["--steps", "3", "--fail-rank", "2"]})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    st = json.loads(cli("status", job_id, "--backend", "slurm", "--json", env=env).stdout)
    assert st["status"] == "FAILED" and st["exit_code"] not in (None, 0)


def test_cancel_running_job(tmp_path, env):
    job = _job(tmp_path, setup=["sleep 300"])
    r = cli("submit", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = json.loads(cli("status", job_id, "--backend", "slurm", "--json", env=env).stdout)
        if st["status"] == "RUNNING":
            break
        time.sleep(1)
    assert st["status"] == "RUNNING"
    assert cli("cancel", job_id, "--backend", "slurm", env=env).returncode == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = json.loads(cli("status", job_id, "--backend", "slurm", "--json", env=env).stdout)
        if st["status"] != "RUNNING":
            break
        time.sleep(1)
    assert st["status"] == "CANCELLED"


def test_dry_run_submits_nothing(tmp_path, env):
    job = _job(tmp_path)
    r = cli("submit", str(job), "--backend", "slurm", "--dry-run", cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash")
    assert "#SBATCH --nodes=2" in r.stdout
