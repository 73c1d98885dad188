"""pytest fixture for the real local SLURM cluster. Use from tests/conftest.py:

    from cluster.fixtures import slurm_cluster  # noqa: F401

HALO_SKIP_SLURM=1 skips the tests that need it; otherwise a cluster that fails to start is an
ERROR of those tests, never a silent skip. HALO_KEEP_CLUSTER=1 leaves it running after the
session (for debugging: `tests/cluster/slurm-cluster.sh status`, logs under .cluster/log).
"""
from __future__ import annotations

import os

import pytest

try:  # tests/ is on sys.path when pytest imports tests/conftest.py (no tests/__init__.py)
    from cluster import cluster as _cluster
except ImportError:  # imported as tests.cluster.fixtures
    from tests.cluster import cluster as _cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """Yields the cluster's environment (SLURM_CONF, HALO_SLURMRESTD_SOCKET/URL), which is also
    exported into os.environ for subprocesses."""
    if os.environ.get("HALO_SKIP_SLURM") == "1":
        pytest.skip("HALO_SKIP_SLURM=1: tests that need the local SLURM cluster are skipped")
    started_here = not _cluster.is_up()
    env = _cluster.ensure_up()  # raises ClusterError -> the test errors, with the daemons' logs
    yield env
    # A cluster someone else left running (HALO_KEEP_CLUSTER=1 earlier) is theirs to stop.
    if started_here and os.environ.get("HALO_KEEP_CLUSTER") != "1":
        _cluster.down()
