"""What runs on the nodes, or beside them: standard library only.

The submitter's side (``halo_sched`` outside this package: the job file, the renderers, the
backends, the CLI) imports from here; nothing here imports from there, nor anything outside the
standard library (``tests/test_layers.py`` reads every module's imports and fails otherwise; the
one exception is the bandwidth test's ``torch``, imported inside its ``main()`` on the nodes).
The modules the nodes run (:data:`CARRIED`) reach them as one versioned file: the node's own
halo-sched when its :func:`runtime_version` is the job's, else one zip of them the job carries
(halo_sched/node_runtime.py builds it; the entry script runs ``python -m halo_sched.node.MODULE``
either way, docs/node-runtime.md):

* ``failure_collector`` runs after torchrun exits non-zero and writes one failure line per rank;
  ``failures`` reads those lines back (the submitter's backends and the local supervisor);
* ``server_health`` waits until every rollout server answers its health path;
* ``trainers/preflight_bw`` is the bandwidth test ``halo-sched preflight`` runs in place of the trainer;
* ``restart`` runs in a SLURM batch script with ``retry:`` or ``slurm.spare_nodes`` after its
  trainer step failed: inside the allocation, ``spares`` gives a bad node's rank to a spare, or the
  ranks start again in place, or a crash loop ends the run (docs/recovery.md); ``maintenance``
  watches the step's nodes for a drain or a maintenance reservation, and a spare takes over;
* ``successor`` runs in a SLURM batch script after its trainer step failed for good: it submits
  the run's next attempt itself when ``retry:`` says so (docs/recovery.md); ``guardian`` runs in
  each attempt's guardian job, which does the same when the attempt lost its batch host; with ``restart`` and
  ``spares``, :data:`BATCH_ONLY`;
* ``local_supervisor`` (``python -m halo_sched.node.local_supervisor DIR``) runs a local job's
  nodes; ``processes`` holds the Linux process helpers it shares with the local backend;
* ``nomad_keeper`` is a Nomad run's keeper, the one task of the job's ``keeper`` group: it
  watches the trainer through the Task API and registers the run's next attempt
  (:data:`KEEPER`, its own copy).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent

#: What the nodes run, as paths in this package: the job carries these, and only these, when a
#: node's own halo-sched is another version (tests/test_node_runtime.py runs each from the zip).
CARRIED = ("__init__.py", "batch.sh", "contract.py", "entry.sh", "failure_classes.py", "failure_collector.py",
           "failures.py", "guardian.py", "hang_monitor.py", "links.py", "maintenance.py", "progress.py", "restart.py",
           "server.sh", "server_health.py", "shell.py", "nomad_keeper.py", "spares.py", "successor.py", "text.py",
           "trainers/__init__.py", "trainers/preflight_bw.py", "world.sh")
#: What only a SLURM batch script reads from the runtime, in its own shell: its functions, the steps it runs
#: after its trainer step failed, with ``slurm.spare_nodes`` or ``retry:`` (``restart``, ``spares``:
#: in the allocation; ``successor``: the run's next attempt), what they read failure
#: lines with, and the rollout servers' shell it hands to their steps. A Nomad job's copy leaves
#: them out: no task runs them (a Nomad server reads its shell from an item of its own), and the
#: copy must fit the job's Variable with its secrets (tests/test_node_runtime.py).
BATCH_ONLY = ("batch.sh", "failure_classes.py", "failures.py", "guardian.py", "maintenance.py", "restart.py", "server.sh", "spares.py", "successor.py",
              "text.py")
#: What only a Nomad run's keeper runs: left out of the SLURM and Nomad trainers' copies.
KEEPER_ONLY = ("nomad_keeper.py",)
#: What only a Nomad trainer's entry reads (hot spares: ``shell world``): left out of the SLURM copy.
NOMAD_ONLY = ("world.sh",)
#: The keeper's own copy (carried in a Variable of its own, which its group may read): the keeper
#: and what it reads failure lines and classifies them with.
KEEPER = ("__init__.py", "contract.py", "failure_classes.py", "failure_collector.py", "failures.py",
          "nomad_keeper.py", "text.py")


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

