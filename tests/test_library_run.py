"""The library on the local backend with real torchrun: docs/library.md's pipeline block run as it
stands, examples/sweep.py end to end, logs as data from a real job, cancel(wait=True) on a job
that would run for minutes, and a run found again by id that retries as its job file says."""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

import halo_sched
from halo_sched.backends.base import JobStatus

from helpers import REPO, example_job, free_port

pytestmark = pytest.mark.torch


def _doc_block() -> str:
    text = (REPO / "docs" / "library.md").read_text()
    section = text[text.index("## A pipeline"):text.index("## The front door")]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_pipeline_in_docs_library_runs(monkeypatch, capsys):
    """The pipeline quoted in docs/library.md runs as written. Long: it submits and waits for real torchrun jobs."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("HALO_SCHED_BACKEND", raising=False)
    exec(compile(_doc_block(), "docs/library.md", "exec"), {})  # noqa: S102 - the documented example
    out = capsys.readouterr().out
    assert "0.1" in out and "rank 1" in out and "diverged" in out, out


def test_the_sweep_example_gathers_results_and_names_the_culprit(tmp_path):
    """examples/sweep.py on the local backend gathers results and names the culprit. Long: the sweep is three
    real torchrun jobs (one diverges on purpose), each trained to its end."""
    r = subprocess.run([sys.executable, str(REPO / "examples" / "sweep.py"), "--json", "--timeout", "240"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert sorted(out["results"]) == ["0.1", "0.3"] and not out["unknown"], out
    assert all(v["loss"] is not None and v["loss"] < 1e-3 for v in out["results"].values()), out
    culprit = out["failures"]["4.0"]["culprit"]
    assert out["failures"]["4.0"]["status"] == "FAILED" and culprit["rank"] == 1 and culprit["fault"] == "job", out
    assert culprit["host"] and culprit["error"].startswith("FloatingPointError: loss diverged"), culprit
    # docs/library.md: hostname is torchrun's (socket.getfqdn() on the node: here, this machine),
    # and on the local backend, with no scheduler's name for the node, host is the same.
    assert culprit["hostname"] == socket.getfqdn() == culprit["host"], culprit
    # The CLI sees the same jobs, from their records.
    st = subprocess.run([sys.executable, "-m", "halo_sched.cli", "status", out["failures"]["4.0"]["id"]], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
    assert st.returncode == 0 and "FloatingPointError" in st.stdout, st.stdout + st.stderr


def test_logs_by_node_and_rank_as_the_cli_prints_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # One write per line: torchrun's tee reads the rank's log file and prefixes what it finds, so a
    # line that print() writes in pieces can be read half-written ("hello from[rank 0]  0").
    (tmp_path / "hello.py").write_text("import os\nos.write(1, f\"hello from {os.environ['RANK']}\\n\".encode())\n")
    job = example_job(tmp_path, free_port(), nodes=2, nproc_per_node=2, trainer={"script": "hello.py"})
    run = halo_sched.submit(job, "local")
    assert run.result(timeout=180).status is JobStatus.COMPLETED
    lines = list(run.logs())
    assert {(x.node, x.rank, x.text) for x in lines if x.rank is not None} == {
        (k // 2, k, f"hello from {k}") for k in range(4)}, lines
    assert [str(x) for x in run.logs(rank=3)] == ["[node 1 rank 3] hello from 3\n"]
    assert all(x.node == 1 for x in run.logs(node=1)) and len(list(run.logs(node=1))) > 2
    cli = subprocess.run([sys.executable, "-m", "halo_sched.cli", "logs", run.id, "--node", "1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert cli.stdout == "".join(run.logs(node=1)), (cli.stdout, list(run.logs(node=1)))
    with pytest.raises(halo_sched.UsageError, match="node 2: job .* has 2 nodes"):
        run.logs(node=2)


def test_cancel_waits_for_the_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, setup=["sleep 300"])
    run = halo_sched.submit(job, "local")
    began = time.monotonic()
    state = run.cancel(timeout=60)
    assert state.status is JobStatus.CANCELLED and run.status().status is JobStatus.CANCELLED
    assert run.done() and time.monotonic() - began < 60
    with pytest.raises(halo_sched.JobCancelled):
        run.result(timeout=10)


def test_a_run_found_by_id_retries_as_its_job_file_says(tmp_path, monkeypatch):
    """Submitted and left (no waiter when the first attempt failed): the run's keeper submits the
    next attempt; ``halo_sched.run(id)`` later follows it and numbers both from 1."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_once.py", tmp_path / "node_fault_once.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, retry={"attempts": 2, "on": ["node"]},
                      trainer={"script": "node_fault_once.py", "args": []})
    first = halo_sched.submit(job, "local")
    assert first.current.wait(timeout=120).status is JobStatus.FAILED  # one attempt: this wait follows nothing
    run = halo_sched.run(first.id)
    assert run.result(timeout=180).status is JobStatus.COMPLETED and run.current.id != first.id
    assert [(a.number, a.status) for a in run.attempts()] == [(1, "FAILED"), (2, "COMPLETED")]
    assert halo_sched.run(run.current.id).id == first.id  # any attempt's id finds the run


def test_run_wait_async_retries_a_node_fault(tmp_path, monkeypatch):
    """``await run.wait_async()`` is ``run.wait()``: the node fault of the first attempt starts the
    second (claimed once in the store), which completes."""
    import asyncio

    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_once.py", tmp_path / "node_fault_once.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, retry={"attempts": 2, "on": ["node"]},
                      trainer={"script": "node_fault_once.py", "args": []})
    run = halo_sched.submit(job, "local")
    state = asyncio.run(run.wait_async(timeout=240))
    assert state.status is JobStatus.COMPLETED and run.current.id != run.id
    assert [(a.number, a.status) for a in run.attempts()] == [(1, "FAILED"), (2, "COMPLETED")]
