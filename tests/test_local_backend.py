"""The local backend end to end: real torchrun processes with gloo on the CPU."""
from __future__ import annotations

import json
import os
import time

import pytest

import halo_sched
from halo_sched.backends.base import JobStatus
from halo_sched.node.processes import same_process
from helpers import HOSTILE, cli, example_job, free_port, live_group_members

pytestmark = pytest.mark.torch


def test_example_forms_one_world_and_hostile_env_arrives_exact(tmp_path):
    reports = tmp_path / "reports"
    job = example_job(
        tmp_path, free_port(),
        env={"OMP_NUM_THREADS": "1", "HOSTILE": HOSTILE},
        trainer={"script": "examples/train_ddp.py",
                 "args": ["--steps", "5", "--report-dir", str(reports), "--echo-env", "HOSTILE"]},
    )
    r = cli("submit", str(job), "--backend", "local", "--wait")
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    assert job_id.startswith("ddp-cpu-")
    assert "[node 0]" in r.stderr and "[node 1]" in r.stderr  # live logs, node-prefixed

    ranks = [json.loads((reports / f"rank{i}.json").read_text()) for i in range(4)]
    assert {r["world_size"] for r in ranks} == {4}
    assert sorted((r["rank"], r["node_rank"]) for r in ranks) == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert all(r["ok"] and r["all_reduce"] == 6 for r in ranks)
    for rep in ranks:
        assert bytes.fromhex(rep["env_hex"]["HOSTILE"]) == HOSTILE.encode()

    st = cli("status", job_id, "--backend", "local", "--json")
    assert json.loads(st.stdout)["status"] == "COMPLETED"
    logs = cli("logs", job_id, "--backend", "local").stdout
    assert "[node 0 rank 0] world: 4 ranks on 2 nodes (node ranks [0, 1])" in logs and "OK" in logs


def test_one_failing_rank_fails_the_job(tmp_path):
    job = example_job(tmp_path, free_port(),
                      trainer={"script": "examples/train_ddp.py", "args": ["--steps", "3", "--fail-rank", "3"]})
    r = cli("submit", str(job), "--wait", "--quiet")
    assert r.returncode == 1
    job_id = r.stdout.strip().splitlines()[-1]
    st = halo_sched.job(job_id, "local").status()
    assert st.status is JobStatus.FAILED
    assert st.exit_code not in (None, 0)
    assert "node 1" in st.reason  # rank 3 lives on node 1


def test_cancel_stops_every_node(tmp_path):
    job = example_job(tmp_path, free_port(), setup=["echo started", "sleep 300"])
    spec = halo_sched.load(job)
    handle = halo_sched.submit(spec, "local")
    deadline = time.monotonic() + 30
    while handle.status().status is not JobStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    state = json.loads((handle.scheduler.root / handle.id / "state.json").read_text())
    pids = state["pids"]
    handle.cancel()
    final = handle.wait(timeout=30, poll=0.2)
    assert final.status is JobStatus.CANCELLED
    for pid in pids:  # each node's whole process group is gone (zombies hold nothing)
        assert live_group_members(pid) == []


def test_two_default_port_jobs_run_at_once(tmp_path):
    """Without rendezvous.port, each local job takes a port free at its submit: two jobs run at
    once on this one host (with one port for both, the second rank 0 fails with EADDRINUSE)."""
    import yaml

    handles = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        path = example_job(d, free_port(), nproc_per_node=1, trainer={
            "script": "examples/train_ddp.py", "args": ["--steps", "30", "--step-time", "0.2", "--report-dir", str(d)]})
        data = yaml.safe_load(path.read_text())
        del data["rendezvous"]["port"]
        path.write_text(yaml.safe_dump(data))
        handles.append(halo_sched.submit(halo_sched.load(path), "local"))
    deadline = time.monotonic() + 60
    while not all(h.status().status is JobStatus.RUNNING for h in handles):
        assert time.monotonic() < deadline and not any(h.status().status.terminal for h in handles)
        time.sleep(0.2)
    ends = [h.wait(timeout=180, poll=0.5) for h in handles]
    assert [e.status for e in ends] == [JobStatus.COMPLETED] * 2, [e.describe() for e in ends]
    ports = [json.loads((h.scheduler.root / h.id / "job.json").read_text())["master_port"] for h in handles]
    assert ports[0] != ports[1]


def test_busy_rendezvous_port_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        job = example_job(tmp_path, s.getsockname()[1])
        r = cli("submit", str(job))
    assert r.returncode == 1
    assert "rendezvous.port" in r.stderr and "in use" in r.stderr and "Traceback" not in r.stderr


def test_unknown_job_id():
    r = cli("status", "nope-123", "--backend", "local")
    assert r.returncode == 2 and "no job 'nope-123'" in r.stderr and r.stdout == ""
    r = cli("logs", "../etc", "--backend", "local")
    assert r.returncode == 2 and "not a local job id" in r.stderr


