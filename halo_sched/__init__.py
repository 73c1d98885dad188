"""halo-sched: one multi-node torchrun job description, rendered for SLURM, Nomad or local processes.

    run = halo_sched.submit("job.yaml")            # a Run: retries as `retry:` says, records it
    state = run.result()                            # raises JobFailed (with the culprit) unless COMPLETED
    state.value                                     # what rank 0 handed back (halo_sched.node.result)

The library is the CLI's own path: the same submit pipeline, records, retries, notifications and
exit codes (docs/library.md). Every public name is importable from here; the modules load when
first used (``import halo_sched`` imports no backend, no pydantic model, never torch).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Union

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from .backends.base import Job, Scheduler
    from .jobstate import JobState, JobStatus
    from .core import JobRow
    from .logtags import LogLine
    from .models import JobSpec
    from .outcome import Culprit
    from .runs import AttemptRow, Run

#: What :func:`submit` and :func:`render` take: a JobSpec, a job file's path, or its content as a dict.
SpecLike = Union["JobSpec", str, "os.PathLike[str]", dict]

# Name -> module: imported when first asked for (PEP 562).
_LAZY = {
    "Job": "backends.base", "Scheduler": "backends.base", "JobState": "jobstate",
    "JobStatus": "jobstate", "JobSpec": "models", "Run": "runs", "AttemptRow": "runs",
    "LogLine": "logtags", "Culprit": "outcome", "JobRow": "core",
    "HaloError": "errors", "SpecError": "errors", "UsageError": "errors", "UnknownJob": "errors",
    "SchedulerError": "errors", "OutcomeUnknown": "errors", "MissingDependency": "errors",
    "JobFailed": "errors", "JobCancelled": "errors", "StillRunning": "errors",
    "spec_from_dict": ("spec", "from_dict"), "spec_from_yaml": ("spec", "from_yaml"),
    "with_changes": ("spec", "with_changes"),
    # What a submitit or TorchX user reaches for: the CLI's list, futures' as_completed.
    "list": ("runs", "list_jobs"), "as_completed": ("runs", "as_completed"),
}

__all__ = ["load", "loads", "render", "submit", "job", "run", "describe", "default_backend", "spec_of", "SpecLike",
           "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load(path: "str | os.PathLike[str]") -> "JobSpec":
    """Read and validate a job file; raises SpecError naming every bad field."""
    from .spec import load as _load

    return _load(path)


def loads(text: str) -> "JobSpec":
    """Validate a job file's YAML text; raises SpecError naming every bad field."""
    from .spec import loads as _loads

    return _loads(text)


def spec_of(spec: SpecLike) -> "JobSpec":
    """A JobSpec from what :func:`submit` takes: a JobSpec (as it is), a path to a job file, or
    the job file's content as a dict. Raises SpecError naming the field, never pydantic's
    ValidationError."""
    from .models import JobSpec
    from .spec import from_dict, load as _load

    if isinstance(spec, JobSpec):
        return spec
    if isinstance(spec, dict):
        return from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return _load(spec)
    from .errors import SpecError

    raise SpecError([("", f"expected a JobSpec, a job file's path or a dict, got {type(spec).__name__}")])


def default_backend(backend: str | None = None) -> str:
    """The backend a job without an id goes to: ``backend`` when given, else
    ``$HALO_SCHED_BACKEND``, else local, as for the CLI's ``--backend``. (For a job id, its job
    record comes second: :func:`job`.)"""
    from . import backends

    return backend or backends.default()


def render(spec: SpecLike, backend: str | None = None, **opts: Any) -> str:
    """The exact text ``backend`` (default: :func:`default_backend`) would submit (sbatch
    script, HCL or JSON, local plan). ``spec`` is validated again first, as a job file is."""
    from . import backends
    from .backends.base import checked_spec

    with checked_spec(spec_of(spec)) as checked:
        return backends.get(default_backend(backend)).render(checked, **opts)


def submit(spec: SpecLike, backend: str | None = None, retry_s: float | None = None, **opts: Any) -> "Run":
    """Submit a job (a JobSpec, a job file's path, or its content as a dict) as ``halo-sched
    submit`` does, and return its :class:`~halo_sched.runs.Run`: ``.id``, ``status()``,
    ``wait()``, ``result()``, ``done()``, ``wait_async()``, ``cancel()``, ``logs()``,
    ``attempts()``.

    Exactly once: through a scheduler outage the submission is retried for ``retry_s`` seconds
    (default ``$HALO_SUBMIT_RETRY_S`` or 120) and never creates a second job. The job's record
    is kept (``halo-sched status``/``list`` show it); ``wait()``/``result()`` retry as the job's
    ``retry:`` says and send its ``notify:`` events. ``opts`` go to the backend's render (Nomad:
    ``format``)."""
    from . import backends
    from .backends.base import checked_spec
    from .runs import Run

    with checked_spec(spec_of(spec)) as checked:
        sched = backends.get(default_backend(backend))
        sched.retry_s = retry_s
        return Run(sched, sched.submit(checked, **opts).id, checked, submitted=True)


def job(job_id: str, backend: str | None = None) -> "Job":
    """A handle on one submitted job (one attempt). Its backend: ``backend`` when given, else
    the one its job record names, else ``$HALO_SCHED_BACKEND``, else local (the CLI's rule,
    halo_sched.core.backends_of)."""
    from . import backends
    from .backends.base import Job
    from .core import backend_of

    return Job(backends.get(backend_of(job_id, backend)), job_id)


def describe(job_id: str, backend: str | None = None) -> dict:
    """Job ``job_id``'s record as a value (:meth:`Job.describe`: what ``export`` writes of it):
    its backend and ids, the spec it ran, the job file and git state, its outputs, its run, its
    last known state and rank 0's result once kept. The backend as for :func:`job`; UnknownJob
    without a record."""
    return job(job_id, backend).describe()


def run(job_id: str, backend: str | None = None) -> "Run":
    """The run that job ``job_id`` (any attempt of it) belongs to, found again by id: the same
    handle :func:`submit` returned, retrying as the recorded job file's ``retry:`` says (as
    ``halo-sched watch`` does). The backend as for :func:`job`."""
    from . import backends, records
    from .core import backend_of
    from .runs import Run, recorded_spec

    name = backend_of(job_id, backend)
    rec = (records.find(job_id, name) or [{}])[0]
    of_run = rec.get("run") if isinstance(rec.get("run"), dict) else {}
    run_id = of_run.get("id") if isinstance(of_run.get("id"), str) and of_run.get("id") else job_id
    return Run(backends.get(name), run_id, recorded_spec(name, job_id), current=job_id)
