"""SLURM recovery at its edges, on the real cluster with real torchrun (issue 43 item 10): a run
submitted from a directory whose name has spaces, quotes and ``=`` is retried, and ``cancel RUN``
stops its successor while it waits; a second fault on the hot spare itself is the spare's; a job
requeued while its batch script was inside the successor's sbatch still submits the successor.
The trainer is tests/trainers/node_fault_once.py (node rank 1 prints an NCCL error and dies of a
SIGKILL nothing in the job sent, the node's evidence; ``FAULT_COUNTS``: on which restart counts)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env, until

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def env(slurm_cluster):
    return slurm_env(slurm_cluster, pythonpath=True)


def _job(where, **extra):
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_once.py", where / "node_fault_once.py")
    return example_job(where, free_port(), nproc_per_node=1, trainer={"script": "node_fault_once.py", "args": []},
                       **extra)


def _successor(where, run_id: str) -> dict | None:
    """The marker the failed attempt left, once it names the successor's job."""
    try:
        data = json.loads((where / f".halo-run-{run_id}.attempt-1.json").read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("job") else None


def _slurm_state(env, job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], env=env, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def test_a_run_from_a_directory_with_spaces_quotes_and_equals_goes_on_and_cancel_stops_its_waiting_successor(
        tmp_path, env):
    """Submitted from `it's "q" A=b x`: attempt 1's batch script reads its output file whole and
    submits attempt 2 (the one-line `scontrol show job` split on whitespace lost the path: "not
    retried: unknown cause"). A job holding node3 keeps attempt 2 (node2 excluded) pending:
    `cancel RUN` cancels it, naming it (it said "already ended (FAILED); nothing to cancel" and
    the successor trained later). About 12 s."""
    work = tmp_path / "it's \"q\" A=b x"
    work.mkdir()
    job = _job(work, retry={"attempts": 2, "on": ["node"]}, env={"FAULT_NODE": "1"})
    blocker = subprocess.run(["sbatch", "--parsable", "-w", "node3", "--exclusive", "-D", str(tmp_path), "-o",
                              "/dev/null", "--wrap", "sleep 300"], env=env, capture_output=True, text=True, timeout=60)
    assert blocker.returncode == 0, blocker.stderr
    assert until(lambda: _slurm_state(env, blocker.stdout.strip()) == "RUNNING", 60), "the blocker never ran"

    r = cli("submit", str(job), "--backend", "slurm", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[-1]
    marker = until(lambda: _successor(work, run_id), 120)
    out = next(work.glob(f"halo-*-{run_id}.out"), None)
    assert marker, out.read_text()[-3000:] if out else "no output file"
    succ = marker["job"]
    assert marker["culprit"] == "node2" and marker["excluded"] == ["node2"], marker
    assert until(lambda: _slurm_state(env, succ) == "PENDING", 30), _slurm_state(env, succ)

    r = cli("cancel", run_id, cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert f"halo-sched: cancel requested for {succ} (attempt 2 of run {run_id})" in r.stderr, r.stderr
    assert until(lambda: _slurm_state(env, succ) == "CANCELLED", 30), _slurm_state(env, succ)
    st = cli("status", run_id, cwd=work, env=env).stdout
    assert f"attempt 2: {succ} CANCELLED" in st, st


def test_a_second_fault_on_the_spare_itself_is_the_spare_s(tmp_path, env):
    """slurm.spare_nodes: 1 on three nodes: node rank 1 fails on node2 (step 1), node3 takes its
    rank, and fails too (step 2, FAULT_COUNTS 0,1). The batch script names node3 ("node3 failed
    ... no spares left"; it said "a node's fault on node2, which runs no rank"), and the job's
    culprit, the one the ledger gets beside the swapped-out node2, is node3. About 16 s."""
    job = _job(tmp_path, slurm={"spare_nodes": 1, "exclusive": True}, env={"FAULT_NODE": "1", "FAULT_COUNTS": "0,1"})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "120", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.split()[-1]
    seen = [ln.split()[:3] for ln in (tmp_path / "attempts.log").read_text().splitlines()]
    first = {int(n): h for c, n, h in seen if c == "0"}
    second = {int(n): h for c, n, h in seen if c == "1"}
    bad, spare = first[1], second[1]
    assert bad != spare and second[0] == first[0], seen
    text = next(tmp_path.glob(f"halo-*-{job_id}.out")).read_text()
    assert f"no spare swap: {spare} failed (" in text and "no spares left" in text, text[-3000:]

    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["status"] == "FAILED" and st["failure_class"]["host"] == spare, st.get("failure_class")
    ledger = {e["host"] for e in json.loads(cli("nodes", "--json", env=env).stdout)}
    assert ledger == {bad, spare}, ledger


def test_a_requeue_inside_the_successor_s_sbatch_still_submits_it(tmp_path, env):
    """`scontrol requeue` while the batch script waits in the successor's sbatch (a stand-in
    sbatch first on PATH holds the batch script's call until the requeue): the requeued run
    finds its earlier run's claim without a job, asks squeue (nothing), and submits attempt 2
    (it said "being submitted by another run of this script": the run was lost). Longer than
    the others, about 45 s: the requeued job may start again only cred_expire + 1 s (11 s here)
    after the requeue (slurmctld's batch_requeue_fini), and then runs its trainer again."""
    hold = tmp_path / "hold"
    hold.mkdir()
    real = shutil.which("sbatch", path=env["PATH"])
    (hold / "sbatch").write_text(
        "#!/bin/sh\n# The batch script's successor sbatch (HALO_RUN_ATTEMPT set) waits until the job is requeued.\n"
        f'if [ -n "${{HALO_RUN_ATTEMPT:-}}" ] && [ ! -e {hold}/requeued ]; then : > {hold}/inside; exec sleep 120; fi\n'
        f'exec {real} "$@"\n')
    (hold / "sbatch").chmod(0o755)
    env = {**env, "PATH": f"{hold}:{env['PATH']}"}
    job = _job(tmp_path, retry={"attempts": 2, "on": ["node"]}, slurm={"requeue": True},
               env={"FAULT_NODE": "1", "FAULT_COUNTS": "0,1"})
    r = cli("submit", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[-1]
    out = tmp_path / f"halo-ddp-cpu-{run_id}.out"
    assert until(lambda: (hold / "inside").exists(), 90), out.read_text()[-3000:] if out.exists() else "no output"
    (hold / "requeued").write_text("")
    q = subprocess.run(["scontrol", "requeue", run_id], env=env, capture_output=True, text=True, timeout=60)
    assert q.returncode == 0, q.stderr

    marker = until(lambda: _successor(tmp_path, run_id), 120)
    assert marker, out.read_text()[-3000:]
    assert marker["from_job"] == run_id and marker["from_run"] == 1, marker
    comments = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%k"], env=env, capture_output=True, text=True,
                              timeout=60).stdout.split()
    assert [c.split("|")[0] for c in comments if c.endswith(f"|halo-run:{run_id}.1")] == [marker["job"]], comments
    assert f"attempt 2 of run {run_id} submitted as {marker['job']}" in out.read_text(), out.read_text()[-3000:]
