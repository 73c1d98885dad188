"""The slowest rank on SLURM (real local cluster, torchrun, gloo, 2 nodes x 2 ranks;
tests/trainers/hang.py): each node's hang monitor copies its ranks' progress files beside the
job's output file, and ``status`` names the straggler from them while the job runs (issue 21)."""
from __future__ import annotations

import re
import shutil
import time

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_status_names_the_straggler_of_a_running_slurm_job(tmp_path, slurm_cluster):
    """`status` names the straggler of a running SLURM job. Long: the slow rank must run long enough for the
    progress window to tell it from the others."""
    env = slurm_env(slurm_cluster)
    shutil.copy(REPO / "tests" / "trainers" / "hang.py", tmp_path / "hang.py")
    # Rank 1 (node 0) computes 0.6 s a step, the others 0.1 s; each rank reports after its
    # compute, before the step's all_reduce (where the others wait for rank 1).
    args = ["--steps", "400", "--step-time", "0.1", "--slow-rank", "1", "--slow-time", "0.6", "--report-before"]
    job = example_job(tmp_path, free_port(), trainer={"script": "hang.py", "args": args}, hang={"timeout_s": 30})
    r = cli("submit", str(job), "--backend", "slurm", "--quiet", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    try:
        deadline, text = time.monotonic() + 180, ""
        while time.monotonic() < deadline:
            text = cli("status", job_id, "--backend", "slurm", cwd=tmp_path, env=env).stdout
            m = re.search(r"over the last (\d+) steps", text)
            if m and int(m[1]) >= 20 and "node 1: step" in text:
                break
            if "RUNNING" not in text and "PENDING" not in text:
                break
            time.sleep(3)
        print(text)
        assert "RUNNING" in text, text
        assert "slowest: rank 1 (node 0), " in text and " s behind the median rank each step" in text, text
        assert ": a slow rank (it computes 0.5" in text, text  # hang.py --report-before: its compute, not a link
        assert int(re.search(r"over the last (\d+) steps", text)[1]) >= 20, text
        assert "node 0: step " in text and "node 1: step " in text and "s/step" in text, text
        # The copies: the ring, the history and the times out of the all_reduce of every rank, beside
        # the output file.
        mirror = tmp_path / ".halo-progress" / job_id
        names = sorted(str(p.relative_to(mirror)) for p in mirror.rglob("rank-*"))
        assert names == [f"node-{r // 2}/progress/rank-{r}{h}" for r in range(4) for h in ("", ".history", ".left")], names
        # `timeline` draws the steps from them while the job runs.
        t = cli("timeline", job_id, "--backend", "slurm", "--width", "100", cwd=tmp_path,
                env={**env, "NO_COLOR": "1"}, timeout=120)
        print(t.stdout)
        assert t.returncode == 0 and "█" in t.stdout and "stays on the nodes" not in t.stdout, t.stdout + t.stderr
    finally:
        cli("cancel", job_id, "--backend", "slurm", cwd=tmp_path, env=env)
