"""The one interface every backend implements, the submit pipeline, and the job handle users hold.

Flow: ``dryrun(spec)`` renders what would be submitted (pure, inspectable); ``schedule(dryrun)``
submits it (the only I/O); ``query(ids)`` answers for many jobs with one scheduler query.
:meth:`Scheduler.submit` is the one submit sequence, for the library and the CLI alike.
What a backend may do beyond that is declared as a :class:`typing.Protocol` below and checked
with ``isinstance``.

Imports: this module imports the job states (jobstate.py); the shared watcher (watcher.py) when
a job is waited on, the job records (records.py) on submit (render needs neither); none of them
imports anything back.
"""
from __future__ import annotations

import abc
import contextlib
import functools
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from ..errors import HaloError
    from ..logtags import LogLine
    from ..spec import JobSpec
    from ..jobstate import JobState


def __getattr__(name: str):
    """The job states (jobstate.py) are named here too, and imported when first asked for: a
    scheduler's render path (`halo-sched render`) reads no job state."""
    if name in ("JobState", "JobStatus", "NomadDetail", "SlurmDetail"):
        from .. import jobstate

        return getattr(jobstate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _new_token() -> str:
    from ..exactly_once import new_token

    return new_token()


@dataclass
class DryRun:
    """What ``schedule`` would submit: ``text`` is printed by ``--dry-run``; ``payload`` is sent.

    ``token`` is the submission's exactly-once token, made once per dry run: after an
    ambiguous failure, the job found with it is this submission's (SLURM: its comment; Nomad:
    its meta, already in ``payload``)."""

    backend: str
    spec: JobSpec
    text: str
    #: What ``schedule`` sends: the local entry script, Nomad's job JSON (SLURM sends ``text``).
    payload: str | dict | None = None
    token: str = field(default_factory=_new_token)


def new_failure_key() -> str:
    """A job's failure key: its nodes sign their failure lines with it (node/failures.py). It
    travels in the environment the backend submits with (SLURM: sbatch's, as secret_env values
    do; local: the supervisor's; Nomad: the trainer tasks' Env, added after the dry run) and in
    the job's record, never in a rendered file, a log line or a repr."""
    import secrets

    return secrets.token_hex(32)


#: The process's environment is one for all its threads: a pipeline submitting from 8 threads
#: would hand one job's key to another job's nodes (their lines then verify under neither). One
#: submit at a time holds it (tests/test_library_concurrency.py).
_KEY_ENV_LOCK = threading.RLock()


def inherited_job_names(environ) -> list[str]:
    """The variables in ``environ`` that halo-sched itself gives a job's processes, so that in a
    submitting environment they are another job's: a run's identity and state (``HALO_RUN_*``,
    the hand-off to a SLURM successor: node/successor.py; ``HALO_RESTART_COUNT``, the attempt),
    each node's part in its job and the job's failure key (node/contract.py ``EnvNames``), the
    layout (``HALO_PARALLEL_*``) and the server roles (``HALO_SERVER_*``). A shell that copied
    them, or a rank that submits a job of its own, has them; the user's own settings
    (``HALO_SCHED_HOME``, ``HALO_SCHED_BACKEND``, ``HALO_SUBMIT_RETRY_S``, ...) are none of them."""
    from ..node.contract import EnvNames

    exact = {v for v in vars(EnvNames).values() if isinstance(v, str) and v.startswith("HALO_")}
    prefixes = ("HALO_RUN_", "HALO_PARALLEL_", EnvNames.role_prefix)
    return sorted(k for k in environ if k in exact or k.startswith(prefixes))


@contextlib.contextmanager
def failure_key_in_env(key: str):
    """This process's environment as a job is submitted from it (one thread at a time: the
    environment is the process's): ``key`` as its ``HALO_FAILURE_KEY``, and without
    :func:`inherited_job_names` (another job's run, attempt and node variables would make the
    new job that job's attempt: SLURM's batch script takes ``HALO_RUN_*`` as its run, local
    ranks inherit them), with one warning line naming them. Restored afterwards."""
    from ..node.contract import NAMES

    with _KEY_ENV_LOCK:
        saved = {k: os.environ[k] for k in inherited_job_names(os.environ)}
        shown = [k for k in saved if k != NAMES.failure_key]
        if shown:
            print(f"halo-sched: warning: {', '.join(shown)} {'is' if len(shown) == 1 else 'are'} set here: another "
                  "job's run, attempt or node (halo-sched sets them in a job's processes); left out of this job",
                  file=sys.stderr)
        for k in saved:
            del os.environ[k]
        os.environ[NAMES.failure_key] = key
        try:
            yield
        finally:
            os.environ.pop(NAMES.failure_key, None)
            os.environ.update(saved)


def step(name: str) -> None:
    """Starting a run's next attempt has passed step ``name``: ``claimed`` (the store's claim
    held), ``decided`` (the attempt's identity recorded), ``laid-out`` (local: its job directory
    whole), ``started`` (its supervisor started), ``recorded`` (the claim settled). Nothing
    happens here: tests/test_one_attempt.py replaces it to SIGKILL the run's actor at each step.
    Called as ``base.step(...)``, so that the replacement is seen."""


def warn_short_secrets(values: dict) -> None:
    """One warning line per secret_env value too short to scrub from failure reports: as a
    substring it would mangle ordinary text (a value "x" turns "exit" into "e***it"), so it is
    left as is wherever the job's output goes (the record, status, the webhook)."""
    import sys

    from ..node.failure_collector import MIN_SECRET_CHARS

    for name, value in values.items():
        if 0 < len(value) < MIN_SECRET_CHARS:
            print(f"halo-sched: warning: secret_env {name} is {len(value)} characters long, too short to scrub "
                  f"from failure lines and notifications without mangling other text (at least {MIN_SECRET_CHARS}); "
                  "it is not scrubbed", file=sys.stderr)


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
    outer = _checking.__dict__.get("spec")
    if outer is spec:
        yield spec
        return
    from ..spec import validated

    checked = validated(spec)
    _checking.spec = checked
    try:
        yield checked
    finally:
        _checking.spec = outer


def backend_only(backend: str, spec) -> None:
    """Fields only one backend can honour, refused on the others (SpecError naming the field)."""
    if spec.slurm.spare_nodes and backend != "slurm":
        from ..errors import SpecError

        raise SpecError([("slurm.spare_nodes", f"hot spares are SLURM's (sbatch --no-kill, a step on some nodes of "
                                               f"the allocation); the {backend} backend cannot hold them: drop "
                                               "slurm.spare_nodes or use --backend slurm")])
    if spec.nomad.spare_nodes and backend != "nomad":
        from ..errors import SpecError

        raise SpecError([("nomad.spare_nodes", f"hot spares here are Nomad's (allocations of the trainer's group that the "
                                               f"run's keeper hands a rank); the {backend} backend cannot hold them: drop "
                                               "nomad.spare_nodes, or use slurm.spare_nodes with --backend slurm")])


def validates_spec(method):
    """``method(self, spec, ...)``, run with ``spec`` validated again (:func:`checked_spec`)."""
    if method in _VALIDATING:
        return method

    @functools.wraps(method)
    def wrapper(self, spec, *args, **kwargs):
        with checked_spec(spec) as spec:
            backend_only(self.name, spec)
            return method(self, spec, *args, **kwargs)

    _VALIDATING.add(wrapper)
    return wrapper


_VALIDATING: set = set()


def writable_store() -> None:
    """Refuse (exit 2, naming HALO_SCHED_HOME) a submit whose record could not be kept because
    this user cannot write the home or the store in it; made private (0700) when it is new. A
    store that is broken otherwise is said after the submit (records.record_submit)."""
    from .. import db, store

    store.make_home()
    try:
        db.writable()
    except db.ReadOnlyStore:
        raise
    except db.StoreError:
        pass


class Scheduler(abc.ABC):
    """A backend. Subclasses are the only place that knows their scheduler.

    Every spec a backend is given through :data:`SPEC_ENTRY_POINTS` is validated again first,
    a subclass's own overrides included (``__init_subclass__``)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in SPEC_ENTRY_POINTS:
            method = cls.__dict__.get(name)
            if callable(method) and not vars(method).get("__isabstractmethod__", False):
                setattr(cls, name, validates_spec(method))

    name: str = ""
    #: Seconds submit and cancel keep retrying through a scheduler outage (None: the
    #: ``HALO_SUBMIT_RETRY_S`` environment variable, else 120; see halo_sched.exactly_once).
    retry_s: float | None = None
    #: ``submit --wait`` follows the job's log live (the local backend: a file on this machine).
    streams_logs: bool = False

    @abc.abstractmethod
    def render(self, spec: JobSpec, **opts) -> str:
        """The rendered job as text (pure)."""

    @validates_spec
    def dryrun(self, spec: JobSpec, **opts) -> DryRun:
        return DryRun(self.name, spec, self.render(spec, **opts))

    @abc.abstractmethod
    def schedule(self, dryrun: DryRun) -> str:
        """Submit; return the job id."""

    @validates_spec
    def submit(self, spec: JobSpec, **opts) -> "Job":
        """The submit pipeline, the one the CLI runs too: the dry run (with its exactly-once
        token), the secrets checked before anything is sent (an unset ``secret_env`` variable is
        a SpecError naming it), the git state of the trainer's tree (read while the scheduler
        answers), ``schedule``, then the job's record (with the job file and its SHA-256 when
        the spec was loaded from one: ``spec.job_file``). First of all, a job file's
        ``trainer.script`` that the nodes would not find is a SpecError naming it
        (``spec.checked_script``)."""
        from .. import records
        from ..spec import checked_script

        for line in checked_script(spec, self.name).notes:  # a trainer.script that is not there: exit 2
            print(f"halo-sched: warning: {line}", file=sys.stderr)
        dry = self.dryrun(spec, **opts)
        writable_store()  # before anything is sent: a home or store this user cannot write is exit 2
        warn_short_secrets(spec.secret_values())
        git = records.git_state_started(spec)
        key = new_failure_key()
        with failure_key_in_env(key):
            job_id = self.schedule(dry)
        records.record_submit(self.name, spec, dry.text, job_id, {**self.record_fields(dry, job_id), "failure_key": key},
                              spec.job_file, git)
        return Job(self, job_id)

    def record_fields(self, dryrun: DryRun, job_id: str) -> dict:
        """What the job's record keeps of where it went (``outputs``, ``scheduler``)."""
        return {}

    #: A run's next attempts are started by an actor of the scheduler's own, never by a process
    #: that reads the run (SLURM: the failed attempt's batch script, halo_sched/node/successor.py,
    #: or its guardian; local: the run's keeper; Nomad: the keeper group of the job): readers
    #: follow them (:meth:`successor_of`, the store's successors). Without it, a failed attempt
    #: of a run is its last.
    starts_successor: bool = False

    def successor_of(self, record: dict) -> dict | None:
        """The successor the attempt of ``record`` submitted itself: ``{"job", "excluded",
        "submitted_at"}`` (read as a job wrote it: checked), or None."""
        return None

    def owner_gone(self, run_id: str) -> bool:
        """Whether the actor that starts run ``run_id``'s attempts (a scheduler that
        ``starts_successor``) is known to be gone, so that none will come unless one is started
        again (:meth:`start_owner`). Default: never (SLURM: the attempt itself, or its guardian,
        submits)."""
        return False

    def start_owner(self, run_id: str) -> bool:
        """Start run ``run_id``'s actor again where it is gone and a reader can (local: the run's
        keeper, detached, as ``submit`` starts it: halo_sched/keeper.py); True when one was
        started. The reader that calls it starts no attempt itself. Default: nothing to start
        (SLURM's guardian and a Nomad keeper group are placed again by their scheduler)."""
        return False

    def attempt_fields(self, record: dict, job_id: str) -> dict:
        """The record fields of ``job_id``, the next attempt of ``record``'s job (``outputs``)."""
        return {}

    def guardian_alive(self, job_id: str) -> bool:
        """Whether something outside attempt ``job_id`` may still start its successor
        (SLURM: the attempt's guardian job, pending or running: halo_sched/node/guardian.py), so
        that a reader waits for it. Default: nothing does."""
        return False

    @abc.abstractmethod
    def query(self, ids: Sequence[str]) -> dict[str, JobState]:
        """States of many jobs, with as few scheduler queries as possible."""

    def for_listing(self) -> "Scheduler":
        """A scheduler whose :meth:`query` gives up at once when the scheduler is down, for
        ``list`` (the job records hold the last known states). Default: this one."""
        return self

    @abc.abstractmethod
    def cancel(self, ids: Sequence[str], **opts) -> dict[str, str] | None:
        """Cancel jobs. May return {id: its state in words} for jobs found already ended (nothing
        done to them)."""

    @abc.abstractmethod
    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """Lines of the job's output, each prefixed with its node where the backend splits them."""

    #: What the backend knows of each line of :meth:`logs` besides its text, so that ``logs``
    #: can filter on it (halo_sched/logtags.py: ``"time"``, ``"stream"``): its lines are then
    #: ``logtags.Raw`` strings carrying them. Default: nothing.
    log_fields: frozenset = frozenset()

    def read_result(self, job_id: str, record: dict | None = None) -> bytes | None:
        """The bytes rank 0 wrote to ``HALO_RESULT_FILE`` (halo_sched/node/result.py: at most
        ``MAX_BYTES + 1`` of them read), None when it wrote none; ``record`` is the job's record
        when there is one. :class:`~halo_sched.node.result.ResultError` for a file that cannot be
        a result, or where this backend does not carry one (the default: say so); a
        :class:`~halo_sched.errors.HaloError` when it cannot be read now (asked again later)."""
        from ..node.result import ResultError

        raise ResultError(f"not carried: the {self.name} backend does not carry a result (HALO_RESULT_FILE)")

    def guard_placement(self, spec: JobSpec, job_id: str,
                        on_change: Callable[[JobState], None] | None = None,
                        outage_s: float | None = None) -> JobState:
        """A backend's own guard right after submit (Nomad: stop a job that does not place in
        time), waiting through a scheduler outage as :meth:`wait` does (``outage_s``). Returns
        the job's state; ``--wait`` then waits until it is terminal."""
        return self.query([job_id])[job_id]

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change: Callable[[JobState], None] | None = None,
             on_tick: Callable[[JobState], None] | None = None,
             outage_s: float | None = None,
             on_outage: Callable[[str], None] | None = None) -> JobState:
        """Until the job is terminal (or ``timeout`` seconds pass), on the scheduler's shared
        watcher (:func:`halo_sched.backends.watcher.wait_shared`). A backend may act on what it
        sees (Nomad stops a job whose rank died).

        Through a scheduler outage it keeps waiting for ``outage_s`` seconds (None:
        ``$HALO_OUTAGE_S``, else 600; halo_sched/outage.py), telling ``on_outage`` once per
        minute (default: the ``halo_sched`` logger); past that, or unreachable when ``timeout``
        ends, it raises :class:`~halo_sched.errors.OutcomeUnknown` (exit 3)."""
        from .watcher import wait_shared  # not on the render path

        return wait_shared(self, job_id, timeout=timeout, poll=poll, max_poll=max_poll,
                           on_change=on_change, on_tick=on_tick, outage_s=outage_s, on_outage=on_outage)

    def acts_on(self, job_id: str, state: JobState) -> JobState | None:
        """What this backend's :meth:`wait` does on a state it sees, for a waiter that polls on
        its own (the asyncio wait, watcher.py): the job's final state when the backend
        ended it (SLURM: a job that can never start), else None (the default: nothing). Cheap
        unless it acts: the asyncio wait calls it on its loop."""
        return None

    #: The backend's :meth:`wait` acts in ways :meth:`acts_on` cannot (Nomad's watchdog stops a
    #: job whose rank died, and guards its placement): an asyncio wait then runs that wait in the
    #: loop's executor, a thread for the wait, so that the guarantees stay the same.
    waits_in_thread: bool = False

    #: How old a state ``Job.status()`` may return (seconds): handles share one poll within it.
    status_max_age: float = 1.0

    def watcher_key(self):
        """Scheduler objects with equal keys talk to the same scheduler and share one watcher
        (backends/watcher.py): one query per poll for all their handles."""
        return (type(self), id(self))

    def progress(self, state: JobState) -> str:
        """A one-line human summary for ``--wait``."""
        return state.describe()


