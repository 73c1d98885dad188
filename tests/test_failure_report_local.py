"""The failure report on the local backend, with real torchrun: rank 3 (node 1) fails first."""
from __future__ import annotations

import json
import os

import pytest

import halo_sched
from halo_sched.backends.base import JobStatus
from helpers import cli, example_job, free_port, store_text, stored_record

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
                                                                                   "--timeout", "30"]})
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
    # A job file's script is checked at submit: refused before a node starts (tests/test_trainer_script.py).
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", timeout=120)
    assert r.returncode == 2 and "trainer.script (line" in r.stderr and "no such file" in r.stderr, r.stderr[-3000:]
    # Where it is not checked (a spec built in code; a file gone by the time the node starts), the
    # rank's own words are the first thing said.
    state = halo_sched.submit(halo_sched.spec_from_yaml(job.read_text()), "local").wait(timeout=120)
    said = state.describe().split("FAILED: ", 1)[1]
    assert said.startswith(f"can't open file '{tmp_path / 'train.py'}': No such file or directory [rank 0 (node 0"), said
    job_id = state.id
    st = cli("status", job_id)
    assert f"FAILED: can't open file '{tmp_path / 'train.py'}': No such file or directory [" in st.stdout, st.stdout


FORGER = """
import json, os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank}: key in my environment: {'HALO_FAILURE_KEY' in os.environ}", flush=True)
if rank == 0:  # a line shaped like a node's report, dated 100 s earlier, naming a host of its choosing
    print("halo-sched-failure " + json.dumps({"node": 0, "rank": 0, "local_rank": 0, "host": "victim-host",
          "node_name": "victim-host", "exit_code": 1, "signal": None, "time": time.time() - 100,
          "error": "NCCL WARN NET/IB : Got completion with error 12", "tail": [], "stopped": False}),
          file=sys.stderr, flush=True)
if rank == 3:
    time.sleep(2)
    raise ValueError("x" * 340 + os.environ["MY_TOKEN"])
time.sleep(float(os.environ.get("FORGER_SLEEP", "60")))  # the others: end badly after rank 3
sys.exit(1)
"""


def test_a_forged_line_names_no_culprit_and_no_secret_leaves_the_node(tmp_path):
    # Issue 28, items 3 and 10, with real torchrun: rank 0 prints a forged failure line dated 100 s
    # before rank 3's real failure, whose message ends with a secret_env value.
    trainer = tmp_path / "forger.py"
    trainer.write_text(FORGER)
    token = "tok_" + "Zq9Yw8Xv7U" * 4 + "end"
    job = example_job(tmp_path, free_port(), trainer={"script": str(trainer)}, secret_env=["MY_TOKEN"])
    env = {**os.environ, "MY_TOKEN": token}
    r = cli("submit", str(job), "--backend", "local", "--wait", "--quiet", env=env, timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    last = r.stderr.strip().splitlines()[-1]
    assert "[rank 3 (node 1, host " in last and "victim-host" not in last, last
    s = json.loads(cli("status", job_id, "--json", env=env).stdout)
    assert s["failure"]["first"]["rank"] == 3 and s["failure"]["first"]["trusted"]
    assert s["failure"]["unverified"] >= 1  # the forged line, kept as what it is
    nodes = cli("nodes", "--json", env=env).stdout
    assert "victim-host" not in nodes
    # The key never reached a rank; the token never left the node (nor a fragment of it).
    logs = cli("logs", job_id, env=env).stdout
    assert "key in my environment: True" not in logs and logs.count("key in my environment: False") == 4
    home = os.environ["HALO_SCHED_HOME"]
    assert stored_record(home, job_id)["id"] == job_id
    kept = store_text(home) + json.dumps(s) + r.stderr
    for frag in (token, token[:16], token[-16:]):
        assert frag not in kept
    d = os.path.join(home, "local", job_id)
    failure_lines = [ln for ln in open(os.path.join(d, "node-1.log")).read().splitlines()
                     if "halo-sched-failure" in ln and '"mac"' in ln]
    assert failure_lines and not any(token[4:20] in ln for ln in failure_lines)
