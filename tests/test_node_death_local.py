"""Local backend: a node whose torchrun is killed ends the job in bounded time, and no process of
the job survives (found by the job's HALO_LOCAL_JOB tag, however deep)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halo_sched.node.processes import tagged
from helpers import REPO, example_job, free_port

pytestmark = pytest.mark.torch
DEAD_NODE_BOUND_S = 20


def _torchrun_of_node(tag: str, node: int) -> int | None:
    for pid in tagged(tag):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HALO_NODE_RANK={node}".encode() in env and any(os.path.basename(a) == b"torchrun" for a in argv[:2]):
            return pid
    return None


def test_killed_node_ends_the_local_job(tmp_path):
    home = tmp_path / "home"
    f = example_job(tmp_path, free_port(), trainer={"script": str(REPO / "examples" / "train_ddp.py"),
                                                    "args": ["--steps", "100000", "--step-time", "0.2"]})
    env = {**os.environ, "HALO_SCHED_HOME": str(home),
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "halo_sched.cli", "submit", str(f), "--wait", "--quiet"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        victim = tag = None
        while victim is None and time.monotonic() < deadline:
            dirs = list((home / "local").glob("*")) if (home / "local").exists() else []
            if dirs and (dirs[0] / "job.log").exists():  # the directory is laid out before its log
                tag = str(dirs[0])
                log = (dirs[0] / "job.log").read_text(errors="replace")
                if "step    1" in log or "step 1" in log or "loss" in log:
                    victim = _torchrun_of_node(tag, 1)
            time.sleep(0.3)
        assert victim, "node 1 never got to training"
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        out, err = proc.communicate(timeout=DEAD_NODE_BOUND_S + 30)
        ended = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run([sys.executable, "-m", "halo_sched.cli", "cancel", Path(tag).name], env=env, timeout=60)
    assert proc.returncode == 1, err
    state = json.loads((Path(tag) / "state.json").read_text())
    assert state["state"] == "FAILED" and "node 1" in state["reason"], state
    assert ended < DEAD_NODE_BOUND_S, f"{ended:.1f}s"
    assert tagged(tag) == [], "processes of the job survived it"
    print(f"local dead node: FAILED {ended:.1f} s after the kill")
