"""Turn what Nomad says about a halo-sched job into a :class:`JobState`, and watch its placement.

A halo-sched Nomad job has one task group per node (``node-0`` .. ``node-{N-1}``, Count 1, no
restarts, no rescheduling). Nomad has no gang scheduling: each group places on its own, so a job
can be half-placed, holding GPUs on some nodes while the rest wait for capacity. The state here is
therefore computed per group from that group's latest allocation and then folded into one answer:

* PENDING   no group has a running allocation yet (reason says why: blocked placement, starting)
* PARTIAL   k of N groups running (0 < k < N); ``nodes_running``/``nodes_total`` say how many
* RUNNING   every group has started (running, or already finished successfully)
* COMPLETED every group finished with exit 0
* FAILED    a group's task failed (non-zero exit, driver failure); the exit code is kept. This is
            reported as soon as one group fails, even while others still run, because a torchrun
            world with a dead rank never recovers (``extra["still_running"]`` counts the others)
* TIMEOUT   a group hit ``max_run_duration``. Nomad marks such an allocation *complete*, not
            failed (see :func:`hit_max_run_duration`), so without this check it would read as
            success. TIMEOUT wins over FAILED: the other ranks usually crash *because* one was
            killed
* CANCELLED the job was stopped (``Job.Stop``), unless a group had already failed before the stop
            (then FAILED) or timed out (TIMEOUT)
* NODE_FAIL / PREEMPTED  a group's allocation was lost with its node / evicted for another job
* UNKNOWN   Nomad does not know the job: never registered here (wrong namespace/region?), purged,
            or garbage-collected. A pure function cannot tell a purge by us from the rest; callers
            that purged a job themselves may report CANCELLED instead.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from halo_sched.backends.base import JobState, JobStatus
from halo_sched.errors import SchedulerError

NODES_META_KEY = "halo_sched_nodes"

# The text Nomad (2.0.2+) puts on an allocation killed by ``max_run_duration``: the client sets it
# as ClientDescription (ClientStatus "complete"); the server-side watcher variant sets it as
# DesiredDescription (ClientStatus "failed"). Task events may carry it as DisplayMessage of the
# "Killing" event. Matching is case-insensitive on both spellings, on all of those fields.
MAX_RUN_DURATION_MARKERS = ("max_run_duration", "max run duration")
_EVENT_TEXT_FIELDS = ("DisplayMessage", "KillReason", "Message", "KillError", "DriverError", "GenericSource")

_TERMINAL_CLIENT = {"complete", "failed", "lost"}


# --------------------------------------------------------------------------- small helpers


def _natural_key(name: str) -> tuple:
    """Sort ``node-2`` before ``node-10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _alloc_order(alloc: dict) -> tuple:
    return (alloc.get("CreateIndex") or 0, alloc.get("CreateTime") or 0, alloc.get("ModifyIndex") or 0)


def latest_allocations(allocs: Iterable[dict]) -> dict[str, dict]:
    """The newest allocation of each task group (older ones were replaced or belong to an older
    job version)."""
    latest: dict[str, dict] = {}
    for alloc in allocs or ():
        group = alloc.get("TaskGroup")
        if not group:
            continue
        if group not in latest or _alloc_order(alloc) >= _alloc_order(latest[group]):
            latest[group] = alloc
    return latest


def _events(alloc: dict) -> list[tuple[str, dict]]:
    out = []
    for task, state in (alloc.get("TaskStates") or {}).items():
        for event in (state or {}).get("Events") or ():
            out.append((task, event))
    return out


def _event_text(event: dict) -> str:
    parts = [str(event.get(k) or "") for k in _EVENT_TEXT_FIELDS]
    parts += [str(v) for v in (event.get("Details") or {}).values()]
    return " ".join(parts).lower()


def hit_max_run_duration(alloc: dict) -> bool:
    """Whether Nomad killed this allocation for exceeding its group's ``max_run_duration``."""
    for key in ("ClientDescription", "DesiredDescription"):
        text = (alloc.get(key) or "").lower()
        if any(m in text for m in MAX_RUN_DURATION_MARKERS):
            return True
    return any(any(m in _event_text(ev) for m in MAX_RUN_DURATION_MARKERS) for _, ev in _events(alloc))


