"""On the real SLURM cluster: node 1 of a 2-node job fails as a node would (its rank prints a
stand-in NCCL NET/IB error, a label, and dies of a SIGKILL nothing in the job sent, the node's
evidence: tests/trainers/node_fault.py); `status` names the node fault and its host, the node ledger
holds SLURM's name for it, and the next job's script keeps off it (`--exclude`), which sbatch
itself accepts (`--test-only`: it names a node the cluster knows)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm]
#: The node's evidence decides (the signal), the rank's words label (node/failure_classes.py).
REASON = "killed by SIGKILL (nothing in the job sent it); the rank reported an NCCL network error"


@pytest.fixture
def env(slurm_cluster):
    return slurm_env(slurm_cluster, pythonpath=True)


def test_a_node_fault_on_slurm_is_ledgered_and_the_next_job_excludes_that_node(tmp_path, env):
    """A node fault on a real SLURM job is ledgered, and the next job's script excludes that node
    (sbatch --test-only). Long: a real torchrun job whose rank is killed, then status, nodes, render
    and sbatch against the cluster (over 100 s when the machine is loaded)."""
    shutil.copy(REPO / "tests" / "trainers" / "node_fault.py", tmp_path / "node_fault.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, trainer={"script": "node_fault.py", "args": []})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", "--timeout", "240", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    last = r.stderr.strip().splitlines()[-1]
    m = re.search(r"FAILED \(node fault: host (\S+), " + re.escape(REASON) + r"\): ", last)
    assert m, r.stderr[-3000:]
    host = m.group(1)
    # SLURM's own name for the node that ran node rank 1.
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                           timeout=60).stdout
    nodes = re.search(r"(?<![A-Za-z])NodeList=(\S+)", shown).group(1)
    names = subprocess.run(["scontrol", "show", "hostnames", nodes], env=env, capture_output=True, text=True,
                           timeout=60).stdout.split()
    assert host == names[1], (host, names)

    st = cli("status", job_id, cwd=tmp_path, env=env)
    assert f"FAILED (node fault: host {host}, {REASON})" in st.stdout, st.stdout + st.stderr
    st = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
    assert st["failure_class"] == {"class": "node", "failure": "node", "reason": REASON, "host": host, "by": "signal"}
    ledger = json.loads(cli("nodes", "--json", env=env).stdout)
    assert [(e["host"], e["job"], e["backend"], e["reason"]) for e in ledger] == [
        (host, job_id, "slurm", REASON)], ledger
    listed = cli("nodes", env=env).stdout
    assert host in listed and f"{job_id}@slurm" in listed

    rendered = cli("render", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    assert rendered.returncode == 0 and f"#SBATCH --exclude={host}\n" in rendered.stdout, rendered.stdout[:1500]
    script = tmp_path / "next.sbatch"
    script.write_text(rendered.stdout)
    test = subprocess.run(["sbatch", "--test-only", f"--chdir={tmp_path}", str(script)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert test.returncode == 0 and "to start" in test.stderr and host not in test.stderr.split(" on nodes ")[-1], \
        test.stderr

    assert cli("nodes", "clear", host, env=env).returncode == 0
    assert "#SBATCH --exclude" not in cli("render", str(job), "--backend", "slurm", cwd=tmp_path, env=env).stdout


def test_a_ledgered_host_slurm_does_not_know_never_stops_a_submit(tmp_path, env):
    """A ledger entry naming a node this cluster lacks (another cluster's, or one removed): sbatch
    would refuse the whole job ("Invalid node name specified"); submit says so once and submits
    it without the exclusion."""
    from halo_sched import ledger

    ledger.add("ghost-node-9", "GPU Xid error", "1", "slurm")
    shutil.copy(REPO / "tests" / "trainers" / "node_fault.py", tmp_path / "node_fault.py")
    job = example_job(tmp_path, free_port(), nodes=1, nproc_per_node=1, trainer={"script": "node_fault.py", "args": []})
    r = cli("submit", str(job), "--backend", "slurm", cwd=tmp_path, env=env)
    try:
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("SLURM does not know a host of the node ledger (ghost-node-9)") == 1, r.stderr
    finally:
        job_id = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if job_id:
            subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=60)
