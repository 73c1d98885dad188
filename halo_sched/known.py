"""What a job id is known by, for the commands (through halo_sched/core.py) and the job
handles (halo_sched/backends/base.py ``Job``) alike: which ids nobody knows (an UNKNOWN from the
scheduler and no job record), cancelling the known ones, and a job's size for ``--node``/``--rank``.
It imports no backend, not even for a type (the handles' module imports it): what it asks of
one is :class:`Asked`, which every ``Scheduler`` is.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

from . import records
from .jobstate import JobState, JobStatus
from .errors import HaloError, UsageError, shown


class Asked(Protocol):
    """What this module asks of a backend: its states and a cancel (``Scheduler.query`` and
    ``Scheduler.cancel``, halo_sched/backends/base.py)."""

    def query(self, ids: Sequence[str]) -> dict[str, JobState]: ...

    def cancel(self, ids: Sequence[str], **opts) -> dict[str, str] | None: ...


# ---- ids nobody knows ---------------------------------------------------------------------------


def unknown(backend: str, states: dict[str, JobState], ids: Iterable[str]) -> list[str]:
    """The ids nobody knows: the scheduler answered UNKNOWN and no record (usable or not) names
    them. A local job whose state file cannot be read is known (``unreadable``)."""
    return [i for i in dict.fromkeys(ids) if i in states and states[i].status is JobStatus.UNKNOWN
            and not states[i].unreadable and not records.exists(i, backend)]


def unknown_asked(backend: str, sched: Asked, ids: Iterable[str]) -> dict[str, str]:
    """The ids nobody knows (with the scheduler's word on each), for a command about to act on
    them. Ids with a record are known without asking; the others cost one query. When the
    scheduler cannot answer, none is called unknown: the command goes on (it has its own way
    through an outage)."""
    ask = [i for i in dict.fromkeys(ids) if not records.exists(i, backend)]
    if not ask:
        return {}
    from .outage import ASK_BOUND_S
    from .retry import within

    try:
        with within(ASK_BOUND_S):  # an unreachable scheduler must not hold the command here
            states = sched.query(ask)
    except HaloError:
        return {}
    return {i: states[i].reason for i in unknown(backend, states, ask)}


def cancel_known(groups: dict[str, list[str]], scheduler: Callable[[str], Asked],
                 **opts) -> tuple[list[str], dict[str, str], set[str], dict[str, str]]:
    """Cancel every id of ``groups`` (backend -> ids) that somebody knows and that has not ended:
    (the ids cancelled, the unknown ones with the scheduler's word on each, the backends those
    were asked of, the ids that had already ended with their state in words). A job whose record
    says it ended is not asked about (nor waited for through an outage); one the scheduler
    finds ended is left as it is. ``purge`` (Nomad) acts on ended jobs too."""
    unknown_ids: dict[str, str] = {}
    where: set[str] = set()
    done: list[str] = []
    ended: dict[str, str] = {}
    for backend, ids in groups.items():
        if not opts.get("purge"):
            for job_id in ids:
                words = ended_by_record(backend, job_id)
                if words is not None:
                    ended[job_id] = words
            ids = [i for i in ids if i not in ended]
        if not ids:
            continue
        sched = scheduler(backend)
        missing = unknown_asked(backend, sched, ids)
        unknown_ids.update(missing)
        where |= {backend} if missing else set()
        ids = [i for i in ids if i not in missing]
        if ids:
            found = sched.cancel(ids, **opts) or {}
            ended.update(found)
            done += [i for i in ids if i not in found]
    return done, unknown_ids, where, ended


#: SLURM may requeue a job that ended so (``--requeue``, the default for batch jobs where
#: JobRequeue=1): its record's word on them is not final.
_MAY_RETURN = {"slurm": {JobStatus.NODE_FAIL, JobStatus.PREEMPTED}}


def ended_by_record(backend: str, job_id: str) -> str | None:
    """The job's last known state in words when its record says it ended for good, else None."""
    for rec in records.find(job_id, backend):
        last = rec.get("last_state") or {}
        try:
            status = JobStatus(last.get("status"))
        except ValueError:
            return None
        if status.terminal and status not in _MAY_RETURN.get(backend, set()):
            return last.get("describe") or status.value
        return None
    return None


# ---- what a job's record says -------------------------------------------------------------------


def job_size(backend: str, sched: Asked, job_id: str) -> tuple[int | None, int | None]:
    """(nodes, processes per node) of a job: its record's, else the scheduler's node count."""
    rec = (records.find(job_id, backend) or [{}])[0]
    nodes, per_node = rec.get("nodes"), rec.get("nproc_per_node")
    if nodes is None:
        try:
            nodes = sched.query([job_id])[job_id].nodes_total
        except HaloError:
            nodes = None
    return nodes, per_node


def check_node_rank(backend: str, sched: Asked, job_id: str, node: int | None, rank: int | None,
                    flag: str = "--") -> None:
    """``node`` and ``rank`` inside the job (its record's size, else the scheduler's node count),
    for ``logs --node/--rank`` and the library's ``logs(node=, rank=)`` (``flag``: the prefix
    their names carry in the error)."""
    nodes, per_node = job_size(backend, sched, job_id)
    if node is not None and nodes and node >= nodes:
        raise UsageError(f"{flag}node {node}: job {shown(job_id)} has {nodes} node{'s' if nodes != 1 else ''} "
                         f"(0..{nodes - 1})")
    world = nodes * per_node if nodes and per_node else None
    if rank is not None and world and rank >= world:
        raise UsageError(f"{flag}rank {rank}: job {shown(job_id)} has {world} rank{'s' if world != 1 else ''} "
                         f"(0..{world - 1})")


__all__ = ["cancel_known", "check_node_rank", "ended_by_record", "job_size", "unknown", "unknown_asked"]
