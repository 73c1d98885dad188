"""``halo-sched timeline`` on a real local job (torchrun, gloo, 2 nodes x 2 ranks): while it runs,
and after rank 3 hung and the monitors ended it (tests/trainers/hang.py)."""
from __future__ import annotations

import os
import re
import time
import xml.etree.ElementTree as ET

import pytest

from helpers import cli, example_job, free_port

pytestmark = pytest.mark.torch


def test_timeline_of_a_local_job_that_hangs(tmp_path):
    args = ["--stuck-rank", "3", "--stuck-step", "30", "--step-time", "0.2"]
    job = example_job(tmp_path, free_port(), trainer={"script": "tests/trainers/hang.py", "args": args},
                      hang={"timeout_s": 15})
    r = cli("submit", str(job), "--backend", "local", "--quiet")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().splitlines()[-1]
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    try:
        # While it runs: progress so far, the timeline ending now.
        deadline, text = time.monotonic() + 120, ""
        while time.monotonic() < deadline:
            t = cli("timeline", job_id, "--width", "90", env=env, timeout=60)
            assert t.returncode == 0, t.stderr
            text = t.stdout
            if "█" in text:
                break
            time.sleep(1)
        assert "job running" in text and "now" in text, text
        w = cli("watch", job_id, "--quiet", timeout=240)
        assert w.returncode == 1, w.stderr[-2000:]
    finally:
        cli("cancel", job_id)
    svg = tmp_path / "t.svg"
    t = cli("timeline", job_id, "--width", "90", "--svg", str(svg), env=env, timeout=60)
    assert t.returncode == 0, t.stderr
    text = t.stdout
    print(text)
    assert "\x1b" not in text
    rows = {int(m[1]): ln for ln in text.splitlines() if (m := re.match(r" .rank (\d+) ", ln))}
    assert sorted(rows) == [0, 1, 2, 3], text
    assert all(len(ln) <= 90 for ln in rows.values()), text
    assert rows[3].startswith(" ▶rank 3") and "CULPRIT: HUNG" in rows[3], text
    for rank, ln in rows.items():
        cells = ln[10:ln.rindex("  ")]
        # Steps, then the stall (at least the 15 s timeout), then the monitor's H.
        assert re.search(r"█+·+H", cells), (rank, ln)
        if rank != 3:
            assert "HUNG in all_reduce" in ln, ln
    assert "culprit: HUNG after step 29: rank 3 (node 1" in text, text
    assert "job end" in text and "legend: █ progress reported, · no progress, H hung" in text
    root = ET.fromstring(svg.read_bytes())
    texts = ["".join(e.itertext()) for e in root.iter() if e.tag.endswith("}text")]
    assert "\u25b6 rank 3" in texts and any(x.startswith("CULPRIT: HUNG") for x in texts), texts
