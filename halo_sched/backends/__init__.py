"""Backend registry. Backends load lazily: naming one imports only its module.

Third-party backends register under the ``halo_sched.backends`` entry-point group.
"""
from __future__ import annotations

import importlib

from ..errors import UsageError
from .base import DryRun, Job, JobState, JobStatus, Scheduler

BUILTIN = {
    "local": "halo_sched.backends.local:LocalScheduler",
    "slurm": "halo_sched.backends.slurm:SlurmScheduler",
    "nomad": "halo_sched.backends.nomad:NomadScheduler",
}
DEFAULT = "local"

__all__ = ["BUILTIN", "DEFAULT", "DryRun", "Job", "JobState", "JobStatus", "Scheduler", "get", "names"]


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
    return getattr(importlib.import_module(module), attr)(**opts)