def _exit_code(alloc: dict) -> int | None:
    """The exit code of the task that ended the allocation: the last "Terminated" event, preferring
    a non-zero one (in a multi-task group the failing task is the interesting one)."""
    nonzero = zero = None
    for _, event in sorted(_events(alloc), key=lambda te: te[1].get("Time") or 0):
        if event.get("Type") == "Terminated" and event.get("ExitCode") is not None:
            code = int(event["ExitCode"])
            if code != 0:
                nonzero = code
            else:
                zero = code
    return nonzero if nonzero is not None else zero


def _failure_detail(alloc: dict) -> str:
    """A short "task X: why" for a failed allocation, from its failed task's events."""
    for task, state in sorted((alloc.get("TaskStates") or {}).items()):
        if not (state or {}).get("Failed"):
            continue
        events = sorted(state.get("Events") or [], key=lambda e: e.get("Time") or 0)
        # The event that explains it: the last "Terminated" (carries the exit code), else the last
        # event that fails the task (driver or setup failure), else whatever came last.
        terminated = [e for e in events if e.get("Type") == "Terminated"]
        fatal = [e for e in events if e.get("FailsTask")]
        event = (terminated or fatal or events or [None])[-1]
        if event is None:
            return f"task {task} failed"
        msg = event.get("DisplayMessage") or event.get("DriverError") or event.get("SetupError") or ""
        return f"task {task}: {event.get('Type') or 'failed'}" + (f": {msg}" if msg else "")
    return alloc.get("ClientDescription") or "allocation failed"


def _killing_times(alloc: dict) -> list[int]:
    return [int(ev.get("Time") or 0) for _, ev in _events(alloc) if ev.get("Type") == "Killing" and ev.get("Time")]


def _finished_time(alloc: dict) -> int | None:
    """When the allocation's tasks ended (ns): the latest event time. Event times are ns integers,
    unlike FinishedAt which is an RFC3339 string."""
    times = [int(ev.get("Time") or 0) for _, ev in _events(alloc) if ev.get("Time")]
    return max(times) if times else None


def nodes_total(job: dict | None, fallback: int | None = None) -> int | None:
    """N: from ``Meta.halo_sched_nodes`` (the renderer's word), else the number of task groups."""
    if job:
        meta = job.get("Meta") or {}
        try:
            if meta.get(NODES_META_KEY) not in (None, ""):
                return int(meta[NODES_META_KEY])
        except (TypeError, ValueError):
            pass
        groups = job.get("TaskGroups") or []
        if groups:
            return len(groups)
    return fallback


def group_names(job: dict | None, n: int | None, allocs: Iterable[dict] = ()) -> list[str]:
    """The job's task group names in job order (``node-0`` .. when only N is known); without the
    job, the groups its allocations mention."""
    names = [g.get("Name") for g in (job or {}).get("TaskGroups") or [] if g.get("Name")]
    if not names and n:
        names = [f"node-{i}" for i in range(n)]
    if job and names:
        # Groups only an older version's allocations mention are not part of this job any more.
        return names
    known = set(names)
    extra = {a.get("TaskGroup") for a in allocs if a.get("TaskGroup") and a.get("TaskGroup") not in known}
    return names + sorted(extra, key=_natural_key)


# --------------------------------------------------------------------------- placement failures


def placement_failures(evals: Iterable[dict]) -> tuple[dict[str, dict], bool]:
    """Per task group, the most recent AllocMetric explaining why it could not be placed, and
    whether Nomad still has a *blocked* evaluation waiting for capacity.

    Nomad records FailedTGAllocs on the evaluation that tried to place (and, since 1.x, copies
    them onto the blocked evaluation it creates to retry); newer evaluations supersede older ones.
    """
    failures: dict[str, dict] = {}
    blocked = False
    for ev in sorted(evals or (), key=lambda e: (e.get("CreateIndex") or 0, e.get("ModifyIndex") or 0)):
        for group, metric in (ev.get("FailedTGAllocs") or {}).items():
            failures[group] = metric or {}
        if ev.get("Status") == "blocked":
            blocked = True
    return failures, blocked


def _counts(mapping: dict | None) -> str:
    items = sorted((mapping or {}).items(), key=lambda kv: (-int(kv[1] or 0), kv[0]))
    return ", ".join(f"{k}: {v}" for k, v in items)


