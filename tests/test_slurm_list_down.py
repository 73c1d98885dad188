"""``list`` never blocks on a SLURM whose controller is down (issue 23).

SLURM's clients against a stopped slurmctld wait MessageTimeout (10 s by default) before they
fail, and Slurm 22.05's squeue and sacct take no timeout of their own. Stand-ins for them here
(on PATH, like the real ones) hang as they do; ``list`` asks once, within a short bound, and shows
the records' last known states under one short note. The real controller stopped:
tests/test_slurm_outage.py.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halo_sched import records
from helpers import REPO

HANG_S = 10  # MessageTimeout's default
# A single process (no child holding the pipes), so a timeout ends it at once.
HANGING = f"""#!{sys.executable}
import sys, time
open({{log!r}}, "a").write(" ".join(sys.argv) + "\\n")
time.sleep({{hang_s}})
sys.stderr.write(sys.argv[0].rsplit("/", 1)[-1] + ": error: Unable to contact slurm controller (connect failure)\\n")
sys.exit(1)
"""


def _hanging_clients(tmp_path: Path, hang_s: float = HANG_S) -> tuple[Path, Path]:
    """Stand-ins for SLURM's clients that wait ``hang_s`` and then fail as against a stopped
    slurmctld (0: at once, as against a controller that refuses the connection)."""
    bin_dir, log = tmp_path / f"bin-{hang_s}", tmp_path / f"calls-{hang_s}.log"
    bin_dir.mkdir()
    for name in ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo"):
        f = bin_dir / name
        f.write_text(HANGING.format(log=str(log), hang_s=hang_s))
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return bin_dir, log


def test_list_shows_last_known_states_within_seconds_when_slurmctld_is_down(tmp_path):
    records.write({"id": "4242", "backend": "slurm", "submitted": 1.0, "name": "train",
                   "last_state": {"status": "RUNNING", "describe": "RUNNING 2/2 nodes"}})
    from halo_sched.backends.slurm import LIST_ASK_S

    def listed(hang_s: float) -> tuple[subprocess.CompletedProcess, float, Path]:
        bin_dir, log = _hanging_clients(tmp_path, hang_s)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "list"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
        return r, time.monotonic() - t0, log

    # The baseline, in the same test on the same machine: clients that fail at once.
    _, base, _ = listed(0)
    r, took, log = listed(HANG_S)
    assert r.returncode == 0, r.stderr
    (note,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(note) <= 160, (len(note), note)
    assert note.startswith("halo-sched: slurm: SLURM did not answer within 2 s") and \
        note.endswith("states below: last known"), note
    assert "4242" in r.stdout and "RUNNING 2/2 nodes (last known)" in r.stdout, r.stdout
    # One ask cut at LIST_ASK_S (2 s) past the baseline, with a loaded machine's margin; before:
    # sacct, then squeue tried 3 times, each held MessageTimeout (over 30 s); one ask left unbounded
    # would be HANG_S (10 s) past it.
    assert took < base + LIST_ASK_S + 4 < base + HANG_S, (took, base)
    calls = log.read_text().splitlines()
    assert sum(c.split()[0].endswith("squeue") for c in calls) <= 1, calls


def test_list_asks_each_client_once_within_the_bound():
    from halo_sched.backends.slurm import LIST_ASK_S, SlurmScheduler
    from halo_sched.backends.slurm.transport.cli import CliTransport

    seen = []

    def runner(argv, input=None):
        from halo_sched.retry import time_left

        seen.append((argv[0], time_left()))
        return subprocess.CompletedProcess(argv, 1, "", "squeue: error: Unable to contact slurm controller")

    sched = SlurmScheduler(transport=CliTransport(runner=runner, accounting=False))
    quick = sched.for_listing()
    try:
        quick.query(["7"])
    except Exception as err:  # noqa: BLE001 - the message is what is checked
        assert str(err).startswith("SLURM did not answer within 2 s (Unable to contact slurm controller"), err
    else:
        raise AssertionError("no error")
    assert [name for name, _ in seen] == ["squeue"]  # once
    assert all(left is not None and left <= LIST_ASK_S for _, left in seen), seen
    assert sched.transport.policy.attempts > 1  # the scheduler list was asked for keeps its retries


@pytest.mark.slurm
def test_list_with_the_real_controller_stopped(tmp_path, slurm_cluster_exclusive):
    # The outage lasts as long as one `list` (a few seconds); slurmctld is started again in any case.
    env = {**os.environ, **slurm_cluster_exclusive}
    records.write({"id": "999001", "backend": "slurm", "submitted": 1.0, "name": "train",
                   "last_state": {"status": "RUNNING", "describe": "RUNNING 1/1 nodes"}})
    cluster = REPO / "tests" / "cluster" / "slurm-cluster.sh"
    stop = subprocess.run([str(cluster), "ctld-stop"], env=env, capture_output=True, text=True, timeout=60)
    try:
        assert stop.returncode == 0, stop.stderr
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "halo_sched.cli", "list", "--backend", "slurm"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
    finally:
        start = subprocess.run([str(cluster), "ctld-start"], env=env, capture_output=True, text=True, timeout=60)
    assert start.returncode == 0, start.stderr
    assert r.returncode == 0, r.stderr
    (note,) = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(note) <= 160 and note.startswith("halo-sched: slurm: SLURM did not answer within 2 s"), note
    assert "999001" in r.stdout and "RUNNING 1/1 nodes (last known)" in r.stdout, r.stdout
    assert took < 8, took
