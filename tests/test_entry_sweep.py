"""The entry script stops whatever its torchrun left behind, however torchrun ended.

torchrun's workers run in sessions of their own: when torchrun dies they are reparented to init,
where SLURM's proctrack/linuxproc no longer sees them (found on the real cluster,
tests/test_slurm_exactly_once.py). Here a fake torchrun leaves an orphan in a new session that
ignores SIGTERM, then exits 0 or is SIGKILLed: the orphan must be gone when the entry returns.
"""
from __future__ import annotations

import os
import time

import pytest

import halo_sched
from helpers import entry_script
from helpers import base_env, run_entry

SPEC = """
name: sweep
nodes: 2
nproc_per_node: 1
trainer: {script: train.py}
"""

# The orphan ignores TERM (SIG_IGN survives exec), so only the KILL after the grace ends it.
FAKE_TORCHRUN = """#!/bin/bash
setsid bash -c 'trap "" TERM; echo $$ > "$SWEEP_DIR/orphan.pid"; exec sleep 300' < /dev/null > /dev/null 2>&1 &
while [ ! -s "$SWEEP_DIR/orphan.pid" ]; do sleep 0.05; done
case "$SWEEP_END" in kill) kill -KILL $$ ;; *) exit 0 ;; esac
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("end, rc", [("exit", 0), ("kill", 137)])
def test_what_torchrun_left_is_gone_when_the_entry_returns(tmp_path, end, rc):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(FAKE_TORCHRUN)
    (bindir / "torchrun").chmod(0o755)
    env = {**base_env(bindir, tmp_path), "SWEEP_DIR": str(tmp_path), "SWEEP_END": end}
    t0 = time.monotonic()
    r = run_entry(entry_script(halo_sched.loads(SPEC)), tmp_path,
                  {"HALO_NODE_RANK": "1", "HALO_MASTER_ADDR": "127.0.0.1", "HALO_MASTER_PORT": "29500"}, env)
    took = time.monotonic() - t0
    orphan = int((tmp_path / "orphan.pid").read_text())
    try:
        assert r.returncode == rc, r.stderr[-2000:]
        assert not _alive(orphan), "the orphan torchrun left outlived the entry script"
        assert took < 15, f"the sweep took {took:.1f}s (TERM, 5 s grace, KILL)"
    finally:
        if _alive(orphan):
            os.kill(orphan, 9)
