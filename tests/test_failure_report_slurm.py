"""The failure report on the real SLURM cluster: rank 3 (node 1) fails first; then slurmctld
forgets the job and status/logs still work from the job record, without --backend."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env, store_text, write_tool

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


@pytest.fixture
def env(slurm_cluster):
    return slurm_env(slurm_cluster)


# A stand-in for squeue/scontrol/sacct through which SLURM has forgotten one job, as after
# MinJobAge or a controller that lost its state: the real client is asked about an id no job of
# this cluster ever had (ids count up from 1; 67,000,000 is below SLURM's MaxJobId) in place of
# the job's, and the job's lines are dropped from listings of every job. SLURM's own answers,
# without touching the shared cluster (restarting slurmctld with -c, as this test once did,
# wiped every job on it).
FORGET = r'''#!{python}
import os, re, subprocess, sys
job, never = os.environ["HALO_FORGET_JOB"], "67000000"
word = re.compile(r"(?<![0-9])" + job + r"(?![0-9])")
real = os.path.join(os.environ["HALO_REAL_SLURM_BIN"], os.path.basename(sys.argv[0]))
p = subprocess.run([real] + [word.sub(never, a) for a in sys.argv[1:]], capture_output=True)
sys.stdout.buffer.write(b"".join(ln for ln in p.stdout.splitlines(True) if not word.search(ln.decode(errors="replace"))))
sys.stderr.buffer.write(p.stderr)
sys.exit(p.returncode)
'''


def _forget(env, job_id, tmp_path) -> dict:
    """The environment of a client for which SLURM has forgotten ``job_id``."""
    bindir = tmp_path / "forget-bin"
    bindir.mkdir()
    real = os.path.dirname(shutil.which("squeue", path=env["PATH"]))
    for tool in ("squeue", "scontrol", "sacct"):
        write_tool(bindir, tool, FORGET)
    return {**env, "PATH": f"{bindir}:{env['PATH']}", "HALO_FORGET_JOB": job_id, "HALO_REAL_SLURM_BIN": real}


def test_rank_3_fails_first_and_the_record_outlives_the_scheduler(tmp_path, env):
    shutil.copy(REPO / "tests" / "trainers" / "first_failure.py", tmp_path / "first_failure.py")
    job = example_job(tmp_path, free_port(),
                      trainer={"script": "first_failure.py", "args": ["--how", "raise", "--timeout", "30"]})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    last = r.stderr.strip().splitlines()[-1]
    assert " [rank 3 (node 1, host " in last and ", local rank 1) exit 1 at " in last, r.stderr
    assert "FAILED: ValueError: rank 3 fails on purpose [" in last  # the rank's own words lead

    # Someone else's job on the shared cluster: forgetting ours must leave it alone.
    other = subprocess.run(["sbatch", "--parsable", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "sleep 120"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    other_id = other.stdout.strip().split(";")[0]
    env_seen, env = env, _forget(env, job_id, tmp_path)
    unknown = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode != 0 and "Invalid job id" in unknown.stderr, unknown  # SLURM's own words
    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["status"] == "UNKNOWN"  # what SLURM says now
    assert st["last_known"]["failure"]["first"]["rank"] == 3  # what the record kept
    text = cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert "[rank 3 (node 1" in text and "last known" in text
    logs = cli("logs", job_id, "--rank", "3", cwd=tmp_path, env=env)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert lines and all(line.startswith("[node 1 rank 3] ") for line in lines)
    assert any("ValueError: rank 3 fails on purpose" in line for line in lines)
    node0 = cli("logs", job_id, "--node", "0", cwd=tmp_path, env=env).stdout.splitlines()
    assert node0 and all(line.startswith("[node 0") for line in node0)
    still = subprocess.run(["squeue", "--noheader", "--format=%i", f"--jobs={other_id}"], env=env_seen,
                           capture_output=True, text=True, timeout=60)
    assert still.stdout.split() == [other_id], (still.stdout, still.stderr)


def test_a_forged_line_names_no_culprit_and_no_secret_leaves_the_node(tmp_path, env):
    # Issue 28, items 3 and 10, on SLURM: the key in sbatch's environment, unset by the entry script
    # before any rank starts; rank 0 forges a line dated 100 s earlier; rank 3's error ends with a
    # secret_env value.
    from test_failure_report_local import FORGER

    (tmp_path / "forger.py").write_text(FORGER)
    token = "tok_" + "Sl9Ur8Mq7W" * 4 + "end"
    job = example_job(tmp_path, free_port(), trainer={"script": "forger.py"}, secret_env=["MY_TOKEN"])
    env = {**env, "MY_TOKEN": token}
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    last = r.stderr.strip().splitlines()[-1]
    assert " [rank 3 (node 1, host " in last and "victim-host" not in last, r.stderr
    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["failure"]["first"]["rank"] == 3 and st["failure"]["unverified"] >= 1
    assert "victim-host" not in cli("nodes", "--json", cwd=tmp_path, env=env).stdout
    logs = cli("logs", job_id, cwd=tmp_path, env=env).stdout
    assert "key in my environment: True" not in logs and logs.count("key in my environment: False") == 4, logs
    kept = r.stderr + json.dumps(st) + store_text(env["HALO_SCHED_HOME"])
    assert job_id in kept
    for frag in (token, token[:12], token[-12:]):
        assert frag not in kept
    signed = [ln for ln in logs.splitlines() if "halo-sched-failure" in ln and '"mac"' in ln]
    assert signed and not any(token[4:16] in ln for ln in signed)
