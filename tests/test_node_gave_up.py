"""A node whose entry script gives up before torchrun (no torchrun on the node, a setup line
that failed) writes no failure line: the job's last line says why in the entry's own words
(``halo-sched: node 1: torchrun not found on PATH ...``), not "node 1 exited with 1" (issue 41,
item 2). Local for real (a setup that hides torchrun); SLURM through a stand-in transport
reading an output file as srun --label writes it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from halo_sched import records
from halo_sched.jobstate import JobState, JobStatus
from halo_sched.backends.slurm import SlurmScheduler
from halo_sched.node.failures import entry_failure, entry_failure_in
from halo_sched.spec import loads
from helpers import free_port

NOT_FOUND = "torchrun not found on PATH (after setup); install torch on the node or activate its environment in setup"


@pytest.mark.skipif(shutil.which("torchrun", path="/usr/bin:/bin") is not None, reason="/usr/bin has a torchrun")
def test_without_torchrun_on_the_node_the_last_line_says_so(tmp_path):
    (tmp_path / "train.py").write_text("print('never runs')\n")
    (tmp_path / "job.yaml").write_text(
        f"name: notorch\nnodes: 2\nnproc_per_node: 1\ntrainer: {{script: train.py}}\nrendezvous: {{port: {free_port()}}}\n"
        "setup: ['export PATH=/usr/bin:/bin']\n")
    r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "submit", "job.yaml", "--wait"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 1, r.stderr
    job_id = r.stdout.split()[-1]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"halo-sched: {job_id} FAILED") and NOT_FOUND in last, r.stderr
    assert "exited with 1" not in last
    st = subprocess.run([sys.executable, "-m", "halo_sched.cli", "status", job_id], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60, env=os.environ)
    assert NOT_FOUND in st.stdout, st


def test_the_entry_line_is_read_whatever_its_label_and_only_its_own():
    said = f"halo-sched: node 1: {NOT_FOUND}"
    assert entry_failure(["other output", said, ""]) == f"node 1: {NOT_FOUND}"  # a node's own output
    for label in ("[node 1] ", "1: "):  # labelled: each node's last line, whatever the others say after it
        assert entry_failure([f"{label}other", f"{label}{said}", "0: more", "[node 0] more"]) == f"node 1: {NOT_FOUND}"
    # Only the line a node's output ends on: a server's URL line, then more output, is no reason.
    assert entry_failure([said, "Traceback (most recent call last):", "  ..."]) is None
    assert entry_failure(["halo-sched: node 0: server vllm: http://10.0.0.2:8000", "step 1"]) is None
    # A label that names another node than the line: not the entry's line.
    assert entry_failure([f"0: {said}"]) is None
    assert entry_failure([said], node=0) is None
    # The text is escaped and bounded (a job's output is hostile); the lowest node of several.
    got = entry_failure(["2: halo-sched: node 2: \x1b[2Jsecond " + "x" * 5000, "1: halo-sched: node 1: first"])
    assert got == "node 1: first"
    got = entry_failure(["halo-sched: node 2: \x1b[2Jsecond " + "x" * 5000])
    assert got.startswith("node 2: \\x1b[2Jsecond") and len(got) < 420


def test_only_the_end_of_a_long_output_is_read(tmp_path):
    out = tmp_path / "big.out"
    with open(out, "w") as f:
        f.write("3: the start\n0: halo-sched: node 0: long ago\n")  # node 0's last line, 200 kB before the end
        f.write(("3: " + "y" * 99 + "\n") * 2000)
        f.write(f"1: halo-sched: node 1: {NOT_FOUND}\n")
    assert entry_failure_in([out, tmp_path / "missing"]) == f"node 1: {NOT_FOUND}"


class _Transport:
    """squeue/sacct say FAILED exit 1; nothing else is asked."""

    def query(self, ids):
        return {i: JobState(i, JobStatus.FAILED, raw_state="FAILED", exit_code=1, reason="NonZeroExitCode")
                for i in ids}


def test_slurm_says_the_entry_scripts_words_when_no_failure_line(tmp_path):
    out = tmp_path / "slurm-77.out"
    out.write_text(f"0: halo-sched: node 0 of 2 on n1: master 10.0.0.1:29500\n1: halo-sched: node 1: {NOT_FOUND}\n")
    spec = loads("name: s\nnodes: 2\nnproc_per_node: 1\ntrainer: {script: t.py}\n")
    records.record_submit("slurm", spec, "#!/bin/bash\n", "77", {"outputs": [str(out)]})
    state = SlurmScheduler(transport=_Transport()).query(["77"])["77"]
    assert state.failure is None and f"reason=node 1: {NOT_FOUND}" in state.describe()
