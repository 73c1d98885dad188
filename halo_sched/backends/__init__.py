"""Backend registry. Backends load lazily: naming one imports only its module.

Third-party backends register under the ``halo_sched.backends`` entry-point group.
"""
from __future__ import annotations

import importlib
import os

from ..errors import UsageError
from .base import DryRun, Job, Scheduler

BUILTIN = {
    "local": "halo_sched.backends.local:LocalScheduler",
    "slurm": "halo_sched.backends.slurm:SlurmScheduler",
    "nomad": "halo_sched.backends.nomad:NomadScheduler",
}
#: The backend when none is named (``--backend``, ``$HALO_SCHED_BACKEND``, the library's ``backend=``).
DEFAULT = "local"

__all__ = ["BUILTIN", "DEFAULT", "DryRun", "Job", "JobState", "JobStatus", "Scheduler", "default", "get", "names"]


def __getattr__(name: str):
    """JobState and JobStatus, named here too: imported when first asked for (base.py)."""
    if name in ("JobState", "JobStatus"):
        from .. import jobstate

        return getattr(jobstate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default() -> str:
    """The backend a command uses when none is given: ``$HALO_SCHED_BACKEND``, else :data:`DEFAULT`."""
    return os.environ.get("HALO_SCHED_BACKEND", DEFAULT)


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group="halo_sched.backends")}


def names() -> list[str]:
    return sorted(set(BUILTIN) | set(_entry_points()))


def get(name: str, **opts) -> Scheduler:
    target = BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(names())}")
    module, _, attr = target.partition(":")
    return vars(importlib.import_module(module))[attr](**opts)
