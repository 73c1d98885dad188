"""A host lost outright on the multi-host rig, with no client anywhere (issue 39 item 2): a 2-node
run with ``retry:`` (real torchrun and gloo, 2 ranks per node) is submitted with ``submit`` alone,
which returns at once: no halo-sched process is alive from then on but the readers below (``list``
and ``status`` follow the chain; they submit nothing). Once both nodes train, one host is cut
(``multihost.sh cut``: its links go down, its processes run on, unreachable, as behind a pulled
cable); slurmctld marks it DOWN after ``SlurmdTimeout`` (20 s here) and takes it out of the job
(``--no-kill``).

* a worker host (the job's second node): the batch script on h0 lives on; its trainer step ends
  once SLURM took the host out, and its successor step submits attempt 2 keeping off that host;
* the batch host (the job's first node, where its batch script runs): the job runs on headless;
  the watcher step on the other node cancels it and the attempt's guardian job submits attempt 2
  keeping off the batch host.

Either way attempt 2 completes on two other hosts, ``status RUN`` shows it, and the lost host is
in the node ledger. Long (up to 2-3 minutes each): SLURM notices a silent host only after
SlurmdTimeout, and attempt 2 is a second real torchrun job of 150 steps."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest

from cluster.multihost_fixtures import _rig_session, rig  # noqa: F401  (the fixtures)
from cluster.multihost_fixtures import node_steps, status_once_training
from helpers import REPO, cli, example_job, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.multihost]


def _attempts(run_id: str, tmp_path, env) -> list:
    rows = [json.loads(ln) for ln in cli("list", "--json", cwd=tmp_path, env=env, timeout=60).stdout.splitlines()]
    return sorted(((x.get("run") or {}).get("attempt"), x["status"], x["id"]) for x in rows
                  if (x.get("run") or {}).get("id") == run_id)


def _hosts(job_id: str, env) -> list[str]:
    from halo_sched.backends.slurm.down_nodes import expand_hostlist

    q = subprocess.run(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%N"], env=env, capture_output=True,
                       text=True, timeout=30)
    return expand_hostlist(q.stdout.strip())


def _cut_one(tmp_path, rig, batch_host: bool) -> tuple[str, str, dict, float]:  # noqa: F811
    """Submit (the client returns), wait until both nodes train, cut the job's batch host or its
    other host, and wait, reading only, for attempt 2 to complete. Returns (run id, the cut host,
    the marker of attempt 2, seconds from the cut to attempt 2 COMPLETED)."""
    env = slurm_env(rig.env)
    shutil.copy(REPO / "tests" / "trainers" / "hang.py", tmp_path / "hang.py")
    job = example_job(tmp_path, 29500, trainer={"script": "hang.py", "args": ["--steps", "150", "--step-time", "0.2"]},
                      rendezvous={"port": 29500, "timeout_s": 60}, hang={"timeout_s": 30},
                      retry={"attempts": 2, "on": ["node", "hang"]})
    r = cli("submit", str(job), "--backend", "slurm", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    # Training: both nodes past step 10.
    text = status_once_training(run_id, tmp_path, env, 2, 10, 180)
    assert "RUNNING" in text and len(node_steps(text)) == 2, text
    info = subprocess.run(["scontrol", "show", "job", run_id], env=env, capture_output=True, text=True,
                          timeout=30).stdout
    batch = re.search(r"BatchHost=(\S+)", info)[1]
    hosts = _hosts(run_id, env)
    assert len(hosts) == 2 and batch in hosts, (info, hosts)
    victim = batch if batch_host else next(h for h in hosts if h != batch)
    rig.cut(victim)
    cut_at = time.monotonic()
    done = None
    while time.monotonic() < cut_at + 240 and not done:
        time.sleep(3)
        rows = _attempts(run_id, tmp_path, env)
        done = rows[-1:] and rows[-1][:2] == (1, "COMPLETED")
    took = time.monotonic() - cut_at
    rows = _attempts(run_id, tmp_path, env)
    st = cli("status", run_id, "--backend", "slurm", cwd=tmp_path, env=env, timeout=60).stdout
    outs = "".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.out"))
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("halo-guardian-*.log"))
    print(st, rows, f"attempt 2 COMPLETED {took:.1f} s after the cut", sep="\n")
    assert done, (rows, st, outs, logs)
    second = rows[-1][2]
    assert victim not in _hosts(second, env), (victim, _hosts(second, env))
    a2 = [ln for ln in st.splitlines() if "\tattempt 2: " in ln]
    assert len(a2) == 1 and " COMPLETED;" in a2[0] and f"excluded {victim}" in a2[0], st
    a1 = [ln for ln in st.splitlines() if "\tattempt 1: " in ln]
    assert len(a1) == 1 and f"node fault: host {victim}, node left the allocation" in a1[0], st
    ledger = json.loads(cli("nodes", "--json", env=env).stdout)
    assert victim in [e["host"] for e in ledger], ledger
    marker = json.loads(next(tmp_path.glob(f".halo-run-{run_id}.attempt-1.json")).read_text())
    assert marker["job"] == second and marker["culprit"] == victim, marker
    return run_id, victim, marker, took


def test_a_worker_host_cut_with_no_client_is_carried_on_by_the_batch_script(tmp_path, rig):  # noqa: F811
    """h1 cut, nobody waiting: the batch script's successor step carries the run on. Long (85 s seen):
    SlurmdTimeout before SLURM takes the host out, then attempt 2 is a second real torchrun job."""
    run_id, victim, marker, took = _cut_one(tmp_path, rig, batch_host=False)
    assert marker["by"] == "its batch script", marker
    # SlurmdTimeout (20-30 s) before SLURM takes the host out, then seconds; attempt 2 trains 30 s more.
    assert took <= 180, took


def test_the_batch_host_cut_with_no_client_is_carried_on_by_the_attempts_guardian(tmp_path, rig):  # noqa: F811
    """The batch host cut, nobody waiting: the watcher step cancels the headless job and the guardian
    submits attempt 2. Long (107 s seen): SlurmdTimeout, the guardian's start, a second real torchrun job."""
    run_id, victim, marker, took = _cut_one(tmp_path, rig, batch_host=True)
    assert marker["by"] == "its guardian", marker
    said = (tmp_path / f"halo-guardian-{run_id}.log").read_text()
    assert f"job {run_id} ended CANCELLED after its batch host {victim} left the allocation" in said, said
    assert f"attempt 2 of run {run_id} submitted as {marker['job']}, keeping off {victim}" in said, said
    assert took <= 200, took
