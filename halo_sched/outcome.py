"""A job's end as a pipeline uses it: ``result()`` returns the final state of a job that
completed and raises for any other end (a task fails by raising, as in Prefect and Airflow; as
``submitit``'s ``job.result()``), and ``wait_async()`` waits without holding a thread per job.

Which end raises what, with the exit code ``submit --wait`` gives the same end:

============================================  ==================================  ====
the job ended                                 ``result()``                        exit
============================================  ==================================  ====
COMPLETED                                     returns the final :class:`JobState`  0
FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY,    :class:`~halo_sched.errors.JobFailed`  1
PREEMPTED                                     (``.report``: the :class:`Culprit`)
CANCELLED                                     :class:`~halo_sched.errors.JobCancelled` 1
not yet, when ``timeout`` ran out             :class:`~halo_sched.errors.StillRunning` 1
the scheduler no longer knows it, or stayed   :class:`~halo_sched.errors.OutcomeUnknown` 3
unreachable past the outage budget
============================================  ==================================  ====
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .errors import HaloError, JobCancelled, JobFailed, OutcomeUnknown, StillRunning
from .node.failure_classes import UNKNOWN

if TYPE_CHECKING:  # pragma: no cover
    from .backends.base import Scheduler
    from .backends.jobstate import JobState

#: The longest a line of a job's output is carried in a :class:`Culprit` (it reaches logs,
#: webhooks and pipeline UIs: everything a job produces is bounded).
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class Culprit:
    """Who failed first and why, from the failure report the job's nodes wrote (what
    ``status`` prints after ``FAILED:``). Every field is plain data (``to_dict`` is JSON)."""

    #: The global rank that failed first, its node rank and the host it ran on: the scheduler's
    #: name for it where known (SLURM's NodeName, Nomad's node: what the node ledger records and
    #: ``--exclude`` takes), else the machine's; ``hostname`` the machine's own (torchrun's).
    #: None/"" where the report does not say (a node lost before any rank wrote).
    rank: int | None
    node: int | None
    host: str
    hostname: str
    #: Whose fault (docs/failures.md, "Whose fault"): ``node``, ``job`` or ``unknown``, and why.
    fault: str
    reason: str
    #: The rank's error line (an exception's last line, an NCCL error), bounded.
    error: str
    exit_code: int | None
    signal: str | None

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = ", ".join(b for b in (f"rank {self.rank}" if self.rank is not None else "",
                                     f"node {self.node}" if self.node is not None else "",
                                     f"host {self.host}" if self.host else "") if b)
        return f"{where or 'unknown rank'}: {self.fault} fault" + (f" ({self.reason})" if self.reason else "") \
            + (f": {self.error}" if self.error else "")


def _bounded(text: object) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


def culprit(state: "JobState") -> Culprit | None:
    """The failure report of a job that failed, as a :class:`Culprit`; None for a job that did not fail."""
    cls = state.failure_class()
    first = state.failure.first if state.failure is not None else None
    if cls is None and first is None:
        return None
    hostname = getattr(first, "host", "") or ""
    host = getattr(first, "node_name", "") or hostname or (cls.host if cls is not None else "")
    return Culprit(rank=getattr(first, "rank", None), node=getattr(first, "node", None), host=_bounded(host),
                   hostname=_bounded(hostname), fault=cls.kind if cls is not None else UNKNOWN,
                   reason=_bounded(cls.reason if cls is not None else ""), error=_bounded(getattr(first, "error", "")),
                   exit_code=getattr(first, "exit_code", None) if first is not None else state.exit_code,
                   signal=getattr(first, "signal", None))


def result_of(job_id: str, state: "JobState", timeout: float | None = None) -> "JobState":
    """``state`` when the job COMPLETED; otherwise the error its end raises (the module's table)."""
    from .backends.jobstate import JobStatus

    if state.status is JobStatus.COMPLETED:
        return state
    if state.status is JobStatus.CANCELLED:
        raise JobCancelled(job_id, state)
    if state.status.terminal:
        raise JobFailed(job_id, state, culprit(state))
    if state.status is JobStatus.UNKNOWN:
        err = OutcomeUnknown(f"job {job_id}: the scheduler no longer knows it; its outcome is unknown"
                             + (f" ({_bounded(state.reason)})" if state.reason else ""))
        err.state = state
        raise err
    raise StillRunning(job_id, state, timeout)


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


async def wait_async(scheduler: "Scheduler", job_id: str, timeout: float | None = None,
                     outage_s: float | None = None) -> "JobState":
    """``Job.wait`` for asyncio: the job's state from the scheduler's shared watcher
    (backends/watcher.py: one query per poll for every handle, whichever thread or coroutine
    asks), awaited with ``asyncio.sleep`` between polls. A poll runs in the loop's default
    executor, one at a time per loop: 200 waiting coroutines hold no thread. Through a
    scheduler outage as :meth:`Scheduler.wait` (then OutcomeUnknown). What the backend's own
    wait does on a state (``Scheduler.acts_on``: SLURM ends a job that can never start) is done
    here too; a backend whose wait does more (``waits_in_thread``: Nomad's watchdog) has that
    wait run in the executor instead, a thread for as long as it waits."""
    from .backends.jobstate import JobStatus
    from .backends.watcher import watcher_for
    from .outage import RETRY_EVERY_S, Outage, is_outage

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


__all__ = ["Culprit", "culprit", "result_of", "wait_async"]
