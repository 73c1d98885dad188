"""The one interface every backend implements, and the job handle users hold.

Flow: ``dryrun(spec)`` renders what would be submitted (pure, inspectable); ``schedule(dryrun)``
submits it (the only I/O); ``describe(ids)`` answers for many jobs with one scheduler query.
"""
from __future__ import annotations

import abc
import contextlib
import enum
import functools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence


class JobStatus(str, enum.Enum):
    """The small documented set every backend maps its states onto."""

    PENDING = "PENDING"
    PARTIAL = "PARTIAL"  # Nomad: k of N node allocations placed/running; never a final state
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    def __str__(self) -> str:  # pragma: no cover - str(enum) readability
        return self.value


_TERMINAL = {
    JobStatus.COMPLETED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.TIMEOUT,
    JobStatus.NODE_FAIL,
    JobStatus.PREEMPTED,
    JobStatus.OUT_OF_MEMORY,
}


@dataclass
class JobState:
    """One job's state as a backend reports it; ``raw_state`` keeps the scheduler's own word."""

    id: str
    status: JobStatus
    raw_state: str = ""
    exit_code: int | None = None
    nodes_total: int | None = None
    nodes_running: int | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Which rank failed first and why (a :class:`halo_sched.node.failures.FailureReport`), when the
    #: job's nodes reported it; ``describe`` then leads with it.
    failure: Any = None

    def describe(self) -> str:
        if self.failure is not None and self.failure.first is not None:
            # "FAILED: rank 3 (node 1, host h, local rank 1) exit 1 at 12:03:04: ValueError: ..."
            text = f"{self.status.value}: {self.failure.describe()}"
            return text + (f" (raw={self.raw_state})" if self.raw_state and self.raw_state != self.status.value else "")
        parts = [self.status.value]
        if self.nodes_total is not None and self.nodes_running is not None and not self.status.terminal:
            parts.append(f"{self.nodes_running}/{self.nodes_total} nodes running")
        if self.raw_state and self.raw_state != self.status.value:
            parts.append(f"raw={self.raw_state}")
        if self.exit_code is not None:
            parts.append(f"exit={self.exit_code}")
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.extra.get("restarts"):  # a requeued job: which run this is
            parts.append(f"run {self.extra['restarts'] + 1}")
        return " ".join(parts)


@dataclass
class DryRun:
    """What ``schedule`` would submit: ``text`` is printed by ``--dry-run``; ``payload`` is sent."""

    backend: str
    spec: Any
    text: str
    payload: Any = None


#: The methods that take a spec from their caller: each validates it again first (see below).
SPEC_ENTRY_POINTS = ("render", "dryrun", "submit", "plan")
_checking = threading.local()


@contextlib.contextmanager
def checked_spec(spec):
    """``spec`` validated again (``spec.validated``: the fields, then the layout rules, as for a
    job file), for the duration of one call: a spec changed with ``model_copy(update=...)`` or
    built without the layout rules gets the SpecError a job file would, before anything is
    rendered or sent. Within that call (submit -> dryrun -> render) the validated spec it passes
    on is not checked again."""
    if getattr(_checking, "spec", None) is spec:
        yield spec
        return
    from ..spec import validated

    checked = validated(spec)
    outer, _checking.spec = getattr(_checking, "spec", None), checked
    try:
        yield checked
    finally:
        _checking.spec = outer


def validates_spec(method):
    """``method(self, spec, ...)``, run with ``spec`` validated again (:func:`checked_spec`)."""
    if getattr(method, "_validates_spec", False):
        return method

    @functools.wraps(method)
    def wrapper(self, spec, *args, **kwargs):
        with checked_spec(spec) as spec:
            return method(self, spec, *args, **kwargs)

    wrapper._validates_spec = True
    return wrapper


