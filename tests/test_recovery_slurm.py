"""On the real SLURM cluster, with real torchrun: a run recovers with no one watching (issue 32).
A 2-node job with ``retry: {attempts: 2, on: [node]}`` is submitted with ``submit --wait``; the
submitting process is killed (SIGKILL: no handler, nothing left waiting) once the ranks train;
then node 1 fails as a bad node would (tests/trainers/node_fault_on_cue.py: its rank prints an NCCL
error and dies of a SIGKILL nothing in the job sent, the node's evidence). The failed attempt's
batch script submits the successor itself (halo_sched/node/successor.py), keeping off the
culprit; the run ends COMPLETED: ``list`` from a fresh process follows the chain (records what
it finds) and ``status RUN`` shows both attempts with their GPU-hours. The fault-to-successor time is printed (bench/recovery.py
records it against a client's resubmission)."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env, submit_with_no_client_left, until

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def env(slurm_cluster):
    return slurm_env(slurm_cluster, pythonpath=True)


def test_the_run_completes_after_its_submitter_was_killed_before_the_fault(tmp_path, env):
    shutil.copy(REPO / "tests" / "trainers" / "node_fault_on_cue.py", tmp_path / "node_fault_on_cue.py")
    job = example_job(tmp_path, free_port(), nproc_per_node=1, retry={"attempts": 2, "on": ["node"]},
                      trainer={"script": "node_fault_on_cue.py", "args": []})
    log = tmp_path / "attempts.log"
    run_id = submit_with_no_client_left(job, tmp_path, env, log)
    (tmp_path / "fault").write_text("")  # no client is alive from here on

    def completed():  # `list` alone follows the chain: each attempt found is recorded
        rows = [json.loads(ln) for ln in cli("list", "--json", cwd=tmp_path, env=env).stdout.splitlines()]
        ours = sorted(((x.get("run") or {}).get("attempt"), x["status"]) for x in rows
                      if (x.get("run") or {}).get("id") == run_id)
        return ours if ours == [(0, "FAILED"), (1, "COMPLETED")] else None

    assert until(completed, 240, step=3), cli("list", cwd=tmp_path, env=env).stdout
    st = cli("status", run_id, cwd=tmp_path, env=env)
    lines = st.stdout.splitlines()
    a1 = [ln for ln in lines if "\tattempt 1: " in ln]
    a2 = [ln for ln in lines if "\tattempt 2: " in ln]
    m = re.search(r" FAILED \(node fault: host (\S+), killed by SIGKILL \(nothing in the job sent it\); the rank "
                  r"reported an NCCL network error\)", a1[0] if a1 else "")
    assert m, lines
    host = m.group(1)
    assert len(a2) == 1 and " COMPLETED;" in a2[0] and f"excluded {host}" in a2[0], lines
    assert any("\trun: 2 attempts, " in ln and "GPU-h" in ln for ln in lines), lines
    second = {h for c, _, h, _ in (ln.split() for ln in log.read_text().splitlines()) if c == "1"}
    assert len(second) == 2 and host not in second, log.read_text()

    # The successor was submitted by the failed attempt within 10 s of the fault.
    marker = json.loads(next(tmp_path.glob(f".halo-run-{run_id}.attempt-1.json")).read_text())
    fault_at = float((tmp_path / "fault_at").read_text())
    took = marker["submitted_at"] - fault_at
    print(f"fault to successor submitted: {took:.2f} s (job {marker['from_job']} -> {marker['job']})")
    assert took < 10, marker
    assert cli("nodes", env=env).stdout.count(host) >= 1  # the ledger learned the culprit
