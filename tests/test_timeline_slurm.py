"""``halo-sched timeline`` of a SLURM job that hung (real local cluster, torchrun, gloo, 2 nodes x
2 ranks; tests/trainers/hang.py): each node's hang monitor copies its ranks' progress files beside
the job's output file, so each row shows the rank's steps, then its stall and the monitor's
detection, from the job's start by SLURM's clock."""
from __future__ import annotations

import re
import shutil

import pytest

from helpers import REPO, cli, example_job, free_port, slurm_env

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_timeline_of_a_slurm_job_that_hangs(tmp_path, slurm_cluster):
    env = {**slurm_env(slurm_cluster), "NO_COLOR": "1"}
    shutil.copy(REPO / "tests" / "trainers" / "hang.py", tmp_path / "hang.py")
    job = example_job(tmp_path, free_port(), trainer={"script": "hang.py", "args": ["--stuck-rank", "3",
                      "--stuck-step", "20"]}, hang={"timeout_s": 15})
    r = cli("submit", str(job), "--backend", "slurm", "--wait", "--quiet", cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    job_id = r.stdout.strip().splitlines()[-1]
    t = cli("timeline", job_id, "--width", "100", "--svg", str(tmp_path / "t.svg"), cwd=tmp_path, env=env,
            timeout=120)
    assert t.returncode == 0, t.stderr
    text = t.stdout
    print(text)
    rows = {int(m[1]): ln for ln in text.splitlines() if (m := re.match(r" .rank (\d+) ", ln))}
    assert sorted(rows) == [0, 1, 2, 3], text
    assert rows[3].startswith(" ▶rank 3") and "CULPRIT: HUNG" in rows[3], text
    for ln in rows.values():
        assert re.search(r"█+·+H", ln), ln  # steps (from the nodes' copies), the stall from the last report, hung
    assert f"job {job_id} (ddp-cpu) on slurm: FAILED" in text and "stays on the nodes" not in text, text
    assert "culprit: HUNG after step 19: rank 3 (node 1" in text, text
    assert (tmp_path / "t.svg").read_text().startswith("<?xml")
