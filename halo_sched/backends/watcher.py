"""Many handles, one poll: a watcher shared by every ``Job`` handle on one scheduler.

A pipeline holding 200 handles must not ask the scheduler 200 times per poll (each ``squeue`` or
``sacct`` loads slurmctld/slurmdbd; each Nomad list call loads the servers). A handle asks its
scheduler's watcher instead. The watcher keeps the ids of unfinished jobs, answers everyone from
one ``describe(ids)`` per poll (the backend turns that into one query, chunked), keeps finished
states (a finished job is never asked about again), and spaces its polls: the interval doubles
while nothing changes and drops back to the shortest once something does (submitit's
``SlurmInfoWatcher`` works the same way).

A running job is different: its end is what a waiter waits for, and SLURM has no cheap way to be
told (``scontrol wait_job`` waits for the *start*; ``sbatch --wait`` itself polls, 2 s growing to
32 s). So while any watched job runs, polls stay at most ``min_interval`` apart for its first
``hot_s`` seconds of running (most jobs a person waits on end or fail early) and at most
``running_max_interval`` apart after that: a bounded wait for the end, and one query every few
seconds per process, shared by all its handles, where pending jobs back off to ``max_interval``.

Threads share it: the first thread that needs a newer answer polls (outside the lock) and every
other thread waits for that poll's result instead of starting its own.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable, Hashable, Sequence

from ..errors import HaloError, OutcomeUnknown
from ..outage import ASK_LIMIT_S, RETRY_EVERY_S, Outage, clock_text, is_outage
from ..retry import within
from ..jobstate import JobState, JobStatus

_REGISTRY: dict[Hashable, "Watcher"] = {}
_REGISTRY_LOCK = threading.Lock()


def watcher_for(scheduler) -> "Watcher":
    """The one watcher of every scheduler object that talks to the same scheduler
    (``scheduler.watcher_key()``), created on first use."""
    key = scheduler.watcher_key()
    with _REGISTRY_LOCK:
        w = _REGISTRY.get(key)
        if w is None:
            w = _REGISTRY[key] = Watcher(scheduler.query)
        return w


def _finished(state: JobState) -> bool:
    return state.status.terminal


class Watcher:
    """One ``query`` per poll for every unfinished job any handle asked about."""

    def __init__(self, query: Callable[[Sequence[str]], dict[str, JobState]],
                 min_interval: float = 1.0, max_interval: float = 30.0,
                 running_max_interval: float = 3.0, hot_s: float = 60.0):
        self._query = query
        self.min_interval, self.max_interval = min_interval, max_interval
        self.running_max_interval, self.hot_s = running_max_interval, hot_s
        self._running_since: dict[str, float] = {}  # live ids seen RUNNING: since when (monotonic)
        self.interval = min_interval
        self._cond = threading.Condition()
        self._live: set[str] = set()          # ids asked about and not finished
        self._states: dict[str, JobState] = {}
        self._read_at: dict[str, float] = {}  # when each state was read (time.monotonic)
        self._polling = False
        self._last_poll = float("-inf")        # when the last poll started
        self.polls = 0                         # query calls made (for tests and the bench)

    # -- what handles call ---------------------------------------------------------------------

    def register(self, job_id: str) -> None:
        with self._cond:
            if job_id not in self._states or not _finished(self._states[job_id]):
                self._live.add(job_id)

    def state(self, job_id: str, max_age: float | None = None) -> JobState:
        """The job's state, read at most ``max_age`` seconds ago (default: the shortest poll
        interval): one poll for every live job when the cache is older, none once it finished."""
        max_age = self.min_interval if max_age is None else max_age
        self.register(job_id)
        return self._fresh(job_id, lambda: time.monotonic() - max_age)

    def next_state(self, job_id: str, after: float, deadline: float | None = None) -> JobState:
        """A state read after ``after`` (a ``time.monotonic()`` value) on the shared schedule: polls
        are spaced by the current interval, whoever asks. Returns the cached state early at
        ``deadline``."""
        self.register(job_id)
        return self._fresh(job_id, lambda: after, scheduled=True, deadline=deadline)

    def cached(self, job_id: str) -> tuple[JobState | None, float, bool]:
        """(the last state read, when it was read (``time.monotonic``), whether a poll is in
        flight), without polling or waiting: for a caller that schedules its own polls
        (the asyncio wait, :func:`wait_async`)."""
        with self._cond:
            return self._states.get(job_id), self._read_at.get(job_id, float("-inf")), self._polling

    # -- the poll ------------------------------------------------------------------------------

    def _fresh(self, job_id: str, newer_than: Callable[[], float], scheduled: bool = False,
               deadline: float | None = None) -> JobState:
        with self._cond:
            while True:
                st = self._states.get(job_id)
                if st is not None and (_finished(st) or self._read_at[job_id] > newer_than()):
                    return st
                now = time.monotonic()
                if deadline is not None and now >= deadline and st is not None:
                    return st
                # On the shared schedule; a job not asked about yet joins the next poll within the
                # shortest interval (handles created together share their first poll too).
                if not scheduled:
                    due = now
                else:
                    due = self._last_poll + (self.interval if st is not None else self.min_interval)
                if not self._polling and now >= due:
                    self._polling = True
                    ids = sorted(self._live)
                    break
                # Another thread polls now (its answer will do), or the next poll is not due.
                wake = None if self._polling else due - now
                if deadline is not None:
                    wake = max(0.0, deadline - now) if wake is None else max(0.0, min(wake, deadline - now))
                self._cond.wait(wake)
        started = time.monotonic()
        try:
            # One poll takes at most ASK_LIMIT_S (within any deadline of the asker): a stopped
            # controller is noticed in that time, not after every retry of every client command.
            with within(ASK_LIMIT_S):
                states = self._query(ids)
        except BaseException:
            with self._cond:
                self._polling = False
                self._cond.notify_all()
            raise
        for i in ids:  # a backend answers for every id; should one not, the job is unknown
            states.setdefault(i, JobState(i, JobStatus.UNKNOWN, reason="the scheduler did not answer for this id"))
        with self._cond:
            self.polls += 1
            self._last_poll = started
            changed = False
            for i, new in states.items():
                old = self._states.get(i)
                if old is None or old.change_key() != new.change_key():
                    changed = True
                self._states[i], self._read_at[i] = new, started
                if _finished(new):
                    self._live.discard(i)
                if new.status is JobStatus.RUNNING and i in self._live:
                    self._running_since.setdefault(i, started)
                else:
                    self._running_since.pop(i, None)
            self.interval = self.min_interval if changed else min(self.interval * 2, self.max_interval)
            self.interval = min(self.interval, self._running_cap(started))
            self._polling = False
            self._cond.notify_all()
        return self._fresh(job_id, newer_than, scheduled, deadline)

    def _running_cap(self, now: float) -> float:
        """The longest interval the running jobs allow (``max_interval`` when none runs)."""
        cap = self.max_interval
        for since in self._running_since.values():
            cap = min(cap, self.min_interval if now - since < self.hot_s else self.running_max_interval)
        return max(cap, self.min_interval)

    def forget(self, job_id: str) -> None:
        """Drop what is known of the job (after a cancel: the next answer must come from the scheduler)."""
        with self._cond:
            self._live.discard(job_id)
            self._running_since.pop(job_id, None)
            self._states.pop(job_id, None)
            self._read_at.pop(job_id, None)


def wait_shared(scheduler, job_id: str, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
                max_running_poll: float = 3.0,
                on_change: Callable[[JobState], None] | None = None,
                on_tick: Callable[[JobState], None] | None = None,
                outage_s: float | None = None,
                on_outage: Callable[[str], None] | None = None) -> JobState:
    """``Scheduler.wait`` on the shared watcher: every thread waiting on this scheduler's jobs is
    answered by the same polls. Through an outage of the scheduler: see :func:`wait_loop`."""
    w = watcher_for(scheduler)
    # The shortest interval and the lowest cap any waiter asked for win (for the watcher's life).
    with w._cond:
        w.min_interval, w.max_interval = min(w.min_interval, poll), min(w.max_interval, max_poll)
        w.running_max_interval = min(w.running_max_interval, max_running_poll)
        w.interval = max(w.min_interval, min(w.interval, w.max_interval))
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = [float("-inf")]
    outage = Outage(getattr(scheduler, "name", ""), job_id, outage_s, on_outage)

    def next_state(_left: float | None) -> JobState:
        state = w.next_state(job_id, seen[0], deadline)
        seen[0] = w._read_at.get(job_id, time.monotonic())
        return state

    return wait_loop(next_state, deadline, on_change, on_tick, outage=outage)


def _least(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def wait_loop(next_state: Callable[[float | None], JobState], deadline: float | None,
              on_change: Callable[[JobState], None] | None = None,
              on_tick: Callable[[JobState], None] | None = None,
              outage: Outage | None = None,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> JobState:
    """The one wait loop: ``next_state(seconds left)`` until the job ends or ``deadline`` (a
    ``clock()`` value) passes; ``on_change`` hears each state that differs by
    :meth:`JobState.change_key` from the one before, ``on_tick`` every state.

    Each ask is bounded by the time left (``halo_sched.retry.within``: retries inside a poll
    never carry the wait past ``deadline``), and with ``outage`` by the budget left (the
    watcher bounds each poll by ``ASK_LIMIT_S``). With ``outage``, an ask that fails because the
    scheduler cannot be reached (:func:`halo_sched.outage.is_outage`) is repeated every
    ``RETRY_EVERY_S`` seconds for ``outage``'s budget, which says so once per interval; then, or
    when ``deadline`` passes first, :class:`~halo_sched.errors.OutcomeUnknown` (exit 3) says what
    is known. Any other error ends the wait at once."""
    last = None
    while True:
        left = None if deadline is None else deadline - clock()
        asked = clock()
        try:
            with within(_least(left, outage.left() if outage is not None else None)):
                state = next_state(left)
        except HaloError as err:
            if outage is None or not is_outage(err):
                raise
            outage.failed(err, asked)  # OutcomeUnknown once the budget is spent
            left = None if deadline is None else deadline - clock()
            if left is not None and left <= 0:
                raise OutcomeUnknown(outage.gave_up_text(
                    f"{outage.who} unreachable at the end of --timeout (since "
                    f"{clock_text(outage.since_wall or 0)})")) from err
            sleep(max(0.0, _least(RETRY_EVERY_S, left, outage.left()) or 0.0))
            continue
        if outage is not None:
            outage.seen(state)
        if state.change_key() != last:
            last = state.change_key()
            if on_change:
                on_change(state)
        if on_tick:
            on_tick(state)
        # UNKNOWN ends the wait too: the scheduler no longer knows the job (purged, or a
        # cluster without accounting forgot it), so no later poll can say more.
        if state.status.terminal or state.status is JobStatus.UNKNOWN:
            return state
        if deadline is not None and clock() >= deadline:
            return state


# ---- waiting in asyncio ---------------------------------------------------------------------------

#: Per (event loop, watcher): the poll in flight, which every coroutine of that loop awaits
#: instead of starting its own (one executor thread per poll, never one per job).
_POLLS: dict[tuple[int, int], asyncio.Future] = {}


async def _poll(loop: asyncio.AbstractEventLoop, watcher, job_id: str) -> None:
    key = (id(loop), id(watcher))
    fut = _POLLS.get(key)
    if fut is None or fut.done():
        fut = _POLLS[key] = loop.run_in_executor(None, watcher.state, job_id, watcher.min_interval)
    try:
        await asyncio.shield(fut)
    finally:
        if fut.done() and _POLLS.get(key) is fut:
            del _POLLS[key]


async def wait_async(scheduler, job_id: str, timeout: float | None = None,
                     outage_s: float | None = None) -> JobState:
    """``Job.wait`` for asyncio: the job's state from the scheduler's shared watcher
    (backends/watcher.py: one query per poll for every handle, whichever thread or coroutine
    asks), awaited with ``asyncio.sleep`` between polls. A poll runs in the loop's default
    executor, one at a time per loop: 200 waiting coroutines hold no thread. Through a
    scheduler outage as :meth:`Scheduler.wait` (then OutcomeUnknown). What the backend's own
    wait does on a state (``Scheduler.acts_on``: SLURM ends a job that can never start) is done
    here too; a backend whose wait does more (``waits_in_thread``: Nomad's watchdog) has that
    wait run in the executor instead, a thread for as long as it waits."""
    loop = asyncio.get_running_loop()
    if getattr(scheduler, "waits_in_thread", False):  # its wait acts (Nomad's watchdog): run it as it is
        import functools

        return await loop.run_in_executor(None, functools.partial(scheduler.wait, job_id, timeout=timeout,
                                                                  outage_s=outage_s))
    w = watcher_for(scheduler)
    w.register(job_id)
    outage = Outage(getattr(scheduler, "name", ""), job_id, outage_s)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state, read_at, _ = w.cached(job_id)
        if state is not None and (state.status.terminal or state.status is JobStatus.UNKNOWN):
            return state
        now = time.monotonic()
        if deadline is not None and now >= deadline and state is not None:
            return state
        pause = w.interval - (now - read_at)  # until the next poll is due on the shared schedule
        if state is None or pause <= 0:
            asked = time.monotonic()
            try:
                await _poll(loop, w, job_id)
            except HaloError as err:
                if not is_outage(err):
                    raise
                outage.failed(err, asked)  # OutcomeUnknown once the budget is spent
                pause = RETRY_EVERY_S
            else:
                got, _, _ = w.cached(job_id)
                if got is not None:
                    outage.seen(got)
                    # What the backend's own wait does on this state (SLURM: end a job that can
                    # never start): a check, and rarely an action (a cancel) done right here.
                    acted = scheduler.acts_on(job_id, got) if not got.status.terminal else None
                    if acted is not None:
                        return acted
                continue
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - time.monotonic()))
        await asyncio.sleep(max(0.05, pause))


__all__ = ["Watcher", "wait_async", "wait_loop", "wait_shared", "watcher_for"]
