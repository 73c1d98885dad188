"""Rollout servers beside the trainer (servers: in the job file), for real on the local backend
and the local SLURM cluster: a stand-in HTTP server (tests/servers/rollout_server.py) as the role
and a trainer (tests/servers/server_trainer.py) whose every rank GETs every URL it was given."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest
import yaml

import halo_sched
import halo_sched.spec
from halo_sched.backends.base import JobStatus
from halo_sched.node.processes import tagged
from halo_sched.errors import SpecError
from helpers import REPO, cli, free_port

SERVER = str(REPO / "tests" / "servers" / "rollout_server.py")
SECRET_MARK = "r0ll0ut-5ecret-91c2"
SECRET = f"{SECRET_MARK} it's $(x) ${{y}}"
TRAINER = str(REPO / "tests" / "servers" / "server_trainer.py")


def job_file(tmp_path, *, server_nodes=2, delay=1.0, die_after=None, timeout_s=60, hold=0.0, extra=None, nodes=2,
             secret=None):
    reports, rec = tmp_path / "reports", tmp_path / "rec"
    port = free_port()
    cmd = [sys.executable, SERVER, "--port", str(port), "--delay", str(delay), "--record-dir", str(rec),
           "--echo", "it's $(x) ${y}"]
    if die_after is not None:
        cmd += ["--die-after", str(die_after)]
    if secret:
        cmd += ["--env-hex", secret]
    data = {
        "name": "rl-test", "nodes": nodes, "nproc_per_node": 1,
        "trainer": {"script": TRAINER, "args": ["--report-dir", str(reports), "--hold", str(hold)]},
        "env": {"OMP_NUM_THREADS": "1"},
        "network": {"fabric": "efa"},
        "rendezvous": {"port": free_port(), "timeout_s": timeout_s},
        "servers": [{"name": "rollout-a", "nodes": server_nodes, "command": cmd, "port": port,
                     "group_port": free_port(), "env": {"SERVER_NOTE": "literal $HOME"},
                     **({"secret_env": [secret]} if secret else {})}],
        **(extra or {}),
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, reports, rec, data


# ---- validation -------------------------------------------------------------------------------


def _spec(**server):
    base = {"name": "x", "nodes": 2, "nproc_per_node": 1, "trainer": {"script": "t.py"},
            "rendezvous": {"port": 29500},
            "servers": [{"name": "vllm", "nodes": 1, "command": ["serve"], "port": 8000, **server}]}
    return base


@pytest.mark.parametrize("server, field, words", [
    ({"port": 29500}, "servers", "rendezvous.port"),
    ({"group_port": 29500}, "servers", "rendezvous.port"),
    ({"name": "Bad_Name"}, "servers[0].name", "lower-case"),
    ({"port": 80}, "servers[0].port", "greater than or equal"),
    ({"command": []}, "servers[0].command", "non-empty"),
    ({"env": {"HALO_X": "1"}}, "servers[0].env", "cannot be set"),
    ({"env": {"NCCL_NET": "x"}}, "servers", "derives"),
    ({"health_path": "health"}, "servers[0].health_path", "absolute"),
])
def test_validation_names_the_field(server, field, words):
    data = _spec(**server)
    if "NCCL_NET" in server.get("env", {}):
        data["network"] = {"fabric": "efa"}
    with pytest.raises(SpecError) as err:
        halo_sched.spec.from_dict(data)
    text = str(err.value)
    assert field in text and words in text, text


def test_duplicate_names_and_group_ports_are_refused():
    data = _spec()
    data["servers"].append(dict(data["servers"][0]))
    with pytest.raises(SpecError, match="names are unique"):
        halo_sched.spec.from_dict(data)
    data["servers"][1]["name"] = "other"
    data["servers"][0]["group_port"] = data["servers"][1]["group_port"] = 30000
    with pytest.raises(SpecError, match="each must differ"):
        halo_sched.spec.from_dict(data)


def test_cli_validate_exit_2_no_traceback(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text(yaml.safe_dump(_spec(port=29500)))
    r = cli("validate", str(p))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "servers" in r.stderr, r.stderr


# ---- local backend, for real --------------------------------------------------------------------


def _ranks(reports, n):
    return [json.loads((reports / f"rank{i}.json").read_text()) for i in range(n)]


@pytest.mark.torch
def test_local_trainer_waits_for_health_and_reaches_every_server(tmp_path):
    # The role's secret (servers[].secret_env) reaches each server from the submitter's environment.
    path, reports, rec, data = job_file(tmp_path, delay=2.0, secret="ROLLOUT_KEY")
    r = cli("submit", str(path), "--backend", "local", "--wait", env={**os.environ, "ROLLOUT_KEY": SECRET}, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert SECRET_MARK not in r.stdout + r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    ranks = _ranks(reports, 2)
    port = data["servers"][0]["port"]
    for rep in ranks:
        urls = rep["urls"]["HALO_SERVER_ROLLOUT_A_URLS"]
        # One URL per server node, in node order, each answered by that node's server.
        assert [u["url"] for u in urls] == [f"http://127.0.1.1:{port}", f"http://127.0.1.2:{port}"]
        assert [u["body"]["server"] for u in urls] == ["rollout-a-0", "rollout-a-1"]
        assert urls[0]["body"]["master"] == "127.0.0.1"
        # The servers' fabric env is the trainer's (EFA here), and a hostile arg arrived literal.
        assert urls[0]["body"]["nccl_net"] == rep["nccl_net"] == "Libfabric"
        assert bytes.fromhex(urls[0]["body"]["echo_hex"]).decode() == "it's $(x) ${y}"
        assert all(bytes.fromhex(u["body"]["env_hex"]["ROLLOUT_KEY"]).decode() == SECRET for u in urls)
        assert rep["group_ports"] == {"HALO_SERVER_ROLLOUT_A_GROUP_PORT": str(data["servers"][0]["group_port"])}
    # Every rank started after every server's first 200 on /health.
    for k in (0, 1):
        served = [json.loads(x) for x in (rec / f"rollout-a-{k}.jsonl").read_text().splitlines()]
        first_ok = min(x["t"] for x in served if x["path"] == "/health" and x["code"] == 200)
        assert all(rep["started"] > first_ok for rep in ranks)
        assert {x["path"] for x in served if x["path"].startswith("/from-rank-")} == {"/from-rank-0", "/from-rank-1"}
    last_ok = max(min(json.loads(x)["t"] for x in (rec / f"rollout-a-{k}.jsonl").read_text().splitlines()
                      if json.loads(x)["code"] == 200) for k in (0, 1))
    print(f"health -> trainer start: {min(r['started'] for r in ranks) - last_ok:.2f}s")
    # The servers are gone with the job: no process of it is left.
    d = halo_sched.job(job_id, "local").scheduler.root / job_id
    assert tagged(str(d)) == []
    logs = cli("logs", job_id, "--backend", "local").stdout
    assert "[server rollout-a 1] rollout server rollout-a-1" in logs
    assert SECRET_MARK not in logs
    home = halo_sched.job(job_id, "local").scheduler.root
    assert not [p for p in home.rglob("*") if p.is_file() and SECRET_MARK.encode() in p.read_bytes()]


@pytest.mark.torch
def test_local_server_never_healthy_fails_naming_it_within_the_timeout(tmp_path):
    path, reports, rec, _ = job_file(tmp_path, delay=1000, timeout_s=4, server_nodes=1)
    t0 = time.monotonic()
    r = cli("submit", str(path), "--backend", "local", "--wait", timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1
    assert "server rollout-a[0] did not answer 200 at http://127.0.1.1:" in r.stderr, r.stderr[-3000:]
    assert "HTTP 503" in r.stderr
    assert elapsed < 40
    job_id = r.stdout.strip().splitlines()[-1]
    d = halo_sched.job(job_id, "local").scheduler.root / job_id
    assert tagged(str(d)) == []


@pytest.mark.torch
def test_local_dead_server_fails_the_job(tmp_path):
    path, reports, rec, _ = job_file(tmp_path, delay=0, die_after=4, hold=60, server_nodes=1)
    r = cli("submit", str(path), "--backend", "local", "--wait", timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    st = halo_sched.job(job_id, "local").status()
    assert st.status is JobStatus.FAILED
    assert "server rollout-a 0 exited with 3" in st.reason
    d = halo_sched.job(job_id, "local").scheduler.root / job_id
    assert tagged(str(d)) == []


# ---- the real SLURM cluster: 2 trainer nodes + 1 server node -----------------------------------


@pytest.fixture
def slurm_env(slurm_cluster):
    e = dict(os.environ)
    e.update(slurm_cluster)
    e["PATH"] = f"{os.path.dirname(sys.executable)}:{e['PATH']}"
    return e


@pytest.mark.slurm
@pytest.mark.torch
@pytest.mark.parametrize("interface", [None, "lo"])
def test_slurm_trainer_and_server_nodes_in_one_allocation(tmp_path, slurm_env, interface):
    # interface: each server node says its own address on it, in a short srun step (real srun's
    # --label and --relative); here lo, so the URL is the same loopback address as NodeAddr.
    network = {"fabric": "efa", **({"interface": interface} if interface else {})}
    path, reports, rec, data = job_file(tmp_path, server_nodes=1, delay=2.0, extra={"network": network},
                                        secret="ROLLOUT_KEY")
    r = cli("submit", str(path), "--backend", "slurm", "--wait", cwd=tmp_path, env={**slurm_env, "ROLLOUT_KEY": SECRET},
            timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    port = data["servers"][0]["port"]
    for rep in _ranks(reports, 2):
        (u,) = rep["urls"]["HALO_SERVER_ROLLOUT_A_URLS"]
        assert u["url"] == f"http://127.0.0.1:{port}" and u["body"]["server"] == "rollout-a-0"
        assert u["body"]["nccl_net"] == "Libfabric"
        assert bytes.fromhex(u["body"]["env_hex"]["ROLLOUT_KEY"]).decode() == SECRET  # through sbatch's environment
    logs = cli("logs", job_id, "--backend", "slurm", cwd=tmp_path, env=slurm_env).stdout
    assert "[server rollout-a 0]" in logs and "healthy at" in logs
    assert SECRET_MARK not in logs + r.stdout + r.stderr
    # The server step was stopped when the trainer ended: nothing of the job still runs.
    served = (rec / "rollout-a-0.jsonl").read_text()
    pid = json.loads(served.splitlines()[0])["pid"]
    # `--wait` returns within a second of SLURM reporting the end; slurmstepd may still be
    # stopping the server step then (KillWait), so allow it a bounded while.
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not os.path.exists(f"/proc/{pid}"), "the server outlived the job"


@pytest.mark.slurm
@pytest.mark.torch
def test_slurm_dead_server_fails_the_job(tmp_path, slurm_env):
    path, reports, rec, _ = job_file(tmp_path, server_nodes=1, delay=0, die_after=6, hold=90)
    t0 = time.monotonic()
    r = cli("submit", str(path), "--backend", "slurm", "--wait", cwd=tmp_path, env=slurm_env, timeout=180)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 80, "the trainer ran on after its server died"
    job_id = r.stdout.strip().splitlines()[-1]
    logs = cli("logs", job_id, "--backend", "slurm", cwd=tmp_path, env=slurm_env).stdout
    assert "server rollout-a ended (exit 3) while the trainer ran" in logs, logs[-3000:]