class Scheduler(abc.ABC):
    """A backend. Subclasses are the only place that knows their scheduler.

    Every spec a backend is given through :data:`SPEC_ENTRY_POINTS` is validated again first,
    a subclass's own overrides included (``__init_subclass__``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in SPEC_ENTRY_POINTS:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__isabstractmethod__", False):
                setattr(cls, name, validates_spec(method))

    name: str = ""
    #: Seconds submit and cancel keep retrying through a scheduler outage (None: the
    #: ``HALO_SUBMIT_RETRY_S`` environment variable, else 120; see halo_sched.exactly_once).
    retry_s: float | None = None

    @abc.abstractmethod
    def render(self, spec, **opts) -> str:
        """The rendered job as text (pure)."""

    @validates_spec
    def dryrun(self, spec, **opts) -> DryRun:
        return DryRun(self.name, spec, self.render(spec, **opts))

    @abc.abstractmethod
    def schedule(self, dryrun: DryRun) -> str:
        """Submit; return the job id."""

    @validates_spec
    def submit(self, spec, **opts) -> "Job":
        from ..records import git_state_started, record_submit

        dry = self.dryrun(spec, **opts)
        git = git_state_started(spec)  # read while sbatch (or the Nomad API) answers
        job = Job(self, self.schedule(dry))
        record_submit(self, dry, job.id, getattr(spec, "source", None), git)
        return job

    @abc.abstractmethod
    def describe(self, ids: Sequence[str]) -> dict[str, JobState]:
        """States of many jobs, with as few scheduler queries as possible."""

    @abc.abstractmethod
    def cancel(self, ids: Sequence[str], **opts) -> None:
        """Cancel jobs."""

    @abc.abstractmethod
    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """Lines of the job's output, each prefixed with its node where the backend splits them."""

    def watch(self, spec, job_id: str, on_progress: Callable[[JobState], None] | None = None) -> JobState:
        """A backend's own guard right after submit (Nomad: the placement watchdog).

        Returns the job's state; ``--wait`` then polls until it is terminal.
        """
        return self.describe([job_id])[job_id]

    def wait(self, job_id: str, timeout: float | None = None, **opts) -> JobState:
        """Until the job is terminal (or ``timeout`` seconds pass); ``opts`` as :func:`wait_for`
        takes them. A backend may act on what it sees (Nomad stops a job whose rank died)."""
        return wait_for(self, job_id, timeout=timeout, **opts)

    #: How old a state ``Job.status()`` may return (seconds): handles share one poll within it.
    status_max_age: float = 1.0

    def watch_key(self):
        """Scheduler objects with equal keys talk to the same scheduler and share one watcher
        (backends/watcher.py): one query per poll for all their handles."""
        return (type(self), id(self))

    def progress(self, state: JobState) -> str:
        """A one-line human summary for ``--wait``."""
        return state.describe()


class Job:
    """A handle on a submitted job: ``status()``, ``wait()``, ``cancel()``, ``logs()``."""

    def __init__(self, scheduler: Scheduler, job_id: str):
        self.scheduler = scheduler
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.scheduler.name!r}, {self.id!r})"

    def status(self) -> JobState:
        """The job's state: one scheduler query answers every handle on this scheduler that asks
        within ``status_max_age`` seconds; a finished job's state is never asked for again."""
        from .watcher import watcher_for

        if self.scheduler.status_max_age <= 0:  # a backend whose describe loads no scheduler
            return self.scheduler.describe([self.id])[self.id]
        return watcher_for(self.scheduler).state(self.id, self.scheduler.status_max_age)

    def wait(
        self,
        timeout: float | None = None,
        poll: float = 1.0,
        max_poll: float = 30.0,
        on_change: Callable[[JobState], None] | None = None,
    ) -> JobState:
        """Until the job is terminal (or ``timeout`` seconds pass): :meth:`Scheduler.wait`."""
        return self.scheduler.wait(self.id, timeout=timeout, poll=poll, max_poll=max_poll, on_change=on_change)

    def cancel(self, **opts) -> None:
        from .watcher import watcher_for

        self.scheduler.cancel([self.id], **opts)
        watcher_for(self.scheduler).forget(self.id)  # the next status() asks the scheduler

    def logs(self, follow: bool = False) -> Iterator[str]:
        return self.scheduler.logs(self.id, follow=follow)


def wait_for(
    scheduler: Scheduler,
    job_id: str,
    timeout: float | None = None,
    poll: float = 1.0,
    max_poll: float = 30.0,
    on_change: Callable[[JobState], None] | None = None,
    on_tick: Callable[[JobState], None] | None = None,
    max_running_poll: float = 3.0,
) -> JobState:
    """Backoff polling shared by every backend and every thread: the scheduler's watcher polls
    all the jobs waited on with one query, its interval doubling while nothing changes (up to
    ``max_poll``; while a job runs: ``poll`` for its first minute, then ``max_running_poll``)."""
    from .watcher import wait_shared

    return wait_shared(scheduler, job_id, timeout=timeout, poll=poll, max_poll=max_poll,
                       max_running_poll=max_running_poll, on_change=on_change, on_tick=on_tick)


def tail_lines(path, follow: bool, finished: Callable[[], bool], poll: float = 0.5) -> Iterator[str]:
    """Lines of a log file; with ``follow``, keep reading as it grows until ``finished()``.

    A partial last line is held back while the job may still complete it.
    """
    with open(path, "rb") as f:
        while True:
            line = f.readline()
            if line.endswith(b"\n") or (line and not follow):
                yield line.decode("utf-8", "replace")
                continue
            if line:  # a partial line while following: wait for its end
                f.seek(-len(line), os.SEEK_CUR)
            if not follow:
                return
            if finished():
                rest = f.read()
                if rest:
                    yield rest.decode("utf-8", "replace")
                return
            time.sleep(poll)
