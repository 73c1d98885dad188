"""The local SLURM test cluster as the benches measure on it (tests/cluster/slurm-cluster.sh):
its environment, its lock, whether it answers, and bringing it up and down. bench/run.py,
bench/spares.py and bench/recovery.py each import it; it imports none of them."""
from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLUSTER = REPO / "tests" / "cluster" / "slurm-cluster.sh"


def cluster_env() -> dict:
    """The cluster's variables (``slurm-cluster.sh env``: ``export NAME=VALUE``, shell-quoted)."""
    out = subprocess.run([str(CLUSTER), "env"], capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        line = line.removeprefix("export ").strip()
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = shlex.split(v)[0] if v else ""
    return env


def slurm_answers() -> bool:
    return bool(shutil.which("sbatch")) and subprocess.run(["squeue", "-h"], capture_output=True).returncode == 0


class cluster_lock:
    """The shared test cluster's lock (tests/cluster/slurm-cluster.sh): held only while measuring."""

    def __enter__(self):
        self.f = open("/tmp/halo-slurm-cluster.lock", "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        self.f.close()


def cluster_up(env: dict | None = None) -> bool:
    """The local test cluster, brought up (under its lock) when SLURM is installed and no cluster
    answers; True when this call started it (then :func:`cluster_down` stops it again). Its
    variables go into this process's environment, and into ``env`` when given (a bench's own)."""
    if not CLUSTER.exists() or not shutil.which("slurmctld"):
        return False
    os.environ.update(cluster_env())
    if env is not None:
        env.update(cluster_env())
    if slurm_answers():
        return False
    print("starting the local SLURM cluster (tests/cluster/slurm-cluster.sh up)", flush=True)
    with cluster_lock():
        if slurm_answers():  # someone else started it meanwhile
            return False
        subprocess.run([str(CLUSTER), "up"], check=True, stdout=subprocess.DEVNULL)
    return True


def cluster_down() -> None:
    with cluster_lock():
        subprocess.run([str(CLUSTER), "down"], stdout=subprocess.DEVNULL)
