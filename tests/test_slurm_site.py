"""SLURM as sites run it, on the real local cluster (tests/cluster/: 3 nodes of 2 CPUs, all at
127.0.0.1, TaskPlugin=task/affinity, PreemptMode=OFF): a master port per job, CPUs for every
rank, a rank environment without srun's per-task variables, and the preemption settings read
at submit. The trainer is examples/train_ddp.py (gloo)."""
from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from cluster.cluster import slurm_version
from helpers import REPO, cli, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

TRAINER = str(REPO / "examples" / "train_ddp.py")
_submitted: list[str] = []


@pytest.fixture
def env(slurm_cluster):
    e = slurm_env(slurm_cluster)
    yield e
    if _submitted:  # a failed test must not leave its jobs holding the nodes
        cli("cancel", *_submitted, "--backend", "slurm", env=e)
        _submitted.clear()


def _job(tmp_path, name: str, nproc: int, args: list[str], **extra) -> tuple:
    """A job file of ``name`` without rendezvous.port (each job its own) or slurm.cpus_per_task."""
    reports = tmp_path / name / "reports"
    data = {"name": name, "nodes": 2, "nproc_per_node": nproc,
            "trainer": {"script": TRAINER, "args": ["--report-dir", str(reports), *args]},
            "env": {"OMP_NUM_THREADS": "1"}, "rendezvous": {"timeout_s": 120}, **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, reports


def _status(job_id, env) -> dict:
    return json.loads(cli("status", job_id, "--backend", "slurm", "--json", env=env).stdout)


def _submit(path, tmp_path, env):
    r = cli("submit", str(path), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    _submitted.append(r.stdout.strip().splitlines()[-1])
    return _submitted[-1], r.stderr


def _wait_for_end(job_id, env, timeout=240) -> dict:
    deadline = time.monotonic() + timeout
    while (st := _status(job_id, env))["status"] in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, st
        time.sleep(1)
    return st


def _reports(reports, n) -> list[dict]:
    return [json.loads((reports / f"rank{r}.json").read_text()) for r in range(n)]


def test_two_concurrent_default_port_jobs_both_complete(tmp_path, env):
    """Two 2-node jobs without rendezvous.port run at once; every node of this cluster is
    127.0.0.1, so both node-0s share a host. With one port for every job (the old default
    29500) the second rank 0 cannot bind it, or its nodes join the first job's store. Each job
    derives its own (28500 + job id % 1000). Also: submit reads the cluster's configuration and
    warns that slurm.signal will not come on preemption here (PreemptMode=OFF, and no
    preempt_send_user_signal)."""
    jobs = []
    for name in ("port-a", "port-b"):
        # One rank per node: each job holds one CPU per node, so both fit on 3 nodes of 2 CPUs.
        path, reports = _job(tmp_path, name, 1, ["--steps", "60", "--step-time", "0.25"], slurm={"signal": "USR2"})
        job_id, err = _submit(path, tmp_path, env)
        assert "halo-sched: warning: slurm.signal USR2: this cluster does not preempt jobs" in err, err
        # The key this release reads (preemption.key_to_set): 22.05 only the legacy one.
        key = ("SlurmctldParameters=preempt_send_user_signal" if slurm_version() == "22.05"
               else "PreemptParameters=send_user_signal")
        assert key in err, err
        jobs.append((name, job_id, reports))
    # Both ran at the same time: seen RUNNING together at least once.
    deadline = time.monotonic() + 180
    while not all(_status(j, env)["status"] == "RUNNING" for _, j, _ in jobs):
        assert time.monotonic() < deadline and all(_status(j, env)["status"] in ("PENDING", "RUNNING")
                                                   for _, j, _ in jobs), [_status(j, env) for _, j, _ in jobs]
        time.sleep(0.5)
    ends = {job_id: (_wait_for_end(job_id, env), (tmp_path / f"halo-{name}-{job_id}.out").read_text())
            for name, job_id, _ in jobs}
    # (With one port for both: "DistNetworkError: The server socket has failed to listen on any
    # local network address. port: 29500, ... EADDRINUSE" from the second job's rank 0.)
    assert all(st["status"] == "COMPLETED" and st["exit_code"] == 0 for st, _ in ends.values()), \
        {j: (st, out[-2000:]) for j, (st, out) in ends.items()}
    ports = {}
    for name, job_id, reports in jobs:
        assert all(x["world_size"] == 2 and x["ok"] for x in _reports(reports, 2))
        (port,) = set(re.findall(r"master 127\.0\.0\.1:(\d+)", ends[job_id][1]))
        assert int(port) == 28500 + int(job_id) % 1000
        ports[job_id] = int(port)
    assert len(set(ports.values())) == 2, ports
    print(f"\nconcurrent default-port jobs and their master ports: {ports}")


def test_a_node_without_cpus_per_task_gives_its_ranks_cpus_and_a_clean_environment(tmp_path, env):
    """2 ranks per node, neither slurm.cpus_per_task nor exclusive: --ntasks-per-node=1 alone
    would hold one CPU per node, and task/affinity would bind both ranks to it. The default asks
    one per rank, and srun passes it on. Each rank also no longer sees srun's per-task variables
    (SLURM_PROCID = node index, SLURM_NTASKS = nodes), but still the job's."""
    names = ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_CPU_BIND",
             "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CPUS_PER_TASK"]
    echo = [a for n in names for a in ("--echo-env", n)]
    path, reports = _job(tmp_path, "cpus", 2, ["--steps", "5", *echo])
    job_id, _ = _submit(path, tmp_path, env)
    st = _wait_for_end(job_id, env)
    out = (tmp_path / f"halo-cpus-{job_id}.out").read_text()
    assert st["status"] == "COMPLETED", (st, out[-3000:])
    ranks = _reports(reports, 4)
    by_node: dict[int, set] = {}
    for x in ranks:
        by_node.setdefault(x["node_rank"], set()).update(x["cpu_affinity"])
    assert all(len(cpus) > 1 for cpus in by_node.values()), {x["rank"]: x["cpu_affinity"] for x in ranks}
    assert "share" not in out  # no "ranks per node share N CPU(s)" warning from the batch script
    seen = {x["rank"]: {n: bytes.fromhex(h).decode() for n, h in x["env_hex"].items()} for x in ranks}
    for x in ranks:
        got = seen[x["rank"]]
        gone = {n: got[n] for n in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID",
                                    "SLURM_CPU_BIND") if got[n]}
        assert gone == {}, (x["rank"], gone)
        assert got["SLURM_JOB_ID"] == job_id and got["SLURM_JOB_NODELIST"] and got["SLURM_CPUS_PER_TASK"] == "2"
    print(f"\njob {job_id}: affinity per rank {[(x['rank'], x['node_rank'], x['cpu_affinity']) for x in ranks]}; "
          f"rank 0 environment {seen[0]}")


def test_plan_reads_the_real_clusters_preemption_settings(tmp_path, env):
    path, _ = _job(tmp_path, "plan", 2, [], slurm={"signal": "USR2@120"})
    r = cli("plan", str(path), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "placement: ok: sbatch: Job" in r.stdout and f"cluster halo, Slurm {slurm_version()}." in r.stdout
    assert "PreemptMode=OFF" in r.stdout and "warning: slurm.signal USR2@120" in r.stdout
    # sbatch --test-only submits nothing.
    assert not re.search(r"^\d+$", r.stdout, re.M)