def test_gpus_are_split_between_nodes(tmp_path, monkeypatch):
    from halo_sched.backends.local import _gpu_sets_for

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert _gpu_sets_for([4, 4]) == ["0,1,2,3", "4,5,6,7"]
    assert _gpu_sets_for([0, 0]) is None
    from halo_sched.errors import SchedulerError

    with pytest.raises(SchedulerError, match="needs 16 GPUs"):
        _gpu_sets_for([8, 8])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert _gpu_sets_for([1, 1]) == ["3", "5"]


def _torchrun_that_exits_0(tmp_path) -> str:
    """A setup line that puts a stand-in torchrun (exit 0) first on PATH (`exit 0` in setup fails the node)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "torchrun").chmod(0o755)
    return f'export PATH="{bindir}:$PATH"'


def test_logs_follow_streams_until_the_job_ends(tmp_path):
    # A torchrun that exits at once: a job that only prints.
    job = example_job(tmp_path, free_port(), setup=["echo first", "sleep 2", "echo second", _torchrun_that_exits_0(tmp_path)])
    r = cli("submit", str(job))
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    t0 = time.monotonic()
    follow = cli("logs", job_id, "--follow", timeout=60)
    assert follow.returncode == 0
    assert time.monotonic() - t0 >= 1  # it waited for the job rather than printing what was there
    lines = follow.stdout.splitlines()
    for rank in (0, 1):
        assert lines.index(f"[node {rank}] first") < lines.index(f"[node {rank}] second")
    assert halo_sched.job(job_id, "local").status().status is JobStatus.COMPLETED


def _running(handle, timeout=30):
    deadline = time.monotonic() + timeout
    while handle.status().status is not JobStatus.RUNNING:
        assert time.monotonic() < deadline, handle.status()
        time.sleep(0.2)


def test_cancel_leaves_no_process_even_one_that_ignores_sigterm_in_its_own_session(tmp_path):
    stray = tmp_path / "stray.pid"
    # Like torchrun's workers: a new session (so not in the node's process group), deaf to SIGTERM.
    job = example_job(tmp_path, free_port(),
                      setup=[f"setsid bash -c 'trap \"\" TERM; exec sleep 300' & echo $! >> {stray}", "sleep 300"])
    handle = halo_sched.submit(halo_sched.load(job), "local")
    _running(handle)
    deadline = time.monotonic() + 10
    while len(stray.read_text().split() if stray.exists() else []) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pids = [int(p) for p in stray.read_text().split()]
    handle.cancel()
    assert handle.wait(timeout=60, poll=0.2).status is JobStatus.CANCELLED
    for pid in pids:
        assert not live_group_members(pid) and not same_process(pid, None)


def test_cancel_right_after_submit_is_cancelled(tmp_path):
    handle = halo_sched.submit(halo_sched.load(example_job(tmp_path, free_port(), setup=["sleep 300"])), "local")
    handle.cancel()
    assert handle.wait(timeout=60, poll=0.2).status is JobStatus.CANCELLED


def test_dead_supervisor_is_reported_and_cancel_still_stops_the_nodes(tmp_path):
    import signal

    handle = halo_sched.submit(halo_sched.load(example_job(tmp_path, free_port(), setup=["sleep 300"])), "local")
    _running(handle)
    d = handle.scheduler.root / handle.id
    node_groups = json.loads((d / "state.json").read_text())["pids"]
    os.kill(int((d / "supervisor.pid").read_text().split()[0]), signal.SIGKILL)
    st = handle.wait(timeout=30, poll=0.2)
    assert st.status is JobStatus.FAILED and "supervisor" in st.reason
    assert any(live_group_members(g) for g in node_groups)  # the nodes outlived it...
    handle.scheduler.cancel([handle.id])
    assert handle.status().status is JobStatus.CANCELLED
    deadline = time.monotonic() + 10
    while any(live_group_members(g) for g in node_groups):  # ...until cancel stopped them
        assert time.monotonic() < deadline
        time.sleep(0.1)



def test_no_orphan_tree_outlives_the_job(tmp_path):
    pids = tmp_path / "pids"
    # Three levels deep, in new sessions, one deaf to SIGTERM with a child of its own.
    job = example_job(tmp_path, free_port(), nodes=1, setup=[
        f"setsid bash -c 'bash -c \"echo \\$\\$ >> {pids}; exec sleep 1001\"; :' </dev/null >/dev/null 2>&1 &",
        f"setsid bash -c 'trap \"\" TERM; sleep 1002 & echo $! >> {pids}; wait' </dev/null >/dev/null 2>&1 &",
        f"while [ $(wc -l < {pids} 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.1; done",
        _torchrun_that_exits_0(tmp_path),
    ])
    r = cli("submit", str(job), "--wait", "-q", timeout=120)
    assert r.returncode == 0, r.stderr
    for pid in map(int, pids.read_text().split()):
        assert not same_process(pid, None), pid
