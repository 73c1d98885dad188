"""The failure report on the real SLURM cluster: rank 3 (node 1) fails first; then slurmctld
forgets the job and status/logs still work from the job record, without --backend."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import REPO, cli, example_job, free_port

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
CLUSTER = REPO / "tests" / "cluster" / "slurm-cluster.sh"


@pytest.fixture
def env(slurm_cluster):
    e = dict(os.environ)
    e.update(slurm_cluster)
    e["PATH"] = f"{os.path.dirname(sys.executable)}:{e['PATH']}"
    return e


def _forget_every_job(env):
    """slurmctld restarted with -c (its saved state cleared): every job is forgotten at once, as
    MinJobAge does after a while. The configuration is not touched."""
    subprocess.run(["bash", str(CLUSTER), "ctld-stop"], env=env, check=True, capture_output=True, timeout=60)
    subprocess.run(["slurmctld", "-c"], env=env, check=True, capture_output=True, timeout=60)
    for _ in range(100):
        if subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError("slurmctld did not come back")


def test_rank_3_fails_first_and_the_record_outlives_the_scheduler(tmp_path, env):
    shutil.copy(REPO / "tests" / "trainers" / "first_failure.py", tmp_path / "first_failure.py")
    job = example_job(tmp_path, free_port(),
                      trainer={"script": "first_failure.py", "args": ["--how", "raise", "--timeout", "6"]})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    last = r.stderr.strip().splitlines()[-1]
    assert "FAILED: rank 3 (node 1, host " in last and ", local rank 1) exit 1 at " in last, r.stderr
    assert "ValueError: rank 3 fails on purpose" in last

    _forget_every_job(env)
    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["status"] == "UNKNOWN"  # what SLURM says now
    assert st["last_known"]["failure"]["first"]["rank"] == 3  # what the record kept
    text = cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert "FAILED: rank 3 (node 1" in text and "last known" in text
    logs = cli("logs", job_id, "--rank", "3", cwd=tmp_path, env=env)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert lines and all(line.startswith("[node 1 rank 3] ") for line in lines)
    assert any("ValueError: rank 3 fails on purpose" in line for line in lines)
    node0 = cli("logs", job_id, "--node", "0", cwd=tmp_path, env=env).stdout.splitlines()
    assert node0 and all(line.startswith("[node 0") for line in node0)
