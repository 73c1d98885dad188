import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster.fixtures import slurm_cluster  # noqa: E402,F401  (session fixture: the real local cluster)


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    # Local jobs write their state under HALO_SCHED_HOME; keep each test's apart.
    monkeypatch.setenv("HALO_SCHED_HOME", str(tmp_path / "halo-home"))
    for k in list(os.environ):
        if k.startswith(("NOMAD_", "SLURM_JOB")):
            monkeypatch.delenv(k, raising=False)
    # A watcher is shared by every scheduler object that reaches the same scheduler for the
    # process's life; a test's stand-in transport must not answer for the next test.
    from halo_sched.backends import watcher

    with watcher._REGISTRY_LOCK:
        watcher._REGISTRY.clear()
