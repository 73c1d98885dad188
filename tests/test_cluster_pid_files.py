"""tests/cluster/slurm-cluster.sh signals only its own processes, whatever its pid files say.

A daemon that died (killed by a test, or crashed) leaves its pid file, and beside the whole suite
its pid is soon another process's: the suite's processes and threads take all of pid_max (32768
here) in a minute or two. A SLURM job's torchrun got a SIGTERM from outside its job and the job FAILED
(2026-12-07), about when the rig's crash test ran `down` over two dead daemons' pid files: a `down`
that trusted such a file is the likeliest sender. Here the pid files of a state dir with no daemons name a
live process of this test's, as a reused pid would, and `down` must leave it alone; and a process
that is the cluster's must still go. (multihost.sh reads its pid files the same way; its `down`
also removes the rig's namespaces, the machine's own, so it is not run here.)
"""
from __future__ import annotations

import os
import subprocess

from helpers import REPO

SCRIPT = REPO / "tests" / "cluster" / "slurm-cluster.sh"


def test_down_stops_its_own_daemon_by_its_pid_file_and_by_its_name(tmp_path):
    """The other side: a process that is the cluster's (named slurmd, SLURM_CONF its slurm.conf) goes."""
    import shutil

    state = tmp_path / "cluster"
    (state / "run").mkdir(parents=True)
    fake = tmp_path / "slurmd"  # /proc/PID/comm is the file's name
    shutil.copy("/bin/sleep", fake)
    env = {**os.environ, "HALO_CLUSTER_DIR": str(state)}
    # SLURM_CONF first, then more than a pipe holds (64 KiB): as munged's and slurmd's environments
    # once were, a check that stops reading at its first match must not make the process a stranger.
    own_env = {"SLURM_CONF": str(state / "etc" / "slurm.conf"), **env, **{f"HALO_TEST_PADDING_{i}": "x" * 50_000 for i in range(4)}}
    ours = [subprocess.Popen([str(fake), "300"], env=own_env) for _ in range(2)]
    try:
        (state / "run" / "slurmd-node1.pid").write_text(f"{ours[0].pid}\n")  # the other by its name alone
        r = subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert [p.wait(timeout=30) for p in ours] == [-15, -15], r.stderr
    finally:
        for p in ours:
            p.kill()
            p.wait()


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