def describe_alloc_metric(group: str, metric: dict) -> str:
    """One line saying why Nomad could not place ``group``, from an AllocMetric, e.g.
    ``node-1: 0/3 nodes eligible; filtered 1 (distinct_hosts: 1); exhausted 2 (devices: no devices
    match request: 2)``."""
    m = metric or {}
    evaluated = int(m.get("NodesEvaluated") or 0)
    filtered = int(m.get("NodesFiltered") or 0)
    exhausted = int(m.get("NodesExhausted") or 0)
    if evaluated == 0:
        available = m.get("NodesAvailable") or {}
        where = f" (ready nodes per datacenter: {_counts(available)})" if available else ""
        pool = m.get("NodesInPool")
        pool_txt = f"; {pool} node(s) in the node pool" if pool is not None else ""
        return f"{group}: no nodes in the job's datacenters to evaluate{where}{pool_txt}"
    eligible = max(evaluated - filtered - exhausted, 0)
    parts = [f"{group}: {eligible}/{evaluated} nodes eligible"]
    if filtered:
        why = ", ".join(x for x in (_counts(m.get("ConstraintFiltered")),
                                    _counts({f"class {k}": v for k, v in (m.get("ClassFiltered") or {}).items()})) if x)
        parts.append(f"filtered {filtered}" + (f" ({why})" if why else ""))
    if exhausted:
        why = ", ".join(x for x in (_counts(m.get("DimensionExhausted")),
                                    _counts({f"class {k}": v for k, v in (m.get("ClassExhausted") or {}).items()})) if x)
        parts.append(f"exhausted {exhausted}" + (f" ({why})" if why else ""))
    if m.get("QuotaExhausted"):
        parts.append("quota exhausted: " + ", ".join(m["QuotaExhausted"]))
    return "; ".join(parts)


# --------------------------------------------------------------------------- per-group view


@dataclass
class _Group:
    name: str
    alloc: dict | None
    phase: str  # unplaced | pending | running | complete | failed | timeout | stopped | lost | preempted | disconnected
    exit_code: int | None = None
    detail: str = ""


def _classify(name: str, alloc: dict | None) -> _Group:
    if alloc is None:
        return _Group(name, None, "unplaced")
    client = alloc.get("ClientStatus") or ""
    desired = alloc.get("DesiredStatus") or ""
    where = alloc.get("NodeName") or (alloc.get("NodeID") or "")[:8]
    if client in _TERMINAL_CLIENT and hit_max_run_duration(alloc):
        return _Group(name, alloc, "timeout", None, f"{name} on {where} exceeded max_run_duration")
    if client == "running":
        return _Group(name, alloc, "running", None, where)
    if client == "pending":
        return _Group(name, alloc, "stopped" if desired in ("stop", "evict") else "pending", None, where)
    if client == "failed":
        return _Group(name, alloc, "failed", _exit_code(alloc), f"{name} on {where}: {_failure_detail(alloc)}")
    if client == "complete":
        if desired == "evict":
            return _Group(name, alloc, "preempted", None, f"{name} on {where}: {alloc.get('DesiredDescription') or 'evicted'}")
        if desired == "stop" and _killing_times(alloc):
            return _Group(name, alloc, "stopped", _exit_code(alloc), where)
        code = _exit_code(alloc)
        return _Group(name, alloc, "complete", 0 if code is None else code, where)
    if client == "lost":
        return _Group(name, alloc, "lost", None, f"{name}: node {where} was lost ({alloc.get('ClientDescription') or 'node down'})")
    if client == "unknown":
        return _Group(name, alloc, "disconnected", None, f"{name}: node {where} is disconnected")
    return _Group(name, alloc, "pending", None, where)


def _group_extra(g: _Group) -> dict[str, Any]:
    a = g.alloc or {}
    return {
        "phase": g.phase,
        "alloc_id": a.get("ID"),
        "node": a.get("NodeName") or a.get("NodeID"),
        "client_status": a.get("ClientStatus"),
        "desired_status": a.get("DesiredStatus"),
        "exit_code": g.exit_code,
    }


# --------------------------------------------------------------------------- job state


