"""pytest fixtures for the real local SLURM cluster. Use from tests/conftest.py:

    from cluster.fixtures import cluster_lock, slurm_cluster, slurm_cluster_exclusive  # noqa: F401

HALO_SKIP_SLURM=1 skips the tests that need it (loudly: the run's summary counts them; refused
when CI=true); otherwise a cluster that fails to start is an ERROR of those tests, never a silent
skip. HALO_KEEP_CLUSTER=1 leaves it running after the session (for debugging:
`tests/cluster/slurm-cluster.sh status`, logs under /var/lib/halo-sched/cluster-22.05/log).

The cluster is shared by every test run on this machine, so it has a lock
(``/tmp/halo-slurm-cluster.lock``, flock): each test that uses the cluster holds it SHARED for its
duration; a test that disturbs everyone (a controller outage) asks for ``slurm_cluster_exclusive``
and holds it EXCLUSIVE, so it runs while no other test uses the cluster; starting and stopping the
cluster, and the bench's measurements (bench/run.py), hold it EXCLUSIVE too.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

try:  # tests/ is on sys.path when pytest imports tests/conftest.py (no tests/__init__.py)
    from cluster import cluster as _cluster
except ImportError:  # imported as tests.cluster.fixtures
    from tests.cluster import cluster as _cluster

# One lock per release's cluster (HALO_SLURM_VERSION, tests/cluster/slurm-cluster.sh): 22.05's is
# the one every worktree has always shared; a built release's cluster has its own state dir and
# ports, so its tests never wait for, nor disturb, another release's.
LOCK_PATH = Path(_cluster.lock_path())
# An exclusive waiter announces itself here (its pid): shared lockers wait for it first, or a
# run of back-to-back tests elsewhere could hold the shared lock forever.
WANTED_PATH = Path(str(LOCK_PATH) + ".exclusive-wanted")
LOCK_TIMEOUT_S = float(os.environ.get("HALO_CLUSTER_LOCK_TIMEOUT_S", "900"))


def skip_slurm_requested() -> bool:
    return os.environ.get("HALO_SKIP_SLURM") == "1"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exclusive_wanted_by_other() -> bool:
    try:
        pid = int(WANTED_PATH.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and pid > 0 and _alive(pid)


def _flock(f, kind: int, deadline: float) -> None:
    """flock, blocking (woken by the kernel the moment the lock is free) until ``deadline``."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    if threading.current_thread() is not threading.main_thread():
        while True:
            try:
                fcntl.flock(f, kind | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError from None
                time.sleep(0.05)

    def on_alarm(*_):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        fcntl.flock(f, kind)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class cluster_lock:
    """The cluster's lock, shared (a test using the cluster) or exclusive (a test that stops the
    controller; start and stop of the cluster). Waits at most HALO_CLUSTER_LOCK_TIMEOUT_S (900)."""

    def __init__(self, exclusive: bool = False, timeout: float | None = None):
        self.exclusive = exclusive
        self.timeout = LOCK_TIMEOUT_S if timeout is None else timeout
        self.f = None

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        self.f = open(LOCK_PATH, "a")
        try:
            if self.exclusive:
                WANTED_PATH.write_text(str(os.getpid()))
                try:
                    _flock(self.f, fcntl.LOCK_EX, deadline)
                finally:
                    try:
                        if WANTED_PATH.read_text().strip() == str(os.getpid()):
                            WANTED_PATH.unlink()
                    except OSError:
                        pass
            else:
                while _exclusive_wanted_by_other():
                    if time.monotonic() >= deadline:
                        raise TimeoutError
                    time.sleep(0.1)
                _flock(self.f, fcntl.LOCK_SH, deadline)
        except TimeoutError:
            self.f.close()
            raise RuntimeError(
                f"the SLURM test cluster's lock ({LOCK_PATH}) was not free for {self.timeout:.0f} s: another test "
                f"run holds it ({'exclusive' if self.exclusive else 'shared'} wanted)") from None
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


def cancel_slurm_jobs_under(root: Path, env: dict | None = None) -> list[str]:
    """scancel every queued or running job whose working directory is under ``root`` (the jobs
    a test submitted from its tmp_path); others' jobs on the shared cluster are left alone."""
    env = env or dict(os.environ)
    try:
        q = subprocess.run(["squeue", "--noheader", "--format=%i|%Z"], env=env, capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    mine = [i for i, _, wd in (ln.partition("|") for ln in q.stdout.splitlines())
            if wd == str(root) or wd.startswith(str(root) + "/")]
    if mine:
        subprocess.run(["scancel", *mine], env=env, capture_output=True, timeout=60)
    return mine


def _started_marker(testrun: str) -> Path:
    return Path(f"{LOCK_PATH}.started-by-{testrun}")


def _xdist_testrun(config) -> str | None:
    """The run's id when this process is one of pytest-xdist's workers, else None."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("testrunuid") if workerinput else None


def stop_cluster_started_by(testrun: str) -> None:
    """Called once by the xdist controller at the end of the run: a cluster that one of its workers
    started is stopped now, when no worker of the run uses it any more."""
    marker = _started_marker(testrun)
    if not marker.exists():
        return
    marker.unlink()
    if os.environ.get("HALO_KEEP_CLUSTER") != "1":
        with cluster_lock(exclusive=True):
            _cluster.down()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory, request):
    """Yields the cluster's environment (SLURM_CONF, HALO_SLURMRESTD_SOCKET/URL), which is also
    exported into os.environ for subprocesses."""
    if skip_slurm_requested():
        pytest.skip("HALO_SKIP_SLURM=1: tests that need the local SLURM cluster are skipped")
    testrun = _xdist_testrun(request.config)
    # Exclusive: never look at (or start) the cluster while another run has its controller
    # stopped: `up` would start a fresh one with -c and wipe that run's jobs.
    with cluster_lock(exclusive=True):
        started_here = not _cluster.is_up()
        env = _cluster.ensure_up()  # raises ClusterError -> the test errors, with the daemons' logs
        if started_here and testrun and not _cluster.worker_owns_cluster:
            # Under pytest-xdist one worker's session ends while others still use the cluster: the
            # controller stops it once every worker is done (stop_cluster_started_by).
            _started_marker(testrun).write_text(str(os.getpid()))
    yield env
    # Jobs of this session's module-scoped directories too (the per-test ones are gone already).
    cancel_slurm_jobs_under(tmp_path_factory.getbasetemp())
    # A cluster someone else left running (HALO_KEEP_CLUSTER=1 earlier) is theirs to stop.
    # A worker's own cluster (HALO_CLUSTER_PER_WORKER=1) is stopped by that worker, its only user.
    mine = not testrun or _cluster.worker_owns_cluster
    if started_here and mine and os.environ.get("HALO_KEEP_CLUSTER") != "1":
        with cluster_lock(exclusive=True):
            _cluster.down()


@pytest.fixture
def slurm_cluster_exclusive(slurm_cluster):
    """The cluster, with no other test using it meanwhile (conftest.py takes the lock EXCLUSIVE
    for a test that asks for this): for tests that stop the controller."""
    return slurm_cluster
