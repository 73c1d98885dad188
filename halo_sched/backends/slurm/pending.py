"""A job that waits: the words of its progress line while PENDING (why, for how long, what it
needs and what its partition has free, the jobs it depends on), and a job pending for a reason
that never clears (reasons.py), which is cancelled with what to change in the job file."""
from __future__ import annotations

import re
import time

from ...errors import HaloError
from ..base import JobState, JobStatus
from .checks import one_line, read_partitions


class NeverStarts(Exception):
    """Raised inside a wait by a job pending for a reason that never clears."""

    def __init__(self, state: JobState):
        super().__init__(state.reason)
        self.state = state


def end_impossible(sched, job_id: str, state: JobState) -> JobState:
    """Cancel a job that can never start (through ``sched``, the SlurmScheduler); its state,
    CANCELLED, saying why and what to change."""
    from dataclasses import replace

    from ..watcher import watcher_for
    from .reasons import explain
    from .transport.base import split_cluster

    try:
        job = sched.transport.job_info(job_id)
    except (HaloError, KeyError, TypeError):
        job = {}
    part, nodes = None, []
    try:
        got = read_partitions(sched.transport, split_cluster(job_id)[0])
    except HaloError:
        got = None
    if got is not None:
        parts, nodes = got
        part = next((p for p in parts if p.get("PartitionName") == job.get("Partition")), None)
    why = explain(state.reason, job, part, nodes)
    try:
        sched.cancel([job_id])
        done = "cancelled it"
    except HaloError as err:
        done = f"cancelling it failed ({one_line(err)}): halo-sched cancel {job_id}"
    watcher_for(sched).forget(job_id)
    return replace(state, status=JobStatus.CANCELLED, raw_state="CANCELLED", nodes_running=None,
                   verdict=f"can never start: {why}; {done}")


def pending_words(transport, state: JobState, cache: dict) -> str:
    """``PENDING for 1m05s: waiting for resources (nodes busy) (Resources): needs 1 node, 1 CPU;
    1 of 3 nodes idle, 0 CPUs free; expected start 12:51:03``. ``cache``: see ``resources``."""
    from .reasons import in_words, reason_word

    d = state.slurm
    head = "PENDING"
    waited = since(d.submitted if d is not None else None)
    if waited:
        head += f" for {waited}"
    words = in_words(state.reason) or "waiting to be scheduled"
    parts = [words]
    word = reason_word(state.reason)
    if word == "Dependency" and d is not None and d.dependency:
        parts.append(f"waits for {dependency_words(d.dependency)}")
    elif word == "Resources":
        need = resources(transport, state, cache)
        if need:
            parts.append(need)
    if d is not None and d.expected_start:
        parts.append(f"expected start {d.expected_start.replace('T', ' ')} (squeue --start)")
    if state.restarts:
        parts.append(f"run {state.restarts + 1}")
    return f"{head}: " + "; ".join(parts)


def resources(transport, state: JobState, cache: dict) -> str:
    """What a job pending for Resources needs, and what its partition has free (read once per
    job and reason, at most once a minute: ``cache`` keeps them, one per scheduler)."""
    from .reasons import leading_int

    key = (state.id, state.reason)
    hit = cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < 60:
        return hit[1]
    text = ""
    try:
        job = transport.job_info(state.id)
        got = read_partitions(transport, (state.slurm.cluster if state.slurm else None))
    except (HaloError, KeyError, TypeError):
        got = None
    if got is not None:
        want_nodes, want_cpus = leading_int(job.get("NumNodes")), leading_int(job.get("NumCPUs"))
        part = job.get("Partition")
        mine = [n for n in got[1] if part in (n.get("Partitions") or "").split(",")]
        idle = sum(1 for n in mine if (n.get("State") or "").upper().startswith("IDLE"))
        free = sum(max(0, (leading_int(n.get("CPUTot")) or 0) - (leading_int(n.get("CPUAlloc")) or 0)) for n in mine
                   if not re.match(r"(DOWN|DRAIN|FAIL|MAINT|RESERVED)", (n.get("State") or "").upper()))
        if want_nodes is not None:
            text = (f"needs {want_nodes} node{'s' if want_nodes != 1 else ''}"
                    + (f", {want_cpus} CPU{'s' if want_cpus != 1 else ''}" if want_cpus is not None else "")
                    + f"; partition {part} has {idle} of {len(mine)} nodes idle, {free} CPUs free")
    cache[key] = (time.monotonic(), text)
    return text


def since(stamp: str | None) -> str:
    """How long ago a SLURM time (``2026-12-01T12:25:13``, the controller's local time) was:
    ``1m05s``; empty when unknown."""
    import datetime as dt

    if not stamp:
        return ""
    try:
        then = dt.datetime.fromisoformat(stamp)
    except ValueError:
        return ""
    secs = int((dt.datetime.now() - then).total_seconds())
    if secs < 0:
        return ""
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m"


def dependency_words(dep: str) -> str:
    """``afterany:620(unfulfilled),afterok:7(failed)`` -> ``job 620 to end (afterany, unfulfilled),
    job 7 to complete (afterok, failed)``."""
    kinds = {"after": "to start", "afterany": "to end", "afterok": "to complete", "afternotok": "to fail",
             "aftercorr": "to end (same task)", "afterburstbuffer": "to end", "singleton": ""}
    out = []
    for m in re.finditer(r"(\w+):([\d_+:]+?)(?:\+\d+)?(?:\((\w+)\))?(?=,|\?|$)", dep):
        kind, ids, how = m.group(1), m.group(2), m.group(3)
        for job in ids.split(":"):
            out.append(f"job {job} {kinds.get(kind, '')}".rstrip() + f" ({kind}{', ' + how if how else ''})")
    if dep.startswith("singleton"):
        out.append("the other jobs of its name and user to end (singleton)")
    return ", ".join(out) or dep
