"""On the real SLURM cluster: a 2-node job with retry: {attempts: 2, on: [node]} whose node 1
fails as a bad node would on the first attempt only (its rank prints a stand-in NCCL NET/IB error,
a label, and dies of a SIGKILL nothing in the job sent, the node's evidence: see
tests/trainers/node_fault_once.py). The failed attempt's batch script submits the second
attempt with that host excluded (halo_sched/node/successor.py), and ``submit --wait`` follows it; it runs on the other two nodes and completes; the host is in the node
ledger; ``status RUN`` shows both attempts with their node-hours and GPU-hours, counted from
SLURM's own start and end times. A Python exception is not retried."""
from __future__ import annotations

import re
import shutil
import time

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm]
#: The node's evidence decides (the signal), the rank's words label (node/failure_classes.py).
REASON = "killed by SIGKILL (nothing in the job sent it); the rank reported an NCCL network error"


@pytest.fixture
def env(slurm_cluster):
    return slurm_env(slurm_cluster, pythonpath=True)


def _job(tmp_path, trainer: str, retry: dict):
    shutil.copy(REPO / "tests" / "trainers" / trainer, tmp_path / trainer)
    return example_job(tmp_path, free_port(), nproc_per_node=1, retry=retry, trainer={"script": trainer, "args": []})


def test_a_node_fault_on_slurm_is_retried_on_other_nodes_and_the_run_completes(tmp_path, env):
    job = _job(tmp_path, "node_fault_once.py", {"attempts": 2, "on": ["node"]})
    began = time.time()
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "240", cwd=tmp_path, env=env,
            timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run_id = r.stdout.strip().splitlines()[-1]
    m = re.search(r"FAILED \(node fault: host (\S+), " + re.escape(REASON) + r"\)", r.stderr)
    assert m and "retrying (node fault) as " in r.stderr, r.stderr[-3000:]
    host = m.group(1)
    # Which host ran which attempt (each rank wrote its HALO_RESTART_COUNT and SLURM's node name).
    seen = [ln.split() for ln in (tmp_path / "attempts.log").read_text().splitlines()]
    first = {h for c, _, h, _ in seen if c == "0"}
    second = {h for c, _, h, _ in seen if c == "1"}
    assert host in first and len(second) == 2 and host not in second, seen
    # Recovery: the culprit's failure line to the second attempt's first rank starting.
    failed_at = max(float(t) for c, n, _, t in seen if c == "0")
    retrained_at = min(float(t) for c, _, _, t in seen if c == "1")
    print(f"recovery: {retrained_at - failed_at:.1f} s from the first attempt's ranks to the second's "
          f"(whole run {time.time() - began:.1f} s)")

    nodes = cli("nodes", env=env).stdout
    assert host in nodes and f"{run_id}@slurm" in nodes, nodes
    st = cli("status", run_id, cwd=tmp_path, env=env)
    assert st.returncode == 0, st.stderr
    lines = st.stdout.splitlines()
    a1 = [ln for ln in lines if "\tattempt 1: " in ln]
    a2 = [ln for ln in lines if "\tattempt 2: " in ln]
    assert len(a1) == 1 and f"host {host}, {REASON}" in a1[0] and " FAILED " in a1[0], lines
    assert len(a2) == 1 and " COMPLETED;" in a2[0] and f"excluded {host}" in a2[0], lines
    assert any("\trun: 2 attempts, " in ln and " GPU-h (0.0000 lost to failures)" in ln for ln in lines), lines

    from halo_sched.runs import attempts_of, totals

    rows = attempts_of(run_id, "slurm")
    assert [a.status for a in rows] == ["FAILED", "COMPLETED"], rows
    assert all(a.clock == "scheduler" and a.nodes == 2 for a in rows), rows
    t = totals(rows)
    assert t["gpu_hours"] == 0 and t["node_hours"] >= t["node_hours_lost"] > 0, t  # a CPU job: GPU-hours 0
    print("attempts:", [a.to_dict() for a in rows])


def test_a_python_exception_on_slurm_is_not_retried(tmp_path, env):
    job = _job(tmp_path, "raise_always.py", {"attempts": 2, "on": ["node"]})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "240", cwd=tmp_path, env=env,
            timeout=600)
    assert r.returncode == 1 and "retrying" not in r.stderr, r.stderr[-3000:]
    assert "job fault" in r.stderr or "ValueError: bad learning rate" in r.stderr, r.stderr[-3000:]
    assert (tmp_path / "attempts.log").read_text().split() == ["0"]
