"""tests/cluster/slurm-cluster.sh signals only its own processes, whatever its pid files say.

A daemon that died (killed by a test, or crashed) leaves its pid file, and beside the whole suite
its pid is soon another process's: the suite's processes and threads take all of pid_max (32768
here) in a minute or two. A `down` that trusted the file once sent SIGTERM to a SLURM job's torchrun
of another cluster, and that job FAILED (2026-12-07). Here the pid files of a state dir with no
daemons name a live process of this test's, as a reused pid would; `down` must leave it alone.
(multihost.sh's pid files are read the same way; its `down` also removes the rig's namespaces, the
machine's own, so it is not run here.)
"""
from __future__ import annotations

import os
import subprocess

from helpers import REPO

SCRIPT = REPO / "tests" / "cluster" / "slurm-cluster.sh"


def test_down_leaves_a_process_that_took_a_dead_daemons_pid(tmp_path):
    state = tmp_path / "cluster"
    (state / "run").mkdir(parents=True)
    (state / "munge").mkdir()
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        for name in ("run/slurmctld.pid", "run/slurmd-node1.pid", "munge/munged.pid"):
            (state / name).write_text(f"{stranger.pid}\n")
        env = {**os.environ, "HALO_CLUSTER_DIR": str(state)}
        r = subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "no daemons left" in r.stderr
        assert stranger.poll() is None, f"down signalled pid {stranger.pid}, which was never the cluster's: {r.stderr}"
    finally:
        stranger.kill()
        stranger.wait()
