"""Errors a user can act on. The CLI maps each to an exit code and a message, never a traceback.

The exit codes themselves are listed once, in ``halo_sched/cli.py``'s docstring (and docs/cli.md's
"Exit codes" section): 0 success, 1 a job or the scheduler failed, 2 bad input, 3 outcome unknown,
130 interrupted.
"""
from __future__ import annotations

import os

#: Exit codes (the table in halo_sched/cli.py's docstring).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_OUTCOME_UNKNOWN = 3
EXIT_INTERRUPTED = 130

#: Set by ``halo-sched --debug`` (or ``HALO_SCHED_DEBUG=1``): errors and retry lines then carry
#: the underlying exception, and an internal error its traceback.
_debug = False


def set_debug(on: bool = True) -> None:
    global _debug
    _debug = bool(on)


def debug() -> bool:
    return _debug or bool(os.environ.get("HALO_SCHED_DEBUG"))


def shown(text: object, limit: int = 60) -> str:
    """``repr`` of a user-given value, cut to ``limit`` characters for a one-line message."""
    r = repr(text)
    return r if len(r) <= limit else r[:limit - 4] + "...'"


class HaloError(Exception):
    """Base class: anything halo-sched reports to a user."""

    exit_code = EXIT_FAILED

    @property
    def short(self) -> str:
        """The condition alone, without advice, for a one-line note (``list``): the whole message
        unless a subclass knows a shorter one."""
        return str(self)


def cause_chain(err: BaseException) -> str:
    """The exceptions behind ``err`` (its ``__cause__``/``__context__`` chain), for ``--debug``;
    empty when there are none."""
    out, seen, e = [], set(), err.__cause__ or err.__context__
    while e is not None and id(e) not in seen and len(out) < 6:
        seen.add(id(e))
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "; caused by ".join(out)


class SpecError(HaloError):
    """The job file (or options) are invalid. Each problem names its field."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f"{source}: " if source else ""
        lines = [f"{where}invalid job spec ({len(problems)} problem{'s' if len(problems) != 1 else ''}):"]
        lines += [f"  {field or '<root>'}: {msg}" for field, msg in problems]
        super().__init__("\n".join(lines))


class UsageError(HaloError):
    """A bad command-line option or a backend that cannot do what was asked."""

    exit_code = EXIT_BAD_INPUT


class UnknownJob(UsageError):
    """A job id that neither a job record nor the scheduler knows (bad input: exit 2)."""

    def __init__(self, ids: list[str], backend: str | None = None, reason: str = "", others_done: str = ""):
        self.ids = list(ids)
        where = f" on {backend}" if backend else ""
        names = ", ".join(shown(i) for i in self.ids[:5]) + (f" and {len(self.ids) - 5} more" if len(self.ids) > 5 else "")
        why = " ".join(reason.split())
        why = why if len(why) <= 160 else why[:157] + "..."
        super().__init__(f"no job {names}{where}: no job record, and "
                         + (why or f"the scheduler does not know {'it' if len(self.ids) == 1 else 'them'}")
                         + others_done)


class SchedulerError(HaloError):
    """The scheduler refused or failed a request (sbatch error, Nomad 4xx, ...)."""

    exit_code = EXIT_FAILED


class OutcomeUnknown(SchedulerError):
    """A request may or may not have taken effect (sent, then the scheduler stayed unreachable),
    or a job ended out of sight: nobody can tell the outcome yet (exit 3)."""

    exit_code = EXIT_OUTCOME_UNKNOWN


class MissingDependency(HaloError):
    """An optional transport's library is not installed or built for another version."""

    exit_code = EXIT_BAD_INPUT


# ---- a job's outcome, raised by the library's ``result()`` (halo_sched/outcome.py) --------------


class JobFailed(HaloError):
    """The job ended without completing (FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY, PREEMPTED):
    ``state`` is its final :class:`~halo_sched.JobState`, ``report`` who failed first (a
    :class:`~halo_sched.outcome.Culprit`: rank, node, host, whose fault, the error line), as
    ``submit --wait`` exits 1 and prints it."""

    exit_code = EXIT_FAILED

    def __init__(self, job_id: str, state, report=None):
        self.job_id, self.state, self.report = job_id, state, report
        super().__init__(f"job {job_id} {state.describe()}")


class JobCancelled(HaloError):
    """The job was cancelled (by a user, or by halo-sched itself: a placement timeout, a hang);
    ``state`` is its final state. Exit 1, as ``submit --wait``'s."""

    exit_code = EXIT_FAILED

    def __init__(self, job_id: str, state):
        self.job_id, self.state = job_id, state
        super().__init__(f"job {job_id} {state.describe()}")


class StillRunning(HaloError, TimeoutError):
    """``result(timeout=...)`` ran out before the job ended; the job goes on. Exit 1, as
    ``submit --wait --timeout``'s. Also a :class:`TimeoutError`."""

    exit_code = EXIT_FAILED

    def __init__(self, job_id: str, state, timeout: float | None, others: int = 0):
        self.job_id, self.state = job_id, state
        after = f" after {timeout:g} s" if timeout is not None else ""
        # halo_sched.as_completed: the first job still running, and how many more are.
        more = f", as are {others} more" if others else ""
        super().__init__(f"job {job_id} still {state.status.value}{after}{more}; "
                         f"{'they keep' if others else 'it keeps'} running")
