"""Waiting through a scheduler outage.

The commands people leave running (``submit --wait``, ``watch``, ``logs --follow``) and
``Job.wait()`` keep waiting while the scheduler cannot be reached, for a budget: a controller
failover or restart must not turn a healthy job into a failed one. While it lasts they say so,
once per interval (``NOTE_EVERY_S``), not once per poll; when it runs out they end with
:class:`~halo_sched.errors.OutcomeUnknown` (exit 3: nobody can tell the job's outcome), saying
what is known: the last state seen and since when the scheduler is unreachable.

The budget: ``HALO_OUTAGE_S`` seconds (the commands' ``--outage-budget``, the library's
``outage_s``), default 600. Why 10 minutes: a SLURM backup controller takes over only after
``SlurmctldTimeout`` (120 s by default) and then reloads the saved state; a restarted slurmctld
(an upgrade, a crash under systemd's restart) reloads the same state; a Nomad server cluster elects
a leader in seconds but a restarted server replays its Raft log and snapshot, minutes on a big
cluster. Ten minutes covers each with room to spare, and still ends an unattended pipeline the
same hour, with exit 3 rather than a wrong verdict.

Which failures are an outage (:func:`is_outage`): a scheduler call that failed in a way that can
heal by itself and was retried until its policy was spent (SLURM: "Unable to contact slurm
controller", a timed-out client command; Nomad: no connection, no answer, HTTP 5xx such as "No
cluster leader"). A scheduler's real answer (a bad id, HTTP 4xx, a bad certificate) is not one.
"""
from __future__ import annotations

import time
from typing import Callable

from .errors import HaloError, OutcomeUnknown, SchedulerError

OUTAGE_ENV = "HALO_OUTAGE_S"
DEFAULT_OUTAGE_S = 600.0
#: One line about an outage per this many seconds (the first at once).
NOTE_EVERY_S = 60.0
#: While the scheduler is unreachable, ask again this often (each ask may itself take a while).
RETRY_EVERY_S = 5.0
#: One ask of a wait (its retries included) takes at most this long: a SLURM client command
#: against a stopped slurmctld fails only after MessageTimeout (10 s by default) and more, three
#: attempts of it near a minute; the outage is said within this bound instead.
ASK_LIMIT_S = 30.0

_NAMES = {"slurm": "SLURM", "nomad": "Nomad", "local": "the local backend"}

_sink: Callable[[str], None] | None = None


def set_note_sink(sink: Callable[[str], None] | None) -> None:
    """Where outage lines go when a wait names no ``on_outage`` (the CLI: one stderr line
    each); None: the ``halo_sched`` logger, at WARNING."""
    global _sink
    _sink = sink


def _default_note(line: str) -> None:
    if _sink is not None:
        _sink(line)
    else:  # the library's callers: the halo_sched logger (imported here: the CLI never needs it)
        import logging

        logging.getLogger("halo_sched").warning("%s", line)


def display_name(scheduler: str) -> str:
    return _NAMES.get(scheduler, scheduler or "the scheduler")


_budget: float | None = None

#: How long ``status`` (and the check that a job id is known) asks before it shows the job
#: record's last known state instead: SLURM's own clients give an unreachable controller
#: MessageTimeout (10 s by default) before they fail, and a healthy one answers in well under 1 s.
ASK_BOUND_S = 10.0


def set_default_budget(value: float | None) -> None:
    """The budget of every wait in this process that names none (the CLI's --outage-budget);
    None: ``$HALO_OUTAGE_S``, else 600."""
    global _budget
    _budget = None if value is None else outage_budget(value)


def outage_budget(value: float | None = None) -> float:
    """Seconds to wait through an outage: ``value``, else the CLI's ``--outage-budget``, else
    ``$HALO_OUTAGE_S``, else 600."""
    from .retry import seconds_setting  # not at import: retry loads tenacity, which render never needs

    if value is None and _budget is not None:
        return _budget
    return seconds_setting(value, "outage_s", OUTAGE_ENV, DEFAULT_OUTAGE_S, 7 * 86400)


def is_outage(err: BaseException) -> bool:
    """Whether ``err`` says the scheduler could not be reached (or answered 5xx), as opposed to
    a real answer. Failures that may heal by themselves were retried as ``Transient`` and the
    error that ends them is raised from it (SLURM), or from the connection error / 5xx (Nomad)."""
    from .retry import Transient

    if not isinstance(err, SchedulerError) or isinstance(err, OutcomeUnknown):
        return False
    cause = err.__cause__
    if isinstance(cause, Transient):
        return True
    status = getattr(err, "status", False)
    if status is False:  # not an HTTP scheduler's error
        return False
    if status is not None:
        return status >= 500
    try:
        import requests
    except ImportError:  # pragma: no cover - the Nomad backend needs it
        return False
    return (isinstance(cause, (requests.ConnectionError, requests.Timeout))
            and not isinstance(cause, requests.exceptions.SSLError))


