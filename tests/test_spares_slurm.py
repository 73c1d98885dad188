"""On the real SLURM cluster (3 nodes): a 2-node job with slurm.spare_nodes: 1 holds all three
(--no-kill); node rank 0 fails as a bad node would on the first step (tests/trainers/
node_fault_once.py with FAULT_NODE=0: an NCCL NET/IB error printed, then a SIGKILL nothing in the job
sent, the node's evidence); the batch script gives rank 0 to the
spare and starts the step again in the same job with HALO_RESTART_COUNT 1, without the queue.
Rank 0 moving is the hard case: its address is read again, and the spare (node3) comes after
node2 in the step, where SLURM_NODEID would have made it rank 1: the rank map decides. The job ends
COMPLETED, `status` says the spare is used and which node it replaced, and the node ledger holds
the bad node (from the batch script's signed swap line: the job itself never FAILED)."""
from __future__ import annotations

import json
import shutil

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
#: The node's evidence decides (the signal), the rank's words label (node/failure_classes.py).
REASON = "killed by SIGKILL (nothing in the job sent it); the rank reported an NCCL network error"


def test_a_node_fault_is_swapped_for_the_spare_in_the_same_job(tmp_path, slurm_cluster):
    """A node's fault is swapped for the spare in the same job. Long: a real torchrun trains, fails on one node and
    trains again on the spare, in one allocation."""
    env = slurm_env(slurm_cluster, pythonpath=True)
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_once.py", tmp_path / "node_fault_once.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, trainer={"script": "node_fault_once.py", "args": []},
                      slurm={"spare_nodes": 1, "exclusive": True}, env={"FAULT_NODE": "0"})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "180", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]

    # count node host: the first step on two hosts, the second with the spare in rank 0's place.
    seen = [ln.split()[:3] for ln in (tmp_path / "attempts.log").read_text().splitlines()]
    first = {int(n): h for c, n, h in seen if c == "0"}
    second = {int(n): h for c, n, h in seen if c == "1"}
    assert sorted(first) == [0, 1] and sorted(second) == [0, 1], seen
    bad, spare = first[0], second[0]
    assert second[1] == first[1] and spare not in first.values(), seen

    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["status"] == "COMPLETED"
    assert st["spares"]["total"] == 1 and st["spares"]["left"] == 0
    assert [(s["rank"], s["bad"], s["spare"], s["reason"]) for s in st["spares"]["swaps"]] == [
        (0, bad, spare, REASON)], st["spares"]
    text = cli("status", job_id, cwd=tmp_path, env=env).stdout
    assert f"COMPLETED exit=0; 0 of 1 spare left ({bad} -> {spare}: {REASON})" in text, text

    ledger = json.loads(cli("nodes", "--json", env=env).stdout)
    assert [(e["host"], e["job"], e["backend"], e["reason"]) for e in ledger] == [
        (bad, job_id, "slurm", REASON)], ledger
