"""Fold what Nomad says about one halo-sched job into a :class:`JobState` (pure).

The trainer is one group ``trainer`` (count N; the allocation named ``JOBID.trainer[K]`` runs
node rank K). Nomad has no gang scheduling, so the job can be half-placed; the state is computed per node rank from that rank's allocations and folded:

* PENDING   no rank runs yet (reason: what is blocked and why, or what is starting)
* PARTIAL   k of N ranks running (0 < k < N); never final
* RUNNING   every rank started (running, or already finished successfully)
* COMPLETED every rank finished with exit 0
* FAILED    a rank's task failed (non-zero exit, driver failure); the exit code is kept. Reported
            as soon as one rank fails, even while others run: a torchrun world with a dead rank
            never recovers (the watcher then stops the job, see ``watchdog.py``)
* NODE_FAIL a rank's node went down: its allocation is ``lost``, or ``unknown`` (what Nomad sets
            when ``disconnect { replace = false }`` keeps it from replacing a running one). An
            earlier lost allocation counts even when Nomad placed a replacement under its name:
            the world does not re-form around a new rank
* TIMEOUT   a rank hit ``max_run_duration``: ClientStatus ``complete`` with ClientDescription exactly
            ``allocation exceeded max_run_duration`` (Nomad 2.0.3+). Wins over the failures it causes
* CANCELLED the job was stopped, unless a rank had died before the stop (then that outcome)
* PREEMPTED a rank's allocation was evicted for another job
* UNKNOWN   Nomad does not know the job (wrong namespace/region, purged, garbage-collected)

Inputs are what the list endpoints return: a job stub (``GET /v1/jobs?meta=true``) or a whole
job, allocation stubs, and the evaluations that carry ``FailedTGAllocs``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from halo_sched.backends.base import JobState, JobStatus, NomadDetail

from .render import KEEPER_GROUP, NODES_META, TRAINER_GROUP, alloc_index, node_rank_of

# nomad/structs: AllocTimeoutReasonMaxRunDuration. Matched exactly: free text such as an image
# name or a log line may contain "max_run_duration" without anything having timed out.
MAX_RUN_DURATION_DESC = "allocation exceeded max_run_duration"

_DEAD = ("failed", "lost", "unknown", "timeout")  # phases that end the world


def _alloc_order(alloc: dict) -> tuple:
    return (alloc.get("CreateIndex") or 0, alloc.get("CreateTime") or 0, alloc.get("ModifyIndex") or 0)


def _events(alloc: dict) -> list[dict]:
    return [ev for state in (alloc.get("TaskStates") or {}).values() for ev in (state or {}).get("Events") or ()]


def hit_max_run_duration(alloc: dict) -> bool:
    """Whether Nomad killed this allocation for exceeding its group's ``max_run_duration``."""
    return alloc.get("ClientStatus") == "complete" and alloc.get("ClientDescription") == MAX_RUN_DURATION_DESC


def _exit_code(alloc: dict) -> int | None:
    """The exit code of the task that ended the allocation: the last "Terminated" event, preferring
    a non-zero one (in a multi-task group the failing task is the interesting one)."""
    nonzero = zero = None
    for event in sorted(_events(alloc), key=lambda e: e.get("Time") or 0):
        if event.get("Type") == "Terminated" and event.get("ExitCode") is not None:
            code = int(event["ExitCode"])
            if code != 0:
                nonzero = code
            else:
                zero = code
    return nonzero if nonzero is not None else zero


def failure_detail(alloc: dict) -> str:
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
    return [int(ev["Time"]) for ev in _events(alloc) if ev.get("Type") == "Killing" and ev.get("Time")]


def _finished_time(alloc: dict) -> int:
    """When the allocation's tasks ended (ns): its latest event, else its last modification."""
    times = [int(ev["Time"]) for ev in _events(alloc) if ev.get("Time")]
    return max(times) if times else int(alloc.get("ModifyTime") or 0)


def go_time(text) -> float | None:
    """A Go ``time.Time`` as Nomad's JSON carries it (RFC 3339 with up to nanoseconds, ``Z`` or an
    offset: time.Time.MarshalJSON) as epoch seconds; None for the zero time
    (``0001-01-01T00:00:00Z``: a TaskState's StartedAt/FinishedAt not set yet), null, or anything
    else."""
    import datetime as _dt
    import re as _re

    if not isinstance(text, str):
        return None
    m = _re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", text.strip())
    if not m or int(m.group(1)) <= 1:
        return None
    year, month, day, hour, minute, sec = (int(g) for g in m.groups()[:6])
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    zone = m.group(8)
    offset = 0 if zone == "Z" else (1 if zone[0] == "+" else -1) * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    try:
        when = _dt.datetime(year, month, day, hour, minute, sec, tzinfo=_dt.timezone.utc)
    except ValueError:
        return None
    return when.timestamp() - offset + frac


