"""One retry policy for every scheduler call.

Each call to a scheduler (a SLURM client command, a slurmrestd or Nomad HTTP request) makes one
attempt and says how it failed with the error it raises:

* :class:`Transient`: a failure that can heal by itself (a busy or restarting controller, a refused
  connection, an HTTP 5xx) on a call that is safe to repeat: the policy tries again;
* :class:`Ambiguous`: the request may have taken effect (sent, then no answer). Only the
  exactly-once rule of :mod:`halo_sched.exactly_once` handles it: it looks the submission up by its
  token before anything is resent. A plain :class:`RetryPolicy` never retries it;
* anything else is the scheduler's real answer (a bad partition, HTTP 4xx, a bad certificate) and
  goes to the caller at once.

A :class:`RetryPolicy` says how often and how long: at most ``attempts`` tries, never starting one
after ``budget_s`` seconds, pausing ``first_wait_s`` then twice as long each time up to
``max_wait_s`` (a pause never runs past the budget). The policies in use, per backend:

* :data:`SLURM_CALLS`: SLURM calls safe to repeat (squeue, scontrol, scancel, ``sbatch
  --test-only``; every slurmrestd request but the submit), when the controller is busy or
  restarting: 3 attempts, 0.5 s doubling to at most 10 s (``CliTransport(retries=, retry_wait=)``,
  ``RestTransport(retries=)``). A plain sbatch or slurmrestd submit, and sacct: 1 attempt;
* :data:`NOMAD_CALLS`: idempotent Nomad requests: 4 attempts within 15 s, 0.25 s doubling to at
  most 2 s (``NomadConfig.retry_*``);
* :func:`submission`: submit and cancel on either scheduler, through an outage: no attempt limit,
  ``HALO_SUBMIT_RETRY_S`` seconds (default 120), 0.5 s doubling to at most 8 s.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, TypeVar

from .errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from tenacity import RetryCallState

T = TypeVar("T")

RETRY_ENV = "HALO_SUBMIT_RETRY_S"

#: The end (``time.monotonic()``) of what the current call may take, set by :func:`within`:
#: every policy stops retrying there and a SLURM client command is cut there (a wait's
#: ``--timeout``, ``status``'s bound), so no caller waits out retries it has no time for.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("halo_call_deadline", default=None)


@contextlib.contextmanager
def within(seconds: float | None):
    """Scheduler calls inside take at most ``seconds`` more (None: no bound added); an outer
    bound that ends earlier still holds."""
    if seconds is None:
        yield
        return
    end = time.monotonic() + max(0.0, seconds)
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def time_left() -> float | None:
    """Seconds left under the innermost :func:`within` (None: unbounded)."""
    end = _DEADLINE.get()
    return None if end is None else end - time.monotonic()
DEFAULT_RETRY_S = 120.0


class Transient(Exception):
    """The call failed in a way that can heal by itself, and trying again is safe (the call is
    idempotent, or the request certainly did not take effect)."""


class Ambiguous(Exception):
    """The request may have taken effect (sent, then no answer): look before resending."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a call that fails with :class:`Transient` is repeated (see the module's docstring).

    ``attempts`` None: no limit but the budget; ``budget_s`` None: no limit but the attempts.
    """

    attempts: int | None = 3
    budget_s: float | None = None
    first_wait_s: float = 0.5
    max_wait_s: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts is None and self.budget_s is None:
            raise ValueError("a retry policy needs an attempt limit or a time budget")

    def with_(self, **changes) -> "RetryPolicy":
        """A copy with some fields changed (``attempts`` below 1 counts as 1)."""
        if changes.get("attempts") is not None:
            changes["attempts"] = max(1, int(changes["attempts"]))
        return replace(self, **changes)

    def call(
        self,
        attempt: Callable[[], T],
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        before_retry: Callable[[BaseException, int, float, float | None], None] | None = None,
        give_up: Callable[[Transient, int], BaseException] | None = None,
    ) -> T:
        """``attempt()`` until it returns, raises something other than :class:`Transient`, or the
        policy is spent. ``before_retry(error, attempts so far, pause, seconds left or None)`` runs
        before each pause. When the policy is spent, the last Transient is raised, or
        ``give_up(last, attempts)`` (raised from it) when given."""
        start = clock()
        tries = 0

        # tenacity only when a call is made: the waiting code imports this module, and render never calls.
        from tenacity import Retrying, retry_if_exception_type, wait_exponential

        def one() -> T:
            nonlocal tries
            tries += 1
            return attempt()

        def left() -> float | None:
            own = None if self.budget_s is None else self.budget_s - (clock() - start)
            bound = time_left()  # the caller's deadline (within()), on the real clock
            return own if bound is None else (bound if own is None else min(own, bound))

        def stop(state: RetryCallState) -> bool:
            remaining = left()
            return ((self.attempts is not None and state.attempt_number >= self.attempts)
                    or (remaining is not None and remaining <= 0))

        backoff = wait_exponential(multiplier=self.first_wait_s, max=self.max_wait_s)

        def wait(state: RetryCallState) -> float:
            pause = backoff(state)
            remaining = left()
            return pause if remaining is None else max(0.0, min(pause, remaining))

        def announce(state: RetryCallState) -> None:
            if before_retry is not None and state.outcome is not None and state.next_action is not None:
                before_retry(state.outcome.exception(), tries, state.next_action.sleep, left())

        try:
            return Retrying(stop=stop, wait=wait, retry=retry_if_exception_type(Transient), sleep=sleep,
                            before_sleep=announce, reraise=True)(one)
        except Transient as last:
            if give_up is None:
                raise
            raise give_up(last, tries) from last


#: Idempotent SLURM calls (client commands and slurmrestd requests).
SLURM_CALLS = RetryPolicy(attempts=3, first_wait_s=0.5, max_wait_s=10.0)
#: Idempotent Nomad requests (the defaults of ``NomadConfig.retry_*``).
NOMAD_CALLS = RetryPolicy(attempts=4, budget_s=15.0, first_wait_s=0.25, max_wait_s=2.0)


def submission(retry_s: float | None = None) -> RetryPolicy:
    """Submit and cancel through an outage (:mod:`halo_sched.exactly_once`): for
    :func:`retry_window` seconds, however many attempts that takes."""
    return RetryPolicy(attempts=None, budget_s=retry_window(retry_s), first_wait_s=0.5, max_wait_s=8.0)


def retry_window(value: float | None = None) -> float:
    """Seconds to keep retrying a submission: ``value``, else ``$HALO_SUBMIT_RETRY_S``, else 120."""
    return seconds_setting(value, "retry_s", RETRY_ENV, DEFAULT_RETRY_S, 86400)


def seconds_setting(value: float | None, name: str, env: str, default: float, most: float) -> float:
    """A duration setting: ``value`` (the argument ``name``), else the environment variable
    ``env``, else ``default``; 0..``most`` seconds, else a UsageError naming where it came from."""
    where = name
    if value is None:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{env}={raw!r} is not a number of seconds") from None
        where = env
    if not (0 <= value <= most) or value != value:
        raise UsageError(f"{where}={value!r}: use 0..{most:g} seconds")
    return float(value)
