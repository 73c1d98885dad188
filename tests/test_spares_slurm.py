"""On the real SLURM cluster (3 nodes): a 2-node job with slurm.spare_nodes: 1 holds all three
(--no-kill); node rank 0 fails as a bad node would on the first step (tests/trainers/
node_fault_once.py with FAULT_NODE=0: an NCCL NET/IB error printed, then a SIGKILL nothing in the job
sent, the node's evidence); the batch script gives rank 0 to the
spare and starts the step again in the same job with HALO_RESTART_COUNT 1, without the queue.
Rank 0 moving is the hard case: its address is read again, and the spare (node3) comes after
node2 in the step, where SLURM_NODEID would have made it rank 1: the rank map decides. The job ends
COMPLETED, `status` says the spare is used and which node it replaced, and the node ledger holds
the bad node (from the batch script's signed swap line: the job itself never FAILED).

The same job carries `retry: {attempts: 2, on: [node, job]}` (issue 39 item 1): on the spare's step
(HALO_RESTART_COUNT 1) node rank 1 raises a Python exception after reporting step 5, the job's own
fault; the batch script starts the ranks again in place, on the same nodes (HALO_RESTART_COUNT 2),
and `status` counts the restart in place from its signed line. One job for both: a SLURM test
costs its torchrun start-ups."""
from __future__ import annotations

import json
import shutil

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
#: The node's evidence decides (the signal), the rank's words label (node/failure_classes.py).
REASON = "killed by SIGKILL (nothing in the job sent it); the rank reported an NCCL network error"


def test_a_node_fault_is_swapped_for_the_spare_and_a_job_fault_restarts_in_place_in_the_same_job(tmp_path,
                                                                                                 slurm_cluster):
    """A node's fault is swapped for the spare in the same job, then the job's own fault restarts
    in place. Long (about 20 s): a real torchrun trains, fails on one node, trains again on the spare,
    fails by its own fault and trains a third time, in one allocation."""
    env = slurm_env(slurm_cluster, pythonpath=True)
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_once.py", tmp_path / "node_fault_once.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, trainer={"script": "node_fault_once.py", "args": []},
                      slurm={"spare_nodes": 1, "exclusive": True}, retry={"attempts": 2, "on": ["node", "job"]},
                      env={"FAULT_NODE": "0", "JOB_FAULT_COUNTS": "1", "JOB_FAULT_NODE": "1"})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "180", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]

    # count node host: the first step on two hosts, the second with the spare in rank 0's place, the
    # third (in place) on the second's hosts.
    seen = [ln.split()[:3] for ln in (tmp_path / "attempts.log").read_text().splitlines()]
    first = {int(n): h for c, n, h in seen if c == "0"}
    second = {int(n): h for c, n, h in seen if c == "1"}
    third = {int(n): h for c, n, h in seen if c == "2"}
    assert sorted(first) == [0, 1] and sorted(second) == [0, 1] and third == second, seen
    bad, spare = first[0], second[0]
    assert second[1] == first[1] and spare not in first.values(), seen
    assert {c for c, _, _ in seen} == {"0", "1", "2"}, seen  # one job: the same id throughout

    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["status"] == "COMPLETED"
    assert st["spares"]["total"] == 1 and st["spares"]["left"] == 0
    assert [(s["rank"], s["bad"], s["spare"], s["reason"]) for s in st["spares"]["swaps"]] == [
        (0, bad, spare, REASON)], st["spares"]
    assert [(r["action"], r["restart"], r["attempt"], r["reason"], r["step"]) for r in st["in_place_restarts"]] == [
        ("inplace", 2, 1, "job fault: Python exception", 5)], st["in_place_restarts"]
    assert "crash_loop" not in st
    text = cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert (f"COMPLETED exit=0; 0 of 1 spare left ({bad} -> {spare}: {REASON}); 1 restart in place (job fault: "
            "Python exception at step 5)") in text, text
    out = next(tmp_path.glob(f"halo-*-{job_id}.out")).read_text()
    assert "job fault: Python exception at step 5; restarting in place on " in out, out[-3000:]

    ledger = json.loads(cli("nodes", "--json", env=env).stdout)
    assert [(e["host"], e["job"], e["backend"], e["reason"]) for e in ledger] == [
        (bad, job_id, "slurm", REASON)], ledger