def task_times(allocs: Iterable[dict]) -> tuple[float | None, float | None, bool]:
    """(first task start, last task finish, every started task finished) over ``allocs``, by the
    Nomad clients' own clocks: each TaskState's ``StartedAt`` and ``FinishedAt``
    (nomad/structs/structs.go v2.0.5 TaskState: StartedAt "the time the task is started. It is
    updated each time the task starts", FinishedAt "the time at which the task transitioned to
    dead and will not be started again"; zero until then). The allocation stubs carry them
    (nomad/structs/alloc.go Allocation.Stub: TaskStates unless ``task_states=false``)."""
    starts, ends, open_ = [], [], False
    for alloc in allocs or ():
        # A node that went down never reports its tasks' end: the allocation ends when the
        # servers marked it lost or unknown (its ModifyTime, ns; nomad/structs/alloc.go).
        gone = alloc.get("ClientStatus") in ("lost", "unknown")
        for ts in (alloc.get("TaskStates") or {}).values():
            ts = ts or {}
            started, finished = go_time(ts.get("StartedAt")), go_time(ts.get("FinishedAt"))
            if started is not None:
                starts.append(started)
                if finished is None and gone and alloc.get("ModifyTime"):
                    finished = int(alloc["ModifyTime"]) / 1e9
                if finished is None:
                    open_ = True
            if finished is not None:
                ends.append(finished)
    return (min(starts) if starts else None, max(ends) if ends else None, not open_)


def with_task_times(state: JobState, allocs: Iterable[dict]) -> JobState:
    """The job's start and end by Nomad's clock (``started_at``/``ended_at``, what a run's
    GPU-hours count, halo_sched/runs.py): its first task's StartedAt, once a rank ran; its last
    task's FinishedAt, once the job ended and every task that started has finished (a rank still
    being killed after the job failed has not: the end is taken when it has)."""
    if state.status in (JobStatus.PENDING, JobStatus.UNKNOWN):
        return state
    start, end, all_done = task_times(allocs)
    state.started_at = start
    if state.status.terminal and start is not None and all_done and end is not None and end >= start:
        state.ended_at = end
    return state


def nodes_total(job: dict | None) -> int | None:
    """N: from ``Meta.halo_sched_nodes`` (the renderer's word), else the groups' counts."""
    if not job:
        return None
    try:
        return int((job.get("Meta") or {})[NODES_META])
    except (KeyError, TypeError, ValueError):
        pass
    counts = [int(g.get("Count") or 1) for g in job.get("TaskGroups") or []]
    return sum(counts) or None


def allocations_by_rank(allocs: Iterable[dict]) -> dict[int, list[dict]]:
    """Each node rank's allocations, oldest first (allocations of groups halo-sched does not
    render are left out)."""
    out: dict[int, list[dict]] = {}
    for alloc in allocs or ():
        rank = node_rank_of(alloc.get("TaskGroup") or "", alloc.get("Name") or "")
        if rank is not None:
            out.setdefault(rank, []).append(alloc)
    for lst in out.values():
        lst.sort(key=_alloc_order)
    return out


def latest_allocations(allocs: Iterable[dict]) -> dict[int, dict]:
    """The newest allocation of each node rank (a name can have several over time)."""
    return {rank: lst[-1] for rank, lst in allocations_by_rank(allocs).items()}


# --------------------------------------------------------------------------- placement failures


