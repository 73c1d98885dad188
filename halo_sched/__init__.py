"""halo-sched: one multi-node torchrun job description, rendered for SLURM, Nomad or local processes.

    spec = halo_sched.load("job.yaml")
    print(halo_sched.render(spec, "slurm"))
    job = halo_sched.submit(spec, "local")
    job.wait()
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from .backends.base import Job
    from .models import JobSpec

__all__ = ["load", "loads", "render", "submit", "job", "__version__"]


def load(path) -> "JobSpec":
    """Read and validate a job file; raises SpecError naming every bad field."""
    from .spec import load as _load

    return _load(path)


def loads(text: str) -> "JobSpec":
    from .spec import loads as _loads

    return _loads(text)


def render(spec: "JobSpec", backend: str | None = None, **opts) -> str:
    """The exact text ``backend`` (default: :data:`halo_sched.backends.DEFAULT`, local) would submit
    (sbatch script, HCL or JSON, local plan).

    ``spec`` is validated again first, as a job file is: a spec changed with ``model_copy`` or
    built directly gets the same SpecError."""
    from . import backends
    from .backends.base import checked_spec

    with checked_spec(spec) as spec:
        return backends.get(backend or backends.DEFAULT).render(spec, **opts)


def submit(spec: "JobSpec", backend: str | None = None, retry_s: float | None = None, **opts) -> "Job":
    """Submit and return a handle with ``.id``, ``.status()``, ``.wait()``, ``.cancel()``, ``.logs()``.

    Exactly once: through a scheduler outage the submission is retried for ``retry_s`` seconds
    (default ``$HALO_SUBMIT_RETRY_S`` or 120) and never creates a second job. ``spec`` is
    validated again first, as for :func:`render`."""
    from . import backends
    from .backends.base import checked_spec

    with checked_spec(spec) as spec:
        sched = backends.get(backend or backends.DEFAULT)
        sched.retry_s = retry_s
        return sched.submit(spec, **opts)


def job(job_id: str, backend: str | None = None) -> "Job":
    """A handle on an already submitted job."""
    from . import backends

    return backends.Job(backends.get(backend or backends.DEFAULT), job_id)