def job_state(job: dict | None, allocs: list, evals: list, job_id: str) -> JobState:
    """Fold a job, its allocations and its evaluations into one :class:`JobState` (see module doc)."""
    allocs = list(allocs or [])
    evals = list(evals or [])
    n = nodes_total(job)
    names = group_names(job, n, allocs)
    if n is None:
        n = len(names) or None
    latest = latest_allocations(allocs)
    groups = [_classify(name, latest.get(name)) for name in names]
    by_phase: dict[str, list[_Group]] = {}
    for g in groups:
        by_phase.setdefault(g.phase, []).append(g)

    def count(*phases: str) -> int:
        return sum(len(by_phase.get(p, ())) for p in phases)

    running = count("running")
    placed = count("pending", "running", "complete", "failed", "timeout", "stopped", "lost", "preempted", "disconnected")
    failures, blocked = placement_failures(evals)
    unplaced = [g.name for g in groups if g.phase == "unplaced"]
    blocked_reasons = {name: describe_alloc_metric(name, failures[name]) for name in unplaced if name in failures}
    extra: dict[str, Any] = {
        "groups": {g.name: _group_extra(g) for g in groups},
        "nodes_placed": placed,
        "blocked": blocked_reasons,
        "blocked_eval": blocked,
    }
    if job:
        extra["job_version"] = job.get("Version")
        extra["namespace"] = job.get("Namespace")

    def state(status: JobStatus, reason: str = "", exit_code: int | None = None) -> JobState:
        return JobState(
            id=job_id,
            status=status,
            raw_state=(job or {}).get("Status") or ("not found" if job is None else ""),
            exit_code=exit_code,
            nodes_total=n,
            nodes_running=running,
            reason=reason,
            extra=extra,
        )

    if job is None:
        return state(JobStatus.UNKNOWN, f"Nomad has no job {job_id!r}: never registered in this namespace/region, "
                                        "or stopped with purge, or garbage-collected")

    still = running + count("pending", "disconnected")
    still_txt = (f"; {still} other node group{'s' if still != 1 else ''} still running — cancel the job to "
                 "release them") if still else ""

    if by_phase.get("timeout"):
        hit = by_phase["timeout"]
        reason = "; ".join(g.detail for g in hit)
        collateral = by_phase.get("failed") or []
        if collateral:
            reason += "; then " + ", ".join(f"{g.name} exited {g.exit_code}" for g in collateral)
        return state(JobStatus.TIMEOUT, reason + still_txt)

    failed = by_phase.get("failed") or []
    if job.get("Stop"):
        # A stop kills the placed ranks; the others then often crash on their own (NCCL errors)
        # before their own kill arrives. Count a failure as the job's real outcome only if it
        # ended before Nomad began killing anything for the stop.
        kill_times = [t for g in groups if g.alloc and (g.alloc.get("DesiredStatus") == "stop")
                      for t in _killing_times(g.alloc)]
        stop_started = min(kill_times) if kill_times else None
        genuine = [g for g in failed
                   if stop_started is None or (_finished_time(g.alloc) or 0) < stop_started]
        if genuine:
            first = genuine[0]
            return state(JobStatus.FAILED, "; ".join(g.detail for g in genuine) + "; then the job was stopped",
                         first.exit_code)
        if n and count("complete") == n:
            return state(JobStatus.COMPLETED, "finished before the job was stopped", 0)
        reason = "job stopped"
        if blocked_reasons:
            reason += " while not fully placed: " + "; ".join(blocked_reasons.values())
        elif unplaced:
            reason += f" while {', '.join(unplaced)} had not been placed"
        return state(JobStatus.CANCELLED, reason)

    if failed:
        first = failed[0]
        return state(JobStatus.FAILED, "; ".join(g.detail for g in failed) + still_txt, first.exit_code)
    if by_phase.get("lost"):
        return state(JobStatus.NODE_FAIL, "; ".join(g.detail for g in by_phase["lost"]) + still_txt)
    if by_phase.get("preempted"):
        return state(JobStatus.PREEMPTED, "; ".join(g.detail for g in by_phase["preempted"]) + still_txt)

    completed = count("complete")
    if n and completed == n:
        return state(JobStatus.COMPLETED, "", 0)
    if n and running and running + completed == n:
        return state(JobStatus.RUNNING)

    if job.get("Status") == "dead":
        # Dead, not stopped, not all complete: its allocations were garbage-collected or its
        # evaluation gave up; nothing will run any more.
        if not allocs:
            return state(JobStatus.UNKNOWN, "job is dead and Nomad no longer lists its allocations")
        missing = [g.name for g in groups if g.phase in ("unplaced", "stopped")]
        return state(JobStatus.FAILED, f"job is dead but {', '.join(missing) or 'some node groups'} never ran"
                     + (": " + "; ".join(blocked_reasons.values()) if blocked_reasons else ""))

    waiting = []
    if blocked_reasons:
        waiting.append(("blocked: " if blocked else "not placed: ") + "; ".join(blocked_reasons.values()))
    elif unplaced:
        waiting.append(f"waiting for placement of {', '.join(unplaced)}")
    starting = by_phase.get("pending") or []
    if starting:
        waiting.append("starting: " + ", ".join(f"{g.name} on {g.detail}" for g in starting))
    if by_phase.get("disconnected"):
        waiting.append("; ".join(g.detail for g in by_phase["disconnected"]))
    if by_phase.get("stopped"):
        waiting.append("allocation stopped without replacement: " + ", ".join(g.name for g in by_phase["stopped"]))
    reason = "; ".join(waiting)
    if running:
        return state(JobStatus.PARTIAL, reason)
    return state(JobStatus.PENDING, reason)


