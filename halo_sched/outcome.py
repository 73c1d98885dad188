"""A job's end as a pipeline uses it: ``result()`` returns the final state of a job that
completed and raises for any other end (a task fails by raising, as in Prefect and Airflow; as
``submitit``'s ``job.result()``). (``wait_async()``, which waits without holding a thread per job,
is the shared watcher's: halo_sched/backends/watcher.py.)

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

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .errors import JobCancelled, JobFailed, OutcomeUnknown, StillRunning
from .node.failure_classes import UNKNOWN

if TYPE_CHECKING:  # pragma: no cover
    from .jobstate import JobState

#: The longest a line of a job's output is carried in a :class:`Culprit` (it reaches logs,
#: webhooks and pipeline UIs: everything a job produces is bounded).
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class Culprit:
    """Who failed first and why, from the failure report the job's nodes wrote (what
    ``status`` prints after ``FAILED:``). Every field is plain data (``to_dict`` is JSON)."""

    #: The global rank that failed first, its node rank and the host it ran on: the scheduler's
    #: name for it where known (SLURM's NodeName, Nomad's node: what the node ledger records and
    #: ``--exclude`` takes), else ``hostname``: the name torchrun's failure summary gives
    #: (``socket.getfqdn()`` on the node, so ``localhost`` where /etc/hosts lists the machine's
    #: name on the 127.0.0.1 localhost line), else the node's ``socket.gethostname()``.
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


#: What ``value_note`` says when rank 0 wrote no result (the common case: most jobs return none).
NO_RESULT = "rank 0 wrote no result"


def attach_value(sched, job_id: str, state: "JobState", keep: bool = False) -> "JobState":
    """``state`` with ``value`` and ``value_note`` filled in, for a job that ended (``sched``: its
    backend's Scheduler): rank 0's
    result (halo_sched/node/result.py) from the job's record when it was kept there for this
    end, else read now through the backend (``Scheduler.read_result``) and, with ``keep`` (an
    actor's or a read's keeping: core.keep_seen), kept in the record for later readers (``status``
    after the files are gone, ``export``). A job still running is returned as it is. The file
    is hostile: read bounded, parsed as strict JSON only; what is wrong with it is the note. A
    backend that cannot be asked now leaves the note saying so, and nothing is kept."""
    if not state.status.terminal or state.value_note is not None:
        return state
    import time

    from . import records
    from .errors import HaloError
    from .node.result import ResultError, parse

    rec = (records.find(job_id, sched.name, on_bad=None) or [None])[0]
    kept = rec.get("result") if isinstance(rec, dict) and isinstance(rec.get("result"), dict) else None
    if kept is not None and kept.get("for") == state.status.value and isinstance(kept.get("note"), str):
        state.value, state.value_note = kept.get("value"), kept["note"]
        return state
    value, note = None, ""
    try:
        data = sched.read_result(job_id, rec)
        if data is None:
            note = NO_RESULT
        else:
            value = parse(data)
    except ResultError as err:
        value, note = None, _bounded(err)
    except HaloError as err:  # not now: asked again by the next reader
        state.value, state.value_note = None, _bounded(f"not read: {err}")
        return state
    except OSError as err:  # the store or a file system: not now either
        state.value, state.value_note = None, _bounded(f"not read: {err.strerror or err}")
        return state
    state.value, state.value_note = value, note
    from .known import _MAY_RETURN  # a SLURM job may run again after these (requeue): its value is not its last

    if keep and rec is not None and state.status not in _MAY_RETURN.get(sched.name, set()):
        try:
            records.keep_result(job_id, sched.name, {"value": value, "note": note, "for": state.status.value,
                                                      "at": time.time()})
        except (OSError, HaloError):
            pass  # the store busy or broken: the value is still returned, and kept by a later reader
    return state


def result_of(job_id: str, state: "JobState", timeout: float | None = None) -> "JobState":
    """``state`` when the job COMPLETED; otherwise the error its end raises (the module's table)."""
    from .jobstate import JobStatus

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


__all__ = ["Culprit", "NO_RESULT", "attach_value", "culprit", "result_of"]
