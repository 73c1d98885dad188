"""What runs on the nodes, or beside them: standard library only.

The submitter's side (``halo_sched`` outside this package: the job file, the renderers, the
backends, the CLI) imports from here; nothing here imports from there, nor anything outside the
standard library (``tests/test_layers.py`` reads every module's imports and fails otherwise; the
one exception is the bandwidth test's ``torch``, imported inside its ``main()`` on the nodes).
Some of these modules travel to the nodes as their own source text, pasted into the scripts the
renderers write (:func:`source`), where halo-sched itself need not be installed:

* ``failure_collector`` runs after torchrun exits non-zero and writes one failure line per rank;
  ``failures`` reads those lines back (the submitter's backends and the local supervisor);
* ``server_health`` waits until every rollout server answers its health path;
* ``trainers/preflight_bw`` is the bandwidth test ``halo-sched preflight`` runs in place of the trainer;
* ``local_supervisor`` (``python -m halo_sched.node.local_supervisor DIR``) runs a local job's
  nodes; ``processes`` holds the Linux process helpers it shares with the local backend.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def source_path(module: str) -> Path:
    """The file of ``module`` (``"failure_collector"``, ``"trainers.preflight_bw"``) in this package."""
    return _HERE.joinpath(*module.split(".")).with_suffix(".py")


def source(module: str) -> str:
    """The text of ``module``, without its final newline: what a script carries to the nodes."""
    return source_path(module).read_text().rstrip("\n")