# --------------------------------------------------------------------------- plan


@dataclass
class GroupPlacement:
    """Whether the scheduler could place one task group in a plan, and if not, why."""

    group: str
    can_place: bool
    place: int = 0  # allocations the plan would create for this group
    nodes_evaluated: int = 0
    nodes_filtered: int = 0
    nodes_exhausted: int = 0
    constraint_filtered: dict[str, int] = field(default_factory=dict)
    class_filtered: dict[str, int] = field(default_factory=dict)
    dimension_exhausted: dict[str, int] = field(default_factory=dict)
    class_exhausted: dict[str, int] = field(default_factory=dict)
    nodes_available: dict[str, int] = field(default_factory=dict)
    reason: str = ""


def plan_summary(plan_response: dict) -> list[GroupPlacement]:
    """Per task group of a plan (``POST /v1/job/:id/plan``): can it place now, and why not."""
    plan = plan_response or {}
    updates = ((plan.get("Annotations") or {}).get("DesiredTGUpdates")) or {}
    failed = plan.get("FailedTGAllocs") or {}
    diff_groups = [g.get("Name") for g in ((plan.get("Diff") or {}).get("TaskGroups") or []) if g.get("Name")]
    names = sorted(set(updates) | set(failed) | set(diff_groups), key=_natural_key)
    out = []
    for name in names:
        m = failed.get(name)
        place = int((updates.get(name) or {}).get("Place") or 0)
        if m is None:
            out.append(GroupPlacement(group=name, can_place=True, place=place))
            continue
        out.append(GroupPlacement(
            group=name,
            can_place=False,
            place=place,
            nodes_evaluated=int(m.get("NodesEvaluated") or 0),
            nodes_filtered=int(m.get("NodesFiltered") or 0),
            nodes_exhausted=int(m.get("NodesExhausted") or 0),
            constraint_filtered=dict(m.get("ConstraintFiltered") or {}),
            class_filtered=dict(m.get("ClassFiltered") or {}),
            dimension_exhausted=dict(m.get("DimensionExhausted") or {}),
            class_exhausted=dict(m.get("ClassExhausted") or {}),
            nodes_available=dict(m.get("NodesAvailable") or {}),
            reason=describe_alloc_metric(name, m),
        ))
    return out


def plan_warnings(plan_response: dict) -> list[str]:
    """Nomad's plan/register warnings (one multi-line string, "N warnings:\\n\\n* ...") as a list."""
    text = (plan_response or {}).get("Warnings") or ""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or re.fullmatch(r"\d+ warnings?( occurred)?:", line):
            continue
        lines.append(line[2:] if line.startswith("* ") else line)
    return lines


