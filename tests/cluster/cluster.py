"""Python handle on tests/cluster/slurm-cluster.sh: start/stop the local SLURM cluster.

    from cluster.cluster import ensure_up, down   # with tests/ on sys.path (pytest does that)
    env = ensure_up()        # also exported into os.environ: SLURM_CONF, HALO_SLURMRESTD_*
    ...
    down()
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("slurm-cluster.sh")


class ClusterError(RuntimeError):
    """The cluster could not be started or stopped; the message carries the script's output."""


def slurm_version() -> str:
    """The release the cluster runs (HALO_SLURM_VERSION, slurm-cluster.sh): 22.05 by default."""
    return os.environ.get("HALO_SLURM_VERSION") or "22.05"


def state_dir() -> Path:
    # As slurm-cluster.sh: outside the checkout, which may sit where munge and slurm cannot enter.
    root = Path(os.environ.get("HALO_CLUSTER_STATE_ROOT") or "/var/lib/halo-sched")
    return Path(os.environ.get("HALO_CLUSTER_DIR") or root / f"cluster-{slurm_version()}")


#: A SLURM pass run with HALO_CLUSTER_PER_WORKER=1 (tests/suite.sh) gives each pytest-xdist worker a
#: cluster of its own: worker gwN's state dir and slurmctld port (its nodes listen on the next three,
#: its slurmrestd 100 above), apart from every release's default ports (6817..6947) and the tests'
#: own (12000..20000, tests/helpers.py).
PER_WORKER_PORTS = {"22.05": 7000, "24.11": 7200, "26.05": 7400}
#: ... and its job ids from a band of its own: a job's rendezvous port is derived from its id modulo
#: 1000 (halo_sched/node/contract.py DERIVED_PORTS), and every cluster's nodes are this one host.
#: The 22.05 pass beside the current release's, two workers each: four bands of 250 (a worker's
#: pass submits about 125 jobs).
JOB_ID_BAND = 250


def per_worker_cluster(worker: str, version: str | None = None) -> tuple[str, int] | None:
    """(HALO_CLUSTER_DIR, HALO_CLUSTER_PORT) of xdist worker ``worker`` (gw0, gw1, ...) in a pass with
    a cluster per worker; None for a name that is not a worker's."""
    version = version or slurm_version()
    if not (worker.startswith("gw") and worker[2:].isdigit()) or int(worker[2:]) > 9:
        return None
    n = int(worker[2:])
    root = Path(os.environ.get("HALO_CLUSTER_STATE_ROOT") or "/var/lib/halo-sched")
    return str(root / f"cluster-{version}-{worker}"), PER_WORKER_PORTS.get(version, 7600) + 10 * n


def first_job_id(worker: str, version: str | None = None) -> int:
    """The first job id of worker ``worker``'s own cluster: 22.05's workers, then any other
    release's (the one that runs beside it), JOB_ID_BAND ids each, modulo 1000."""
    version = version or slurm_version()
    band = (0 if version == "22.05" else 2) + int(worker[2:])
    return 1 + (band % (1000 // JOB_ID_BAND)) * JOB_ID_BAND


def use_per_worker_cluster() -> bool:
    """In a pass with HALO_CLUSTER_PER_WORKER=1, point this xdist worker at its own cluster (the
    environment every later step reads: the lock, slurm-cluster.sh). Called before the lock's path
    is computed (tests/conftest.py, first thing). Whether it did."""
    if os.environ.get("HALO_CLUSTER_PER_WORKER") != "1" or os.environ.get("HALO_CLUSTER_DIR"):
        return False
    mine = per_worker_cluster(os.environ.get("PYTEST_XDIST_WORKER", ""))
    if mine is None:
        return False
    os.environ["HALO_CLUSTER_DIR"], port = mine
    os.environ["HALO_CLUSTER_PORT"] = str(port)
    os.environ["HALO_CLUSTER_FIRST_JOB_ID"] = str(first_job_id(os.environ["PYTEST_XDIST_WORKER"]))
    global worker_owns_cluster
    worker_owns_cluster = True
    return True


#: Whether this process is a worker with a cluster of its own (use_per_worker_cluster): it stops
#: the cluster itself at the end of its session, no other process using it.
worker_owns_cluster = False


def lock_path() -> str:
    """The cluster's lock (fixtures.cluster_lock): 22.05's as ever, another release's its own, and
    a cluster in a state dir of its own (HALO_CLUSTER_DIR, with its own HALO_CLUSTER_PORT) its own."""
    if os.environ.get("HALO_CLUSTER_DIR"):
        return os.environ["HALO_CLUSTER_DIR"].rstrip("/") + ".lock"
    version = slurm_version()
    return "/tmp/halo-slurm-cluster.lock" if version == "22.05" else f"/tmp/halo-slurm-cluster-{version}.lock"


def _run(command: str, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise ClusterError(f"slurm-cluster.sh {command} did not finish in {timeout}s") from e


def _parse_exports(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line[len("export ") :].partition("=")
            env[key.strip()] = value.strip()
    return env


def cluster_env() -> dict[str, str]:
    """SLURM_CONF etc. for this state dir (without starting anything)."""
    return _parse_exports(_run("env", 30).stdout)


def ensure_up(timeout: float | None = None) -> dict[str, str]:
    """Start the cluster if needed (installing packages the first time), wait for idle nodes,
    export its environment into ``os.environ`` and return it. Raises ClusterError. A release
    other than 22.05 is built first where this machine has no build of it (3.5 to 9 minutes
    measured on 2 cores), hence its longer default bound."""
    if timeout is None:
        timeout = 600 if slurm_version() == "22.05" else 1800
    proc = _run("up", timeout)
    if proc.returncode != 0:
        raise ClusterError(
            f"tests/cluster/slurm-cluster.sh up failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    env = _parse_exports(proc.stdout)
    if "SLURM_CONF" not in env:
        raise ClusterError(f"slurm-cluster.sh up printed no SLURM_CONF:\n{proc.stdout}\n{proc.stderr}")
    os.environ.update(env)
    return env


def down(timeout: float = 120) -> None:
    proc = _run("down", timeout)
    if proc.returncode != 0:
        raise ClusterError(
            f"tests/cluster/slurm-cluster.sh down failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )


def is_up() -> bool:
    return _run("status", 30).returncode == 0
