"""On the real SLURM cluster: a node lost outright, with no client anywhere (issue 39 item 2).

A 2-node job with ``retry: {attempts: 2, on: [node]}`` is submitted with ``submit --wait``; the
submitting process is killed (SIGKILL) once both ranks run; then one of the job's nodes is lost:
its slurmd and every process of the job on it are killed (``lose``: so that none acts on
another's death, as with a host whose power went), and the node is marked DOWN, as slurmctld
marks a node that stopped answering after ``SlurmdTimeout`` (60 s on this cluster:
``scontrol update State=DOWN`` takes the same path, node_mgr.c ``update_node`` ->
``kill_running_job_by_node_name``, without the wait). Nobody runs halo-sched until the run ended:

* a node other than the batch host: the job runs on without it (``--no-kill``), its trainer step
  fails, and the batch script submits the next attempt keeping off the lost host;
* the batch host: the job runs on headless, the watcher step on the other node cancels it, and
  the attempt's guardian job submits the next attempt keeping off the lost host.

Each is a real run of its own (torchrun, one rank per node): about 40-60 s each on 2 cores. They
hold the cluster alone (``slurm_cluster_exclusive``): a node is taken away and brought back."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env, submit_with_no_client_left, until

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def env(slurm_cluster_exclusive):
    return slurm_env(slurm_cluster_exclusive, pythonpath=True)


def _processes() -> dict[int, int]:
    """pid -> parent pid, of every process."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                out[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def _of_node(pid: int, log: str, job_id: str, host: str) -> bool:
    """Whether ``pid`` is the slurmstepd of the node whose slurmd log is ``log`` (its fd 3), or a
    process of job ``job_id`` running as that node (SLURMD_NODENAME in its environment: what a
    rank that left its parent's session still carries)."""
    try:
        if "slurmstepd" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
            return any(os.readlink(f"/proc/{pid}/fd/{fd}") == log for fd in os.listdir(f"/proc/{pid}/fd"))
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"SLURM_JOB_ID={job_id}".encode() in env and f"SLURMD_NODENAME={host}".encode() in env


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def lose(host: str, job_id: str, env: dict) -> list[int]:
    """Take ``host`` away as a dead machine goes: its slurmd, its slurmstepds and everything they
    started, and every process of job ``job_id`` on it, killed so that none of them acts on
    another's death; then DOWN in slurmctld. The daemons go first; then each process group at
    once (killpg): srun's shepherd, in the batch script's group, kills its step when srun dies
    (src/srun/libsrun/srun_job.c _shepherd_spawn), which no process of a dead host does. Never
    SIGSTOP first: the batch script's group is orphaned (its leader a session's), so the first
    member to die has the kernel SIGCONT every stopped one (kill_orphaned_pgrp)."""
    state = Path(env["SLURM_CONF"]).parent.parent
    log = str(state / "log" / f"slurmd-{host}.log")
    daemons = {int((state / "run" / f"slurmd-{host}.pid").read_text().split()[0])}
    procs = _processes()
    victims = {p for p in procs if _of_node(p, log, job_id, host)}
    daemons |= {p for p in victims if "slurmstepd" in _cmdline(p)}
    victims |= daemons
    grown = True
    while grown:
        more = {p for p, parent in procs.items() if parent in victims} - victims
        victims |= more
        grown = bool(more)
    for pid in daemons:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    groups: dict[int, set[int]] = {}
    for pid in victims - daemons:
        g = _pgid(pid)
        if g is not None:
            groups.setdefault(g, set()).add(pid)
    everyone = {p: _pgid(p) for p in _processes()}
    for g, members in groups.items():
        whole = all(p in victims for p, pg in everyone.items() if pg == g)
        try:
            if whole:
                os.killpg(g, signal.SIGKILL)
            else:
                for pid in members:
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    r = subprocess.run(["scontrol", "update", f"NodeName={host}", "State=DOWN", "Reason=lost (test)"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return sorted(victims)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


def restore(env: dict) -> None:
    """slurmd of every node running again, every node idle (slurm-cluster.sh up)."""
    r = subprocess.run(["bash", str(REPO / "tests" / "cluster" / "slurm-cluster.sh"), "up"], env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr


def _attempts(run_id: str, tmp_path, env) -> list:
    rows = [json.loads(ln) for ln in cli("list", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
    return sorted(((x.get("run") or {}).get("attempt"), x["status"]) for x in rows
                  if (x.get("run") or {}).get("id") == run_id)


def _run_losing(tmp_path, env, batch_host: bool) -> tuple[str, str, float]:
    """Submit, kill the submitter once both ranks run, lose one node of the job (its batch host
    or the other); returns (run id, the lost host, seconds from the loss to attempt 2 completed)."""
    shutil.copy(REPO / "tests" / "trainers" / "until_lost.py", tmp_path / "until_lost.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, retry={"attempts": 2, "on": ["node"]},
                      trainer={"script": "until_lost.py", "args": []})
    log = tmp_path / "attempts.log"
    run_id = submit_with_no_client_left(job, tmp_path, env, log)
    info = subprocess.run(["scontrol", "show", "job", run_id], env=env, capture_output=True, text=True, timeout=60).stdout
    batch = re.search(r"BatchHost=(\S+)", info)[1]
    hosts = {h for c, _, h, _ in (ln.split() for ln in log.read_text().splitlines()) if c == "0"}
    assert batch in hosts and len(hosts) == 2, (info, hosts)
    victim = batch if batch_host else next(iter(hosts - {batch}))
    try:
        lose(victim, run_id, env)
        lost_at = time.monotonic()
        done = until(lambda: _attempts(run_id, tmp_path, env)[-1:] == [(1, "COMPLETED")], 240, step=2)
        took = time.monotonic() - lost_at
    finally:
        restore(env)
    assert done, (_attempts(run_id, tmp_path, env), cli("status", run_id, cwd=tmp_path, env=env).stdout,
                  "".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")),
                  "".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.out")))
    second = {h for c, _, h, _ in (ln.split() for ln in log.read_text().splitlines()) if c == "1"}
    assert len(second) == 2 and victim not in second, log.read_text()
    st = cli("status", run_id, cwd=tmp_path, env=env).stdout.splitlines()
    a2 = [ln for ln in st if "\tattempt 2: " in ln]
    assert len(a2) == 1 and " COMPLETED;" in a2[0] and f"excluded {victim}" in a2[0], st
    # attempt 1: the lost host named as the cause (the marker its batch script or guardian signed)
    a1 = [ln for ln in st if "\tattempt 1: " in ln]
    assert len(a1) == 1 and f"(node fault: host {victim}, node left the allocation (SLURM marked it down))" in a1[0], st
    from halo_sched.backends.slurm import SlurmScheduler

    first = SlurmScheduler().query([run_id])[run_id].describe()  # its first failure: the lost host, its node rank
    assert f"SLURM took node {0 if batch_host else 1} ({victim}) out of the job" in first, first
    print("\n".join(st))
    assert victim in cli("nodes", env=env).stdout  # the node ledger learned the lost host
    return run_id, victim, took


def test_a_lost_node_other_than_the_batch_host_is_survived_by_the_batch_script_with_no_client(tmp_path, env):
    run_id, victim, took = _run_losing(tmp_path, env, batch_host=False)
    marker = json.loads(next(tmp_path.glob(f".halo-run-{run_id}.attempt-1.json")).read_text())
    assert marker["by"] == "its batch script" and marker["culprit"] == victim, marker
    assert marker["why"] == f"node fault: host {victim}, node left the allocation (SLURM marked it down)", marker
    out = next(tmp_path.glob(f"*-{run_id}.out")).read_text(errors="replace")
    assert f"attempt 2 of run {run_id} submitted as {marker['job']}, keeping off {victim}" in out, out[-3000:]
    print(f"non-batch node {victim} lost: attempt 2 completed {took:.1f} s later")


def test_a_lost_batch_host_is_carried_on_by_the_attempts_guardian_with_no_client(tmp_path, env):
    run_id, victim, took = _run_losing(tmp_path, env, batch_host=True)
    marker = json.loads(next(tmp_path.glob(f".halo-run-{run_id}.attempt-1.json")).read_text())
    assert marker["by"] == "its guardian" and marker["culprit"] == victim, marker
    # The guardian's own file, beside the job's: what it saw and what it did.
    said = (tmp_path / f"halo-guardian-{run_id}.log").read_text()
    assert f"job {run_id} ended CANCELLED after its batch host {victim} left the allocation" in said, said
    assert f"attempt 2 of run {run_id} submitted as {marker['job']}, keeping off {victim}" in said, said
    # attempt 2's own guardian was submitted with it, and cancelled when it completed.
    assert marker.get("guardian"), marker
    print(f"batch host {victim} lost: attempt 2 completed {took:.1f} s later")


@pytest.fixture
def env_shared(slurm_cluster):
    return slurm_env(slurm_cluster, pythonpath=True)


def _states(env, *names) -> dict[str, str]:
    q = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%j|%T", *[f"--name={n}" for n in names]], env=env,
                       capture_output=True, text=True, timeout=60)
    return {i: s for i, _, s in (ln.split("|") for ln in q.stdout.splitlines() if ln.count("|") == 2)}


def test_cancel_of_the_run_cancels_its_attempts_guardian_first(tmp_path, env_shared):
    """`cancel RUN` on a running attempt: the attempt's guardian goes too, before the attempt (a
    guardian left pending would start once the attempt ended CANCELLED). Without it the guardian
    runs (afternotok is met by CANCELLED), which leaves its file beside the job's."""
    env = env_shared
    shutil.copy(REPO / "tests" / "trainers" / "until_lost.py", tmp_path / "until_lost.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, retry={"attempts": 2, "on": ["node"]},
                      trainer={"script": "until_lost.py", "args": []})
    r = cli("submit", str(job), "--backend", "slurm", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    guard = f"halo-guardian-{run_id}"
    assert list(_states(env, guard).values()) == ["PENDING"], _states(env, guard)
    assert until(lambda: _states(env, "ddp-cpu").get(run_id) == "RUNNING", 120), _states(env, "ddp-cpu")
    r = cli("cancel", run_id, "--backend", "slurm", "--wait", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert until(lambda: list(_states(env, guard).values()) == ["CANCELLED"], 30), _states(env, guard)
    time.sleep(3)  # the scheduler's next pass: a guardian left pending would start now
    assert list(_states(env, guard).values()) == ["CANCELLED"], _states(env, guard)
    assert not (tmp_path / f"{guard}.log").exists()
