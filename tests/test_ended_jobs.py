"""Commands about a job that already ended (or has not started) say so, at once and truly.

``cancel`` of an ended job asks nobody when its record says it ended (no retrying through an
outage for nothing) and leaves a job Nomad finds dead as it is: exit 0, "already ended".
``logs`` tells output removed after the job ended from output not written yet, on each backend.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from halo_sched import records
from halo_sched.backends.base import JobState, JobStatus, missing_output
from helpers import REPO, load_nomad_helper

fake_api = load_nomad_helper("fake_api")
LIMIT = 160


def run(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "halo_sched.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(text: str, path: str = "") -> str:
    """The one line of ``text``, at most LIMIT characters besides ``path`` (a file's path is shown whole)."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0].replace(path, "")) <= LIMIT, lines
    return lines[0]


@pytest.fixture
def job_file(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("name: demo\nnodes: 1\nnproc_per_node: 1\ntrainer:\n  script: /x/train.py\n"
                 "nomad:\n  driver: raw_exec\n")
    return f


# ---- cancel ------------------------------------------------------------------------------------


def test_cancel_of_a_job_whose_record_says_it_failed_asks_nobody():
    records.write({"id": "train-1", "backend": "nomad", "submitted": 1.0, "name": "train",
                   "last_state": {"status": "FAILED", "describe": "FAILED: node 0 exit 1", "exit_code": 1}})
    # Nomad is down: asking it would retry for HALO_SUBMIT_RETRY_S (here 60 s, past the timeout).
    t0 = time.monotonic()
    r = run("cancel", "train-1", env={"NOMAD_ADDR": f"http://127.0.0.1:{closed_port()}", "HALO_SUBMIT_RETRY_S": "60"},
            timeout=30)
    assert r.returncode == 0, r.stderr
    line = one_line(r.stderr)
    assert line == "halo-sched: train-1 already ended (FAILED: node 0 exit 1); nothing to cancel", line
    assert time.monotonic() - t0 < 30


def test_cancel_of_a_nomad_job_already_dead_sends_no_stop(job_file):
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")]) as fake:
        env = {"NOMAD_ADDR": fake.address}
        r = run("submit", str(job_file), "--backend", "nomad", env=env)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[-1]
        (alloc,) = fake.allocs_of(job_id)
        fake.finish(job_id, alloc["TaskGroup"], exit_code=0)
        r = run("cancel", job_id, env=env)
        assert r.returncode == 0, r.stderr
        line = one_line(r.stderr)
        assert line.startswith(f"halo-sched: {job_id} already ended (COMPLETED") and "nothing to cancel" in line, line
        assert fake.requests_to("/v1/job/", "DELETE") == []  # left as it is
        # A running one is still stopped.
        r = run("submit", str(job_file), "--backend", "nomad", env=env)
        other = r.stdout.split()[-1]
        r = run("cancel", other, env=env)
        assert r.returncode == 0 and "cancel requested for" in r.stderr, r.stderr
        assert len(fake.requests_to(f"/v1/job/{other}", "DELETE")) == 1


def _local_job(job_id: str, state: dict, log: str | None = "[node 0] [rank 0] hi\n", nodes: int = 1) -> None:
    from halo_sched.backends.local import state_root

    d = state_root() / job_id
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"submitted": time.time(), **state}))
    (d / "job.json").write_text(json.dumps({"nodes": nodes}))
    if log is not None:
        (d / "job.log").write_text(log)
    records.write({"id": job_id, "backend": "local", "submitted": 1.0, "nodes": nodes, "nproc_per_node": 1})


def test_cancel_of_an_ended_local_job_says_so():
    _local_job("done-1", {"state": "COMPLETED", "exit_code": 0})
    r = run("cancel", "done-1")
    assert r.returncode == 0
    assert one_line(r.stderr) == "halo-sched: done-1 already ended (COMPLETED exit=0); nothing to cancel"


# ---- logs --------------------------------------------------------------------------------------


def test_local_logs_tell_removed_output_from_output_not_written_yet():
    from halo_sched.backends.local import state_root

    _local_job("done-2", {"state": "COMPLETED", "exit_code": 0}, log=None)
    r = run("logs", "done-2")
    assert r.returncode == 1
    line = one_line(r.stderr, str(state_root() / "done-2" / "job.log"))
    assert "job.log is gone: the job COMPLETED, and the file was removed since" in line, line
    assert "(yet)" not in line
    _local_job("waiting-1", {"state": "PENDING"}, log=None)
    r = run("logs", "waiting-1")
    assert r.returncode == 1
    assert "does not exist yet: the job is PENDING (not started)" in one_line(r.stderr, str(state_root() / "waiting-1"))


def test_the_shared_output_message_follows_the_state():
    # SLURM's logs read the same words (backends/slurm: _read).
    path = "/scratch/out-7.log"
    done = missing_output(path, JobState("7", JobStatus.COMPLETED, exit_code=0))
    assert done == f"output file {path} is gone: the job COMPLETED, and the file was removed since"
    assert "yet" not in missing_output(path, JobState("7", JobStatus.FAILED))
    assert "does not exist yet: the job is PENDING" in missing_output(path, JobState("7", JobStatus.PENDING))


def test_nomad_logs_tell_removed_output_from_a_task_not_started(job_file):
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")]) as fake:
        env = {"NOMAD_ADDR": fake.address}
        job_id = run("submit", str(job_file), "--backend", "nomad", env=env).stdout.split()[-1]
        (alloc,) = fake.allocs_of(job_id)
        fake.write_log(alloc["ID"], "step 1\n")
        assert run("logs", job_id, env=env).stdout == "[node 0] step 1\n"
        fake.finish(job_id, alloc["TaskGroup"], exit_code=0)
        fake.gc_logs.add(alloc["ID"])  # the client removed the allocation's directory
        r = run("logs", job_id, env=env)
        assert r.returncode == 1
        line = one_line(r.stderr)
        assert line == "halo-sched: node 0: output gone (allocation complete; Nomad has removed its files)", line
    with fake_api.FakeNomad([fake_api.FakeNode("gpu-a")], auto_run=False) as fake:
        env = {"NOMAD_ADDR": fake.address}
        job_id = run("submit", str(job_file), "--backend", "nomad", env=env).stdout.split()[-1]
        r = run("logs", job_id, env=env)
        assert r.returncode == 1
        assert one_line(r.stderr) == "halo-sched: node 0: no output yet (its task has not started)", r.stderr


def test_a_rank_outside_the_job_is_refused_naming_the_range(job_file):
    # The job's size comes from its record (nodes x nproc_per_node): nothing is asked of Nomad.
    records.write({"id": "one-rank", "backend": "nomad", "submitted": 1.0, "nodes": 1, "nproc_per_node": 1})
    r = run("logs", "one-rank", "--rank", "5", env={"NOMAD_ADDR": f"http://127.0.0.1:{closed_port()}"})
    assert r.returncode == 2 and r.stdout == ""
    assert one_line(r.stderr) == "halo-sched: --rank 5: job 'one-rank' has 1 rank (0..0)", r.stderr