def format_plan(plan_response: dict, job_id: str | None = None) -> str:
    """Human text for a plan: one line per node group, then warnings and a verdict."""
    groups = plan_summary(plan_response)
    blocked = [g for g in groups if not g.can_place]
    head = f"Plan for job {job_id!r}" if job_id else "Plan"
    lines = [f"{head}: {len(groups) - len(blocked)}/{len(groups)} node groups can be placed now"]
    for g in groups:
        if g.can_place:
            lines.append(f"  {g.group}: ok" + (f" (places {g.place})" if g.place else ""))
        else:
            lines.append(f"  {g.group}: CANNOT place: {g.reason.split(': ', 1)[-1]}")
    warnings = plan_warnings(plan_response)
    if warnings:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in warnings]
    if blocked:
        names = ", ".join(g.group for g in blocked)
        lines.append(
            "Nomad places node groups independently (no gang scheduling): submitting now would hold GPUs on "
            f"the placeable nodes while {names} {'waits' if len(blocked) == 1 else 'wait'} for capacity."
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- placement watch


class _PlacementAPI(Protocol):
    def job(self, job_id: str) -> dict | None: ...
    def allocations(self, job_id: str) -> list: ...
    def evaluations(self, job_id: str) -> list: ...
    def stop(self, job_id: str, purge: bool = False) -> dict: ...


@dataclass
class PlacementResult:
    """How ``watch_placement`` ended.

    ``placed``: every node group got a running allocation (or already finished). ``timed_out``:
    the placement timeout passed first; then ``stopped`` says the job was stopped to release what
    it held. ``state`` is the last observed state (the terminal one when the job ended meanwhile).
    """

    job_id: str
    placed: bool
    nodes_total: int
    nodes_running: int
    timed_out: bool = False
    stopped: bool = False
    elapsed_s: float = 0.0
    state: JobState | None = None
    blocked: dict[str, str] = field(default_factory=dict)
    reason: str = ""

    def describe(self) -> str:
        if self.placed:
            return f"all {self.nodes_total} node groups running after {self.elapsed_s:.1f}s"
        return self.reason


def watch_placement(
    client: _PlacementAPI,
    job_id: str,
    n_nodes: int,
    placement_timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[JobState], None] | None = None,
    poll_interval_s: float = 2.0,
) -> PlacementResult:
    """Poll until all ``n_nodes`` groups run; past ``placement_timeout_s``, stop the job.

    Nomad has no gang scheduling, so a half-placed job would hold its placed nodes' GPUs
    indefinitely; this bounds that. It never sleeps past the deadline (the last sleep is clipped),
    returns at once when the job ends meanwhile (failed, stopped by someone else, ...), and keeps
    polling through transient API errors until the deadline.
    """
    start = clock()
    deadline = start + max(0.0, placement_timeout_s)
    last: JobState | None = None
    last_key: tuple | None = None
    last_error: SchedulerError | None = None

    def result(**kw: Any) -> PlacementResult:
        st = kw.pop("state", last)
        return PlacementResult(
            job_id=job_id,
            nodes_total=n_nodes,
            nodes_running=(st.nodes_running or 0) if st else 0,
            elapsed_s=clock() - start,
            state=st,
            blocked=dict((st.extra.get("blocked") or {}) if st else {}),
            **kw,
        )

    while True:
        try:
            current = job_state(client.job(job_id), client.allocations(job_id), client.evaluations(job_id), job_id)
        except SchedulerError as exc:
            # Keep trying until the deadline: a Nomad leader election should not leave a
            # half-placed job holding GPUs. The error is reported if it never clears.
            last_error = exc
        else:
            last_error = None
            last = current
            key = (current.status, current.nodes_running, current.extra.get("nodes_placed"))
            if key != last_key:
                last_key = key
                if on_progress:
                    on_progress(current)
            if current.status in (JobStatus.RUNNING, JobStatus.COMPLETED):
                return result(placed=True, reason=current.describe())
            if current.status.terminal or current.status == JobStatus.UNKNOWN:
                return result(placed=False, reason=f"job ended before all node groups were placed: {current.describe()}")
        remaining = deadline - clock()
        if remaining <= 0:
            break
        sleep(min(poll_interval_s, remaining))

    running = (last.nodes_running or 0) if last else 0
    blocked = (last.extra.get("blocked") or {}) if last else {}
    why = "; ".join(blocked.values()) if blocked else (last.reason if last and last.reason else "")
    summary = (f"placement timed out after {placement_timeout_s:g}s: {running}/{n_nodes} node groups running"
               + (f" ({why})" if why else ""))
    if last_error is not None:
        summary += f"; last Nomad error: {last_error}"
    try:
        client.stop(job_id)
    except SchedulerError as exc:
        raise SchedulerError(
            f"{summary}; stopping job {job_id!r} to release its nodes FAILED: {exc}. "
            f"Stop it by hand (nomad job stop {job_id}) or it keeps holding GPUs."
        ) from exc
    return result(placed=False, timed_out=True, stopped=True, reason=summary + f"; job {job_id!r} stopped")