def placement_failures(evals: Iterable[dict]) -> tuple[dict[str, dict], bool]:
    """Per task group, the most recent AllocMetric explaining why it could not be placed, and
    whether Nomad still has a *blocked* evaluation waiting for capacity.

    The scheduler copies FailedTGAllocs onto the blocked evaluation it creates; a blocked
    evaluation that fails again is re-blocked in place, keeping its first metrics
    (scheduler/generic_sched.go), so the counts placed so far come from the allocations.
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
    ``trainer: 0/3 nodes eligible; filtered 1 (distinct_hosts: 1); exhausted 2 (devices: no devices
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


def ranks_text(ranks: Iterable[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    out: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


# --------------------------------------------------------------------------- per-rank view


@dataclass
class NodeView:
    """One node rank: its current allocation and what it means."""

    rank: int
    alloc: dict | None
    phase: str  # unplaced | pending | running | complete | failed | timeout | stopped | lost | unknown | preempted
    exit_code: int | None = None
    detail: str = ""
    died_at: int = 0  # ns, for ordering dead ranks
    replaced_by: dict | None = None  # a later allocation Nomad placed under this rank's name
    server: str | None = None  # "ROLE[K]" for a server allocation (servers:), else a trainer node

    @property
    def dead(self) -> bool:
        return self.phase in _DEAD

    def as_dict(self) -> dict[str, Any]:
        a = self.alloc or {}
        out = {
            "node_rank": self.rank,
            "phase": self.phase,
            "group": a.get("TaskGroup"),
            "alloc_id": a.get("ID"),
            "alloc_name": a.get("Name"),
            "node": a.get("NodeName") or a.get("NodeID"),
            "node_id": a.get("NodeID"),
            "client_status": a.get("ClientStatus"),
            "desired_status": a.get("DesiredStatus"),
            "exit_code": self.exit_code,
        }
        if self.replaced_by:
            out["replaced_by"] = self.replaced_by.get("ID")
        return out


def _where(alloc: dict) -> str:
    return alloc.get("NodeName") or (alloc.get("NodeID") or "")[:8] or "?"


def _classify(rank: int, alloc: dict | None) -> NodeView:
    if alloc is None:
        return NodeView(rank, None, "unplaced")
    client = alloc.get("ClientStatus") or ""
    desired = alloc.get("DesiredStatus") or ""
    who = f"node rank {rank} ({alloc.get('ID', '')[:8]} on {_where(alloc)})"
    if hit_max_run_duration(alloc):
        return NodeView(rank, alloc, "timeout", None, f"{who} exceeded max_run_duration", _finished_time(alloc))
    if client == "running":
        return NodeView(rank, alloc, "running", None, who)
    if client == "pending":
        return NodeView(rank, alloc, "stopped" if desired in ("stop", "evict") else "pending", None, who)
    if client == "failed":
        return NodeView(rank, alloc, "failed", _exit_code(alloc), f"{who}: {failure_detail(alloc)}",
                        _finished_time(alloc))
    if client == "lost":
        why = alloc.get("ClientDescription") or "node down"
        return NodeView(rank, alloc, "lost", None, f"{who}: Nomad node {_where(alloc)} was lost ({why})",
                        int(alloc.get("ModifyTime") or 0))
    if client == "unknown":
        return NodeView(rank, alloc, "unknown", None,
                        f"{who}: Nomad node {_where(alloc)} is down or disconnected (allocation unknown)",
                        int(alloc.get("ModifyTime") or 0))
    if client == "complete":
        if desired == "evict":
            return NodeView(rank, alloc, "preempted", None, f"{who}: {alloc.get('DesiredDescription') or 'evicted'}")
        if desired == "stop" and _killing_times(alloc):
            return NodeView(rank, alloc, "stopped", _exit_code(alloc), who)
        code = _exit_code(alloc)
        return NodeView(rank, alloc, "complete", 0 if code is None else code, who)
    return NodeView(rank, alloc, "pending", None, who)


def node_views(allocs: Iterable[dict], n: int | None) -> list[NodeView]:
    """One view per node rank 0..N-1 (and any rank an allocation names beyond that)."""
    by_rank = allocations_by_rank(allocs)
    ranks = sorted(set(range(n or 0)) | set(by_rank))
    views = []
    for rank in ranks:
        history = by_rank.get(rank) or []
        latest = history[-1] if history else None
        view = _classify(rank, latest)
        if latest is not None:
            # A lost node's rank stays lost when Nomad places a replacement under its name: the
            # torchrun world does not re-form around it. Only the same job version counts (an
            # updated job replaces every allocation on purpose).
            for old in history[:-1]:
                if old.get("JobVersion") == latest.get("JobVersion") and old.get("ClientStatus") in ("lost", "unknown"):
                    dead = _classify(rank, old)
                    dead.replaced_by = latest
                    dead.detail += f"; Nomad placed a replacement ({latest.get('ID', '')[:8]} on {_where(latest)})"
                    view = dead
                    break
        views.append(view)
    return views


def server_views(allocs: Iterable[dict]) -> list[NodeView]:
    """One view per server (``server-ROLE`` group, index from the allocation name; the newest
    allocation of each name), each with ``server`` = ``ROLE[K]``."""
    from .servers import role_of_group

    latest: dict[tuple[str, int], dict] = {}
    for alloc in sorted(allocs or (), key=_alloc_order):
        role = role_of_group(alloc.get("TaskGroup") or "")
        index = alloc_index(alloc.get("Name") or "")
        if role and index is not None:
            latest[(role, index)] = alloc
    views = []
    for (role, k), alloc in sorted(latest.items()):
        v = _classify(k, alloc)
        v.server = f"{role}[{k}]"
        v.detail = v.detail.replace(f"node rank {k} (", f"server {role}[{k}] (", 1)
        views.append(v)
    return views


# --------------------------------------------------------------------------- job state


def _blocked_reasons(views: list[NodeView], failures: dict[str, dict]) -> dict[str, str]:
    """The trainer group's, when it has unplaced ranks: how many of its count, and Nomad's why."""
    ranks = [v.rank for v in views if v.phase == "unplaced"]
    if not ranks:
        return {}
    g = TRAINER_GROUP
    head = f"{g}: {len(ranks)} of {len(views)} unplaced (node rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)})"
    if g in failures:
        head += ": " + describe_alloc_metric(g, failures[g]).split(": ", 1)[-1]
    return {g: head}


def world_view(job: dict | None, allocs: list[dict], world: dict | None) -> tuple[list[dict], dict | None]:
    """A job with hot spares (``Meta.halo_sched_spares``; node/nomad_keeper.py): the trainer's
    allocations as node ranks by the run's world (its Variable's items, ``world``, when it is this
    attempt's: the slot of each rank, each swap; else generation 0, slots 0..N-1), each renamed
    ``JOB.trainer[RANK]``; a spare's and a slot a spare replaced are left out. With the spares' own
    view: ``{"total", "left", "swaps"}`` (None for a job without spares)."""
    from ...node.nomad_names import NOMAD_ATTEMPT_META, NOMAD_SPARES_META
    from ...node.nomad_keeper import World

    meta = (job or {}).get("Meta") or {}
    raw = str(meta.get(NOMAD_SPARES_META) or "")
    n = nodes_total(job)
    if not raw.isdigit() or not int(raw) or not n:
        return allocs, None
    attempt = str(meta.get(NOMAD_ATTEMPT_META) or "0")
    known = World.parse(world, int(attempt), n) if isinstance(world, dict) and attempt.isdigit() else None
    ranks = known.ranks if known is not None else {i: i for i in range(n)}
    swaps = [{k: sw.get(k) for k in ("rank", "bad", "spare", "reason", "by", "time")}
             for sw in (known.swaps if known is not None else []) if isinstance(sw, dict)]
    out = []
    for a in allocs:
        slot = alloc_index(a.get("Name") or "") if a.get("TaskGroup") == TRAINER_GROUP else None
        if slot is None:
            out.append(a)
        elif slot in ranks:
            out.append({**a, "Name": f"{(a.get('Name') or '').rpartition('[')[0]}[{ranks[slot]}]"})
    total = int(raw)
    return out, {"total": total, "left": max(0, total - len(swaps)), "swaps": swaps}


def job_state(job: dict | None, allocs: Iterable[dict], evals: Iterable[dict], job_id: str,
              world: dict | None = None) -> JobState:
    """Fold a job (stub or whole), its allocations and its evaluations into one :class:`JobState`;
    a job with hot spares by its run's ``world`` (:func:`world_view`)."""
    allocs, spares = world_view(job, list(allocs or []), world)
    n = nodes_total(job)
    views = node_views(allocs, n)
    if n is None:
        n = len(views) or None
    by_phase: dict[str, list[NodeView]] = {}
    for v in views:
        by_phase.setdefault(v.phase, []).append(v)

    def count(*phases: str) -> int:
        return sum(len(by_phase.get(p, ())) for p in phases)

    running = count("running")
    failures, blocked = placement_failures(evals)
    blocked_reasons = _blocked_reasons(views, failures)
    dead = sorted((v for v in views if v.dead), key=lambda v: (v.died_at, v.rank))
    # Server roles (servers:): a server that dies while the trainer has not completed is a dead
    # rank; one still running after the trainer completed keeps the job alive until the watcher
    # stops it (Nomad ends nothing across groups).
    servers = server_views(allocs)
    trainer_done = bool(n) and sum(v.phase == "complete" for v in views) == n
    dead_servers = [v for v in servers if v.dead and not trainer_done]
    if dead_servers:
        dead = sorted(dead + dead_servers, key=lambda v: (v.died_at, v.rank))
    detail = NomadDetail(
        nodes=[v.as_dict() for v in views],
        nodes_placed=len(views) - count("unplaced"),
        blocked=blocked_reasons,
        blocked_eval=blocked,
        dead=[{"node_rank": v.rank, "phase": v.phase, "detail": v.detail,
               **({"server": v.server} if v.server else {})} for v in dead],
        servers=[{**v.as_dict(), "server": v.server} for v in servers],
        servers_running=sum(v.phase in ("running", "pending") for v in servers),
    )
    if job:
        detail.namespace = job.get("Namespace")
        detail.servers_expected = _servers_expected(job)

    # The run's keeper (its own group) holds no node of the job's: its times are not the job's.
    timed = [a for a in allocs if a.get("TaskGroup") != KEEPER_GROUP]

    def state(status: JobStatus, reason: str = "", exit_code: int | None = None) -> JobState:
        return with_task_times(JobState(
            id=job_id, status=status,
            raw_state=(job or {}).get("Status") or ("not found" if job is None else ""),
            exit_code=exit_code, nodes_total=n, nodes_running=running, reason=reason, nomad=detail,
            spares=spares,
        ), timed)

    if job is None:
        return state(JobStatus.UNKNOWN, f"Nomad has no job {job_id!r}: never registered in this namespace/region, "
                                        "or stopped with purge, or garbage-collected")

    live = [v.rank for v in views if v.phase in ("running", "pending") and not (v.alloc or {}).get("DesiredStatus") == "stop"]
    live_txt = (f"; node rank{'s' if len(live) > 1 else ''} {ranks_text(live)} still running — cancel the job "
                "to release them") if live else ""

    if job.get("Stop"):
        # A stop kills the placed ranks; the others then often crash on their own (NCCL errors)
        # before their own kill arrives. A death counts as the job's outcome only if it came
        # before Nomad began killing anything for the stop; a lost node always counts.
        kill_times = [t for v in views if v.alloc and v.alloc.get("DesiredStatus") == "stop" for t in _killing_times(v.alloc)]
        stop_started = min(kill_times) if kill_times else None
        dead = [v for v in dead if v.phase in ("lost", "unknown", "timeout") or stop_started is None
                or v.died_at < stop_started]
        live_txt = "; then the job was stopped"
    verdict = _verdict(dead, live_txt)
    if verdict is not None:
        return state(*verdict)

    if job.get("Stop"):
        if n and count("complete") == n:
            return state(JobStatus.COMPLETED, "finished before the job was stopped", 0)
        reason = "job stopped"
        if blocked_reasons:
            reason += " while not fully placed: " + "; ".join(blocked_reasons.values())
        elif count("unplaced"):
            reason += f" while node ranks {ranks_text(v.rank for v in by_phase['unplaced'])} had not been placed"
        return state(JobStatus.CANCELLED, reason)

    if by_phase.get("preempted"):
        return state(JobStatus.PREEMPTED, "; ".join(v.detail for v in by_phase["preempted"]) + live_txt)

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
        missing = [v.rank for v in views if v.phase in ("unplaced", "stopped")]
        return state(JobStatus.FAILED, f"job is dead but node ranks {ranks_text(missing) or '?'} never ran"
                     + (": " + "; ".join(blocked_reasons.values()) if blocked_reasons else ""))

    waiting = []
    if blocked_reasons:
        waiting.append(("blocked: " if blocked else "not placed: ") + "; ".join(blocked_reasons.values()))
    starting = by_phase.get("pending") or []
    if starting:
        waiting.append("starting: " + ", ".join(v.detail for v in starting))
    if by_phase.get("stopped"):
        waiting.append("allocation stopped without replacement: node ranks "
                       + ranks_text(v.rank for v in by_phase["stopped"]))
    return state(JobStatus.PARTIAL if running else JobStatus.PENDING, "; ".join(waiting))


def _servers_expected(job: dict) -> int:
    """Server nodes the job asks for (``Meta.halo_sched_servers`` = ``name:nodes,...``)."""
    from .servers import SERVERS_META

    total = 0
    for part in str((job.get("Meta") or {}).get(SERVERS_META) or "").split(","):
        try:
            total += int(part.rpartition(":")[2])
        except ValueError:
            continue
    return total


def _verdict(dead: list[NodeView], tail: str) -> tuple[JobStatus, str, int | None] | None:
    """The outcome when ranks died: TIMEOUT wins (the others crash because one was killed), then
    NODE_FAIL (a lost node's peers fail in NCCL), then FAILED; the reason lists the dead ranks in
    the order they died."""
    if not dead:
        return None
    phases = {v.phase for v in dead}
    first = dead[0]
    text = "; ".join(v.detail for v in dead)
    if len(dead) > 1:
        text = f"node rank {first.rank} died first: {text}"
    if "timeout" in phases:
        return JobStatus.TIMEOUT, text + tail, None
    if phases & {"lost", "unknown"}:
        return JobStatus.NODE_FAIL, text + tail, None
    failed = [v for v in dead if v.phase == "failed"]
    return JobStatus.FAILED, text + tail, failed[0].exit_code