@runtime_checkable
class Plans(Protocol):
    """A backend that can ask its scheduler whether a job would run, submitting nothing
    (``halo-sched plan``): (whether it would, the text that says so)."""

    def plan(self, spec: JobSpec) -> tuple[bool, str]: ...


#: Per event loop: the lock that has ``Job.wait_async`` read one ended job's result at a time.
_VALUE_READS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Job:
    """A handle on one submitted job (one attempt of a run: :class:`halo_sched.runs.Run` is the
    handle on all of them). The same methods as a run's: ``status()``, ``wait()``, ``result()``,
    ``done()``, ``wait_async()``, ``cancel()``, ``logs()``. An id that neither a job record nor
    the scheduler knows raises :class:`~halo_sched.errors.UnknownJob` from each of them (the
    CLI's exit 2)."""

    def __init__(self, scheduler: Scheduler, job_id: str):
        self.scheduler = scheduler
        self.id = job_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.scheduler.name!r}, {self.id!r})"

    @property
    def backend(self) -> str:
        return self.scheduler.name

    def _known(self, state: JobState) -> JobState:
        """``state``, unless it says that nobody knows the job (known.unknown: UNKNOWN to the
        scheduler and no job record): then UnknownJob, as the CLI's status, logs and cancel."""
        from ..known import unknown

        if unknown(self.scheduler.name, {self.id: state}, [self.id]):
            from ..errors import UnknownJob

            raise UnknownJob([self.id], self.scheduler.name, state.reason)
        return state

    def status(self) -> JobState:
        """The job's state: one scheduler query answers every handle on this scheduler that asks
        within ``status_max_age`` seconds; a finished job's state is never asked for again.
        Reads only: nothing is written to the records, the ledger or a webhook."""
        if self.scheduler.status_max_age <= 0:  # a backend whose query loads no scheduler
            return self._known(self.scheduler.query([self.id])[self.id])
        from .watcher import watcher_for

        return self._known(watcher_for(self.scheduler).state(self.id, self.scheduler.status_max_age))

    def done(self) -> bool:
        """Whether the job has ended (any end: completed, failed, cancelled, ...)."""
        return self.status().status.terminal

    def wait(
        self,
        timeout: float | None = None,
        poll: float = 1.0,
        max_poll: float = 30.0,
        on_change: Callable[[JobState], None] | None = None,
        outage_s: float | None = None,
        on_outage: Callable[[str], None] | None = None,
    ) -> JobState:
        """Until the job is terminal (or ``timeout`` seconds pass: then its state so far):
        :meth:`Scheduler.wait`, which waits through a scheduler outage of up to ``outage_s``
        seconds (``$HALO_OUTAGE_S``, else 600) and then raises
        :class:`~halo_sched.errors.OutcomeUnknown`. Returns the final state, with rank 0's
        result as ``.value`` (halo_sched/outcome.py ``attach_value``; reads only)."""
        from ..outcome import attach_value

        return attach_value(self.scheduler, self.id, self._known(self.scheduler.wait(
            self.id, timeout=timeout, poll=poll, max_poll=max_poll, on_change=on_change, outage_s=outage_s,
            on_outage=on_outage)))

    def result(self, timeout: float | None = None) -> JobState:
        """Wait, then the final state of a job that COMPLETED, rank 0's result beside it as
        ``.value`` (``HALO_RESULT_FILE``: halo_sched/node/result.py; ``.value_note`` says why
        there is none); any other end raises
        (halo_sched/outcome.py): :class:`~halo_sched.errors.JobFailed` with the culprit,
        :class:`~halo_sched.errors.JobCancelled`, :class:`~halo_sched.errors.OutcomeUnknown`,
        or :class:`~halo_sched.errors.StillRunning` when ``timeout`` ran out first."""
        from ..outcome import result_of

        return result_of(self.id, self.wait(timeout), timeout)

    def exception(self, timeout: float | None = None) -> "HaloError | None":
        """What :meth:`result` would raise, returned instead of raised: None for a job that
        COMPLETED, else the error (``JobFailed`` with the culprit, ``JobCancelled``,
        ``StillRunning`` past ``timeout``, ``OutcomeUnknown``, ``UnknownJob``), as submitit's
        ``job.exception()``. Waits as :meth:`result` does (a run: its retries too)."""
        from ..errors import HaloError

        try:
            self.result(timeout)
        except HaloError as err:
            return err
        return None

    def describe(self) -> dict:
        """The job's record, as a value (``halo-sched export`` writes the same, the failure key
        left in the store): its backend and scheduler ids, the spec it was submitted with (its
        ``secret_env`` names only), the job file, its SHA-256 and git state, where its output
        went, the run it is an attempt of, its last known state and rank 0's result once kept.
        UnknownJob for a job without a record (one halo-sched did not submit)."""
        from .. import records
        from ..errors import UnknownJob

        rec = (records.find(self.id, self.scheduler.name) or [None])[0]
        if rec is None:
            raise UnknownJob([self.id], self.scheduler.name, "no job record")
        return records.public(rec)

    async def wait_async(self, timeout: float | None = None) -> JobState:
        """:meth:`wait` for asyncio, holding no thread while it waits (backends/watcher.py). The
        state, without rank 0's result (:meth:`result_async` reads it)."""
        from .watcher import wait_async

        return self._known(await wait_async(self.scheduler, self.id, timeout))

    async def result_async(self, timeout: float | None = None) -> JobState:
        """:meth:`result` for asyncio: an end's result is read in the loop's executor, one job's
        at a time per loop (many ended jobs hold one thread, not one each)."""
        import asyncio

        from ..outcome import attach_value, result_of

        state = await self.wait_async(timeout)
        if state.status.terminal:
            loop = asyncio.get_running_loop()
            lock = _VALUE_READS.get(loop)
            if lock is None:
                lock = _VALUE_READS[loop] = asyncio.Lock()
            async with lock:
                state = await loop.run_in_executor(None, attach_value, self.scheduler, self.id, state)
        return result_of(self.id, state, timeout)

    def cancel(self, wait: bool = True, timeout: float | None = 60.0, **opts) -> JobState | None:
        """Cancel the job; with ``wait``, return once the scheduler says it ended (its final
        state; :class:`~halo_sched.errors.StillRunning` if it has not within ``timeout``
        seconds). A job that had already ended is left as it is. ``opts``: the backend's
        (SLURM ``signal``, Nomad ``purge``)."""
        from ..known import cancel_known
        from ..errors import StillRunning, UnknownJob
        from .watcher import watcher_for

        _, unknown, _, _ = cancel_known({self.scheduler.name: [self.id]}, lambda _name: self.scheduler, **opts)
        if unknown:
            raise UnknownJob([self.id], self.scheduler.name, unknown[self.id])
        watcher_for(self.scheduler).forget(self.id)  # the next status() asks the scheduler
        if not wait or opts.get("signal"):  # a warning signal does not end the job
            return None
        state = self.wait(timeout)
        if not state.status.terminal:
            raise StillRunning(self.id, state, timeout)
        return state

    def logs(self, node: int | None = None, rank: int | None = None, follow: bool = False, *,
             since=None, grep: str | None = None, stream: str | None = None) -> Iterator["LogLine"]:
        """The job's output lines (with ``follow``, until it ends), filtered as ``halo-sched logs``
        filters them (halo_sched/logtags.py ``log_filter``, one filter for both): node ``node``'s
        and/or global rank ``rank``'s; ``grep``, those whose text the regular expression finds;
        ``since`` (an age such as ``"30m"``, an ISO date/time, a ``datetime``, a ``timedelta`` or
        epoch seconds), those written since; ``stream`` (``"stdout"``/``"stderr"``), one stream's.
        Each is a :class:`~halo_sched.logtags.LogLine`: a string exactly as the CLI prints it
        (``[node K rank R] text``), with ``.node``, ``.rank``, ``.text``, ``.time`` and
        ``.stream``. The id and every filter are checked before the first line (UnknownJob;
        UsageError, also for a filter the backend cannot answer: ``since`` where its output keeps
        no time per line, ``stream`` where it keeps one stream)."""
        from ..known import check_node_rank, unknown_asked
        from ..errors import UnknownJob, UsageError, shown
        from ..logtags import log_filter, parsed

        missing = unknown_asked(self.scheduler.name, self.scheduler, [self.id])
        if missing:
            raise UnknownJob([self.id], self.scheduler.name, missing[self.id])
        if since is not None:
            import time as clock

            from ..values import parse_since

            try:
                since = parse_since(since, clock.time())
            except ValueError as err:
                raise UsageError(f"since: {err}") from None
        keep = log_filter(node, rank, grep, since, stream, backend=self.scheduler.name,
                          fields=self.scheduler.log_fields, flag="")
        if node is not None or rank is not None:
            for name, value in (("node", node), ("rank", rank)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                    raise UsageError(f"{name} {shown(value)}: a number from 0")
            check_node_rank(self.scheduler.name, self.scheduler, self.id, node, rank, flag="")
        return parsed(self.scheduler.logs(self.id, follow=follow), keep=keep)


class EndWatch:
    """``finished()`` for :func:`tail_lines` when the job's end is a scheduler query (SLURM): the
    query runs in a background thread every ``poll`` seconds, so the file goes on being read and
    shown while the scheduler is slow or unreachable (the output file is on the shared
    filesystem, not behind the scheduler). An outage is waited through for its budget
    (halo_sched/outage.py, said once per interval); past it, ``finished()`` raises
    :class:`~halo_sched.errors.OutcomeUnknown`, as it raises any other error of the query.
    A job the scheduler no longer knows (UNKNOWN) ends the follow too: nothing later can say more."""

    def __init__(self, scheduler: str, job_id: str, query: Callable[[], JobState], poll: float = 2.0,
                 outage_s: float | None = None):
        from ..outage import Outage

        self.outage = Outage(scheduler, job_id, outage_s)
        self._query, self.poll = query, poll
        self._ended = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.last: JobState | None = None
        self._thread = threading.Thread(target=self._run, name=f"end-of-{job_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ..errors import HaloError, OutcomeUnknown
        from ..outage import ASK_LIMIT_S, RETRY_EVERY_S, is_outage
        from ..retry import within
        from ..jobstate import JobStatus

        while not self._stop.is_set():
            asked = time.monotonic()
            try:
                left = self.outage.left()
                with within(ASK_LIMIT_S if left is None else max(0.0, min(left, ASK_LIMIT_S))):
                    state = self._query()
            except HaloError as err:
                if not is_outage(err):
                    self._error = err
                    return
                try:
                    self.outage.failed(err, asked)
                except OutcomeUnknown as gave_up:
                    self._error = gave_up
                    return
                left = self.outage.left()
                self._stop.wait(RETRY_EVERY_S if left is None else max(0.0, min(RETRY_EVERY_S, left)))
                continue
            except Exception as err:  # noqa: BLE001 - a bug: the reader raises it
                self._error = err
                return
            self.outage.seen(state)
            self.last = state
            if state.status.terminal or state.status is JobStatus.UNKNOWN:
                self._ended.set()
                return
            self._stop.wait(self.poll)

    def __call__(self) -> bool:
        if self._error is not None:
            raise self._error
        return self._ended.is_set()

    def close(self) -> None:
        self._stop.set()


def missing_output(path, state: JobState | None) -> str:
    """Why a job's output file is not there, in words true to what its state says: removed after
    the job ended, not created yet while it waits to start, ..."""
    from ..jobstate import JobStatus

    status = state.status if state is not None else JobStatus.UNKNOWN
    if status is JobStatus.COMPLETED:
        return f"output file {path} is gone: the job COMPLETED, and the file was removed since"
    if status.terminal:
        return f"output file {path} is not there: the job ended ({status.value}) and it was removed, or never written"
    if status is JobStatus.PENDING:
        return f"output file {path} does not exist yet: the job is PENDING (not started)"
    if status is JobStatus.UNKNOWN:
        return f"output file {path} does not exist"
    return f"output file {path} does not exist although the job is {status.value}: it was removed, or not written yet"


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


__all__ = ["DryRun", "EndWatch", "Job", "JobState", "JobStatus", "NomadDetail", "Plans", "Scheduler", "SlurmDetail",
           "checked_spec", "tail_lines"]
