"""A pipeline fans out: 24 jobs submitted and waited on through the library from 8 threads, and
again from 8 processes, on the local backend with real torchrun (1 node x 1 process each, a
trainer that imports nothing). Nothing is lost: every job has its record with its final state
and failure class (the ledger's entries: tests/test_library_slurm.py), every job its one notification in the outbox (and one POST at
a receiver on loopback), whatever the interleaving: the store's transactions (halo_sched/db.py)
are what the library's waits write through."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import halo_sched

from helpers import REPO
from test_notify import Receiver, _posts

pytestmark = pytest.mark.torch

# Eight writers at once is the contention under test (each submits its three jobs, then waits on each).
# It was 50 jobs: the two tests took 360 s of the suite's 2,800 s of CPU (a torchrun agent's torch import
# and a keeper a job) for the same eight-way contention.
JOBS = 24
WORKERS = 8

TRAINER = """import os, signal, sys
kind = os.environ["KIND"]
if kind == "node":  # a bad node (tests/trainers/node_fault.py): its words, then the node's SIGKILL: a node fault
    print("h:1:2 [0] transport/net_ib.cc:2470 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with "
          "status=12 opcode=129 len=65536 vendor err 129 (Recv)", file=sys.stderr, flush=True)
    print("[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
          "NCCLUtils.hpp:317, unhandled system error, NCCL version 2.21.5", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
if kind == "job":
    raise ValueError("bad learning rate: -1")
print("ok", flush=True)
"""

#: Each worker's part of the sweep: submit all of its jobs first, then wait on each.
WORKER = """import json, sys
import halo_sched
base = halo_sched.spec_from_yaml(sys.argv[1])
out = {}
runs = [(k, halo_sched.submit(halo_sched.with_changes(base, {"name": f"fan-{k}", "env": {"KIND": kind}})))
        for k, kind in json.loads(sys.argv[2])]
for k, run in runs:
    try:
        out[k] = [run.id, run.result(timeout=240).status.value]
    except halo_sched.JobFailed as err:
        out[k] = [run.id, err.state.status.value]
print(json.dumps(out))
"""


def fan_out_in_threads(base, jobs: int, workers: int, kind, timeout: float) -> dict[int, list]:
    """Job k of ``jobs`` (KIND=kind(k)) submitted by worker k % ``workers``, each worker a thread
    that submits all of its jobs first, then waits on each: {k: [id, final status]}."""
    ids: dict[int, list] = {}
    errors: list = []

    def worker(w: int) -> None:
        try:
            runs = [(k, halo_sched.submit(halo_sched.with_changes(base, {"name": f"fan-{k}", "env": {"KIND": kind(k)}})))
                    for k in range(w, jobs, workers)]
            for k, run in runs:
                try:
                    ids[k] = [run.id, run.result(timeout=timeout).status.value]
                except halo_sched.JobFailed as err:
                    ids[k] = [run.id, err.state.status.value]
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    return ids


def _kind(k: int) -> str:
    return "node" if k % 5 == 0 else "job" if k % 7 == 0 else "ok"


def _job_file(tmp_path):
    (tmp_path / "fan.py").write_text(TRAINER)
    job = tmp_path / "fan.yaml"
    job.write_text(json.dumps({"name": "fan", "nodes": 1, "nproc_per_node": 1,
                               "trainer": {"script": str(tmp_path / "fan.py")}, "env": {"OMP_NUM_THREADS": "1"},
                               "notify": {"webhook_env": "HOOK_URL", "on": ["failed", "completed"]},
                               "rendezvous": {"timeout_s": 120}}))
    return job


def _check_nothing_lost(ids: dict[int, list], receiver) -> None:
    from halo_sched import db, ledger, records

    assert sorted(ids) == list(range(JOBS)), sorted(ids)
    expected = {k: "COMPLETED" if _kind(k) == "ok" else "FAILED" for k in range(JOBS)}
    assert {k: v[1] for k, v in ids.items()} == expected
    # Every record, with its final state.
    for k, (job_id, status) in ids.items():
        recs = records.find(job_id, "local")
        assert len(recs) == 1 and (recs[0].get("last_state") or {}).get("status") == status, (k, recs)
    # Every node fault is one in its record (the local backend ledgers no host: it has one;
    # tests/test_library_slurm.py counts the ledger's entries on the cluster).
    for k in range(JOBS):
        cls = (records.find(ids[k][0], "local")[0].get("last_state") or {}).get("failure_class") or {}
        assert (cls.get("class") == "node") == (_kind(k) == "node"), (k, cls)
    assert ledger.entries() == []
    # Every job's event, queued once, and delivered once.
    rows = db.read("SELECT job, event FROM outbox")
    want = {(ids[k][0], "completed" if _kind(k) == "ok" else "failed") for k in range(JOBS)}
    assert sorted(rows) == sorted(want), set(rows) ^ want
    posts = _posts(receiver, JOBS, seconds=120)
    got = sorted((p["job"], p["state"]) for _, p in posts)
    assert got == sorted(want), (len(got), set(got) ^ want)


def test_jobs_from_eight_threads_lose_nothing(tmp_path, monkeypatch):
    """Twenty-four jobs submitted from eight threads at once: every record kept. Long: two dozen real local
    jobs are the point (the store's lock under that much contention)."""
    receiver = Receiver()
    monkeypatch.setenv("HOOK_URL", receiver.url)
    monkeypatch.chdir(tmp_path)
    try:
        base = halo_sched.spec_from_yaml(_job_file(tmp_path))
        ids = fan_out_in_threads(base, JOBS, WORKERS, _kind, timeout=240)
        _check_nothing_lost(ids, receiver)
    finally:
        receiver.close()


def test_jobs_from_eight_processes_lose_nothing(tmp_path, monkeypatch):
    """Twenty-four jobs submitted from eight processes at once: every record kept. Long: two dozen real local
    jobs are the point (the store's lock under that much contention)."""
    receiver = Receiver()
    monkeypatch.chdir(tmp_path)
    try:
        job = _job_file(tmp_path)
        env = {**os.environ, "HOOK_URL": receiver.url, "PYTHONPATH": str(REPO)}
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(job),
                                   json.dumps([(k, _kind(k)) for k in range(w, JOBS, WORKERS)])],
                                  cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for w in range(WORKERS)]
        ids: dict[int, list] = {}
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            ids.update({int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()})
        _check_nothing_lost(ids, receiver)
    finally:
        receiver.close()
