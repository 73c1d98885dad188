"""The library on the SLURM test cluster: examples/sweep.py end to end (the culprit's host is a
SLURM node), and a smaller fan-out than tests/test_library_concurrency.py's: 8 jobs from 4
threads and 8 from 4 processes, with node faults on some: every job's record with its final
state, every node fault's ledger entry (one per job), every notification queued once."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import halo_sched

from helpers import REPO, slurm_env
from test_library_concurrency import TRAINER, WORKER, fan_out_in_threads

pytestmark = [pytest.mark.slurm]

# Four writers at once, two jobs each (on the cluster's three nodes: a few at a time), node and job faults
# and completions among them. It was twelve: four more real jobs a test through each release's chain, which
# runs one test at a time and is the suite's longest path (tests/suite.sh).
JOBS = 8
WORKERS = 4


@pytest.fixture
def env(slurm_cluster, monkeypatch):
    e = slurm_env(slurm_cluster, pythonpath=True)
    for k, v in e.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HALO_SCHED_BACKEND", "slurm")
    return e


def _kind(k: int) -> str:
    return "node" if k % 3 == 0 else "job" if k % 4 == 1 else "ok"


def _job_file(tmp_path):
    (tmp_path / "fan.py").write_text(TRAINER)
    job = tmp_path / "fan.yaml"
    job.write_text(json.dumps({"name": "fan", "nodes": 1, "nproc_per_node": 1,
                               "trainer": {"script": str(tmp_path / "fan.py")}, "env": {"OMP_NUM_THREADS": "1"},
                               # Every node may be ledgered by now: this test counts entries, not avoidance.
                               "avoid_ledgered_nodes": False,
                               "notify": {"webhook_env": "HOOK_URL", "on": ["failed", "completed"]},
                               "rendezvous": {"timeout_s": 120}}))
    return job


def _check(ids: dict) -> None:
    from halo_sched import db, ledger, records

    assert sorted(ids) == list(range(JOBS)), ids
    assert {k: v[1] for k, v in ids.items()} == {k: "COMPLETED" if _kind(k) == "ok" else "FAILED"
                                                 for k in range(JOBS)}
    for k, (job_id, status) in ids.items():
        recs = records.find(job_id, "slurm")
        assert len(recs) == 1 and (recs[0].get("last_state") or {}).get("status") == status, (k, recs)
    node_jobs = {ids[k][0] for k in range(JOBS) if _kind(k) == "node"}
    entries = [e for e in ledger.entries() if e.job in node_jobs]
    assert sorted(e.job for e in entries) == sorted(node_jobs), (sorted(node_jobs), ledger.entries())
    assert all(e.host.startswith("node") for e in entries), entries
    rows = db.read("SELECT job, event FROM outbox WHERE backend = 'slurm'")
    assert sorted(rows) == sorted((ids[k][0], "completed" if _kind(k) == "ok" else "failed") for k in range(JOBS))


def test_the_sweep_example_on_slurm(env, tmp_path):
    """examples/sweep.py on SLURM, as documented. Long: the sweep runs several real torchrun jobs on the cluster."""
    r = subprocess.run([sys.executable, str(REPO / "examples" / "sweep.py"), "--backend", "slurm", "--json",
                        "--timeout", "300"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert sorted(out["results"]) == ["0.1", "0.3"], out
    # Rank 0's value, read back from beside the output file (.halo-result/JOB_ID.json).
    assert all(isinstance(v["loss"], float) and v["loss"] < 1e-3 for v in out["results"].values()), out
    culprit = out["failures"]["4.0"]["culprit"]
    assert culprit["rank"] == 1 and culprit["fault"] == "job" and culprit["host"].startswith("node"), culprit
    assert "loss diverged" in culprit["error"], culprit


def test_jobs_from_four_threads_on_slurm(tmp_path, env, monkeypatch):
    """Eight jobs from four threads on the SLURM cluster: every one recorded and followed. Long: eight
    real jobs through a 3-node cluster, a few at a time."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/hook")  # queued is what is counted here
    base = halo_sched.spec_from_yaml(_job_file(tmp_path))
    ids = fan_out_in_threads(base, JOBS, WORKERS, _kind, timeout=300)
    _check(ids)


def test_jobs_from_four_processes_on_slurm(tmp_path, env, monkeypatch):
    """Eight jobs from four processes on the SLURM cluster: every one recorded and followed, the
    history store shared across processes. Long: eight real jobs through a 3-node cluster, a few
    at a time."""
    monkeypatch.chdir(tmp_path)
    job = _job_file(tmp_path)
    penv = {**os.environ, "HOOK_URL": "http://127.0.0.1:9/hook"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(job),
                               json.dumps([(k, _kind(k)) for k in range(w, JOBS, WORKERS)])],
                              cwd=tmp_path, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WORKERS)]
    ids: dict = {}
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        ids.update({int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()})
    _check(ids)
