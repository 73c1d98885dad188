"""What runs on the nodes, or beside them: standard library only.

The submitter's side (``halo_sched`` outside this package: the job file, the renderers, the
backends, the CLI) imports from here; nothing here imports from there, nor anything outside the
standard library (``tests/test_layers.py`` reads every module's imports and fails otherwise; the
one exception is the bandwidth test's ``torch``, imported inside its ``main()`` on the nodes).
The modules the nodes run (:data:`CARRIED`) reach them as one versioned file: the node's own
halo-sched when its :func:`runtime_version` is the job's, else one zip of them the job carries
(halo_sched/node_runtime.py builds it; the entry script runs ``python -m halo_sched.node.MODULE``
either way, docs/node-runtime.md). The modules (docs/architecture.md's map says what each does):
``failure_collector`` writes a failed rank's line, ``failures`` reads it back; ``server_health``;
``trainers/preflight_bw``; a SLURM batch script's ``restart``, ``spares``, ``maintenance`` and
``successor`` and an attempt's guardian job's ``guardian`` (:data:`BATCH_ONLY`); the local
backend's ``local_supervisor`` and ``processes``; a Nomad run's ``nomad_keeper`` (:data:`KEEPER`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent

#: What the nodes run, as paths in this package: the job carries these, and only these, when a
#: node's own halo-sched is another version (tests/test_node_runtime.py runs each from the zip).
CARRIED = ("__init__.py", "batch.sh", "contract.py", "entry.sh", "failure_classes.py", "failure_collector.py",
           "failures.py", "guardian.py", "hang_monitor.py", "links.py", "maintenance.py", "progress.py", "restart.py",
           "server.sh", "server_health.py", "shell.py", "nomad_keeper.py", "nomad_names.py", "spares.py", "successor.py",
           "text.py", "trainers/__init__.py", "trainers/preflight_bw.py", "world.sh")
#: What only a SLURM batch script reads from the runtime, in its own shell: its functions, the steps it runs
#: after its trainer step failed, with ``slurm.spare_nodes`` or ``retry:`` (``restart``, ``spares``:
#: in the allocation; ``successor``: the run's next attempt), what they read failure
#: lines with, and the rollout servers' shell it hands to their steps. A Nomad job's copy leaves
#: them out: no task runs them (a Nomad server reads its shell from an item of its own), and the
#: copy must fit the job's Variable with its secrets (tests/test_node_runtime.py).
BATCH_ONLY = ("batch.sh", "failure_classes.py", "failures.py", "guardian.py", "maintenance.py", "restart.py", "server.sh",
              "spares.py", "successor.py", "text.py")
#: Only in a Nomad run's keeper's own copy (KEEPER) / a Nomad trainer's (hot spares: ``shell world``).
KEEPER_ONLY = ("nomad_keeper.py", "nomad_names.py")
NOMAD_ONLY = ("world.sh",)
KEEPER = ("__init__.py", "contract.py", "failure_classes.py", "failure_collector.py", "failures.py",
          "nomad_keeper.py", "nomad_names.py", "text.py")


def runtime_version() -> str:
    """The version of the node runtime here: the first 16 hex digits of a SHA-256 over the
    :data:`CARRIED` files' names and bytes. Equal on the submitter and a node exactly when the
    nodes would run the same code."""
    h = hashlib.sha256()
    for name in CARRIED:
        data = _HERE.joinpath(name).read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def source_path(module: str) -> Path:
    """The file of ``module`` (``"failure_collector"``, ``"trainers.preflight_bw"``) in this package."""
    return _HERE.joinpath(*module.split(".")).with_suffix(".py")