def clock_text(wall: float) -> str:
    """A wall-clock time for a message: ``12:40:05 UTC`` (the local zone's name)."""
    return time.strftime("%H:%M:%S %Z", time.localtime(wall))


def span(seconds: float) -> str:
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"


class Outage:
    """One wait's view of the scheduler being unreachable.

    ``failed(err, last)`` after each failed ask: the first failure and then one per
    ``note_every_s`` are told to ``on_note``; once ``budget_s`` has passed since the first,
    :class:`OutcomeUnknown` is raised. ``ok()`` after an answer: the outage (if any) is over
    and ``on_note`` hears how long it lasted. ``last``: the last state seen, for the words.
    ``clock``: monotonic seconds; ``wall``: epoch seconds (both injectable for tests)."""

    def __init__(self, scheduler: str, job_id: str, budget_s: float | None = None,
                 on_note: Callable[[str], None] | None = None, note_every_s: float = NOTE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.who = display_name(scheduler)
        self.job_id = job_id
        self.budget_s = outage_budget(budget_s)
        self.on_note = on_note if on_note is not None else _default_note
        self.note_every_s = note_every_s
        self.clock, self.wall = clock, wall
        self.since: float | None = None       # monotonic time of the first failure
        self.since_wall: float | None = None
        self._noted: float | None = None
        self.last_error: HaloError | None = None
        self.last_state = None                 # the last JobState seen
        self.last_seen_wall: float | None = None
        self.notes = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def seen(self, state) -> None:
        """A state the scheduler gave: it answers again (``ok``), and this is the last known."""
        self.ok()
        self.last_state, self.last_seen_wall = state, self.wall()

    def ok(self) -> None:
        if self.since is not None:
            self._note(f"{self.job_id}: {self.who} answers again (unreachable for "
                       f"{span(self.clock() - self.since)}); waiting on")
        self.since = self.since_wall = self._noted = None
        self.last_error = None

    def left(self) -> float | None:
        """Seconds of the budget left (None while the scheduler answers)."""
        return None if self.since is None else self.budget_s - (self.clock() - self.since)

    def failed(self, err: HaloError, asked: float | None = None) -> None:
        """The scheduler could not be reached (by the ask that started at ``asked``, a
        ``clock()`` value: the outage is counted from there): note it (once per interval), or
        end the wait with OutcomeUnknown once the budget is spent."""
        now = self.clock()
        self.last_error = err
        if self.since is None:
            start = now if asked is None else min(asked, now)
            self.since, self.since_wall = start, self.wall() - (now - start)
        if now - self.since >= self.budget_s:
            raise OutcomeUnknown(self.gave_up_text()) from err
        if self._noted is None or now - self._noted >= self.note_every_s:
            self._noted = now
            self._note(f"{self.job_id}: {self.who} unreachable since {clock_text(self.since_wall)} "
                       f"({span(now - self.since)}); waiting up to {span(self.budget_s)} "
                       f"({OUTAGE_ENV}){self._last_text('; ')}")

    def gave_up_text(self, why: str | None = None) -> str:
        since = clock_text(self.since_wall) if self.since_wall is not None else "?"
        why = why or (f"{self.who} unreachable since {since}, past the outage budget of "
                      f"{span(self.budget_s)} ({OUTAGE_ENV})")
        return (f"{self.job_id}: outcome unknown: {why}{self._last_text('; ')}; the job may still run: "
                f"ask again with `halo-sched status {self.job_id}` once {self.who} answers")

    def _last_text(self, lead: str) -> str:
        if self.last_state is None:
            return f"{lead}no state seen yet"
        return (f"{lead}last known {self.last_state.describe()} at "
                f"{clock_text(self.last_seen_wall or self.wall())}")

    def _note(self, text: str) -> None:
        self.notes += 1
        self.on_note(text)


__all__ = ["DEFAULT_OUTAGE_S", "NOTE_EVERY_S", "OUTAGE_ENV", "Outage", "display_name", "is_outage",
           "ASK_LIMIT_S", "outage_budget", "set_default_budget", "set_note_sink", "ASK_BOUND_S"]
