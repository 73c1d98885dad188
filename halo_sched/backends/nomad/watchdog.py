"""Watch one Nomad job and act on what Nomad will not: stop it when a rank dies, or when it is not
placed within the placement timeout.

Nomad places allocations independently (no gang scheduling) and ends nothing when one fails: a
half-placed job holds its placed nodes' GPUs, and the survivors of a dead rank hold theirs until
NCCL's timeout. Whoever watches the job (``submit --wait``, ``Job.wait()``, ``halo-sched watch``)
runs :func:`watch_job`, which stops (deregisters, no purge) the job within one look of either;
a job whose run's keeper is alive (``keeper`` group) is the keeper's to stop or carry on.

Each look is a blocking query on the job's allocations (``index``/``wait``): Nomad answers as soon
as they change, else after ``wait_s``, so a dead rank is seen at once while an idle job costs two
calls per ``wait_s`` (its allocations, and its stub to see a stop that changed no allocation).
On a busy cluster other jobs' allocations wake the query early; those wakes cost one call per
``poll_s`` at most.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from halo_sched.backends.base import JobState, JobStatus, NomadDetail
from halo_sched.errors import OutcomeUnknown, SchedulerError
from halo_sched.outage import ASK_LIMIT_S, RETRY_EVERY_S, Outage, clock_text, is_outage
from halo_sched.retry import within

from .render import KEEPER_GROUP
from .state import job_state, ranks_text
from .transport import never_resolved


class _WatchAPI(Protocol):
    def job_allocations(self, job_id: str, index: int = 0, wait_s: float | None = None) -> tuple[list, int]: ...
    def job_stubs(self, job_ids: list[str]) -> list[dict]: ...
    def placement_evaluations(self, job_ids: list[str]) -> list[dict]: ...
    def stop(self, job_id: str, purge: bool = False) -> dict: ...


@dataclass
class WatchResult:
    """How :func:`watch_job` ended. ``state``: the last state seen (terminal unless ``timeout`` or
    ``until_placed`` ended the watch). ``placed``: every rank started. ``timed_out``: the placement
    timeout passed first. ``stopped``: this watch stopped the job (``stop_reason`` says why)."""

    job_id: str
    state: JobState | None
    placed: bool = False
    timed_out: bool = False
    stopped: bool = False
    stop_reason: str = ""
    elapsed_s: float = 0.0
    calls: int = 0
    blocked: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        if self.stop_reason:
            return self.stop_reason
        return self.state.describe() if self.state else f"no state of {self.job_id!r} could be read"


def _signature(allocs: list[dict]) -> tuple:
    return tuple(sorted((a.get("ID"), a.get("ModifyIndex"), a.get("ClientStatus"), a.get("DesiredStatus"))
                        for a in allocs))


def world_of(client, job: dict | None) -> dict | None:
    """The run's world (node/nomad_keeper.py), for a job with hot spares whose version ``client``
    reads is the job's newest (an older version's world is gone: generation 0 stands for it);
    None otherwise, or when it cannot be read (generation 0 then, a look later it can)."""
    from ...node.nomad_names import NOMAD_SPARES_META

    if not job or not str((job.get("Meta") or {}).get(NOMAD_SPARES_META) or "").strip("0"):
        return None
    version = getattr(client, "version", None)
    if isinstance(version, int) and version != job.get("Version") and not (job.get("Stop") and version + 1 == job.get("Version")):
        return None
    from .groups import world_variable_path

    try:
        return client.get_variable(world_variable_path(job["ID"]))
    except SchedulerError:
        return None


def read_state(client: _WatchAPI, job_id: str, allocs: list[dict]) -> tuple[JobState, int]:
    """The job's state from its allocations plus its stub, and (only while some rank is unplaced)
    the evaluations saying why: (state, calls made). A job with hot spares: its run's world too."""
    stubs = [j for j in client.job_stubs([job_id]) if j.get("ID") == job_id]
    job = stubs[0] if stubs else None
    world = world_of(client, job)
    state = job_state(job, allocs, [], job_id, world)
    calls = 1 + (world is not None)
    if job is not None and _detail(state).nodes_placed < (state.nodes_total or 0):
        state = job_state(job, allocs, client.placement_evaluations([job_id]), job_id, world)
        calls += 1
    _detail(state).stop_requested = bool(job and job.get("Stop"))
    return state, calls


def _detail(state: JobState) -> NomadDetail:
    """The state's Nomad detail (state.py's fold always gives one)."""
    if state.nomad is None:
        state.nomad = NomadDetail()
    return state.nomad


def keeper_alive(allocs: list[dict]) -> bool:
    """A live allocation of the run's keeper (node/nomad_keeper.py, the job's ``keeper`` group):
    it decides what a dead rank means (the run's next attempt, which stops the survivors, or the
    job's stop) and the watcher only watches; a keeper not placed, or ended, leaves it to the
    watcher as before."""
    return any(a.get("TaskGroup") == KEEPER_GROUP and a.get("DesiredStatus") == "run"
               and a.get("ClientStatus") in ("pending", "running") for a in allocs or ())


def _survivors(state: JobState) -> list[int]:
    """Ranks still holding (or waiting for) a node: running, starting, or unplaced."""
    return [n["node_rank"] for n in _detail(state).nodes
            if n["phase"] in ("running", "pending", "unplaced")]


def watch_job(
    client: _WatchAPI,
    job_id: str,
    *,
    placement_timeout_s: float | None = None,
    until_placed: bool = False,
    timeout: float | None = None,
    on_change: Callable[[JobState], None] | None = None,
    on_tick: Callable[[JobState], None] | None = None,
    wait_s: float = 60.0,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    outage: Outage | None = None,
) -> WatchResult:
    """Watch until the job is terminal (or placed, with ``until_placed``; or ``timeout`` seconds).

    A rank that fails, is lost with its node, or times out while others run or wait: the job is
    stopped and the state says which rank died first. Not all ranks started within
    ``placement_timeout_s``: the job is stopped. ``wait_s`` 0 polls every ``poll_s`` instead of
    blocking (a server or proxy that ignores ``index`` is detected and polled the same way).
    Transient API errors are retried until a deadline; the last one is raised if none is left.
    With ``outage`` (halo_sched/outage.py), Nomad being unreachable (no connection, HTTP 5xx such
    as "No cluster leader") is waited through for its budget, said once per interval; past it, or
    unreachable when ``timeout`` ends, :class:`OutcomeUnknown`. Each look is bounded by the time
    left (``halo_sched.retry.within``): retries never carry the watch past ``timeout``.
    """
    start = clock()
    placement_deadline = start + placement_timeout_s if placement_timeout_s is not None else None
    deadline = start + timeout if timeout is not None else None
    index = 0
    calls = 0
    last: JobState | None = None
    last_key: tuple | None = None
    placed = False
    error: SchedulerError | None = None

    def result(state: JobState | None, **kw: Any) -> WatchResult:
        return WatchResult(job_id=job_id, state=state, placed=placed, elapsed_s=clock() - start, calls=calls,
                           blocked=dict(_detail(state).blocked if state else {}), **kw)

    def remaining() -> float | None:
        ends = [d for d in (deadline, None if placed else placement_deadline) if d is not None]
        return min(ends) - clock() if ends else None

    def ask_bound() -> float | None:
        """How long one look may take: the time left, and the outage's budget. Past the placement
        deadline only after an outage (judged once Nomad answers): --timeout and the budget."""
        left = remaining()
        if left is not None and left <= 0 and outage is not None:
            left = _least(None if deadline is None else deadline - clock(), ASK_LIMIT_S)
        return _least(left, outage.left() if outage is not None else None)

    last_sig: tuple | None = None
    while True:
        left = remaining()
        block = wait_s if left is None else max(0.0, min(wait_s, left))
        blocking = bool(wait_s and index and block > 0)
        asked = clock()
        try:
            with within(ask_bound()):
                allocs, new_index = client.job_allocations(job_id, index=index if blocking else 0, wait_s=block)
            calls += 1
            sig = _signature(allocs)
            if blocking and sig == last_sig and clock() - asked < block / 2:
                # Answered early with nothing new for this job: Job.Allocations reports the
                # allocs *table* index (nomad/job_endpoint.go), so any job's change wakes it.
                # Wait a poll interval before asking again rather than chase the cluster.
                index = new_index
                left = remaining()
                sleep(poll_s if left is None else max(0.0, min(poll_s, left)))
                continue
            with within(ask_bound()):
                state, n = read_state(client, job_id, allocs)
        except SchedulerError as exc:
            if outage is not None and is_outage(exc):
                if never_resolved(exc):
                    # NOMAD_ADDR names a host that never resolved since this command started:
                    # a typo, not an outage (one that resolved before is waited through).
                    raise OutcomeUnknown(f"{outage.job_id}: outcome unknown: {exc.short}; check NOMAD_ADDR") from exc
                error = exc
                outage.failed(exc, asked)  # OutcomeUnknown once the budget is spent
                if deadline is not None and clock() >= deadline:
                    raise OutcomeUnknown(outage.gave_up_text(
                        f"{outage.who} unreachable at the end of --timeout (since "
                        f"{clock_text(outage.since_wall or 0)})")) from exc
                # Whether the job placed cannot be seen while Nomad is unreachable: the placement
                # timeout is judged once it answers again (the wait goes on, within the budget).
                pause = _least(RETRY_EVERY_S, None if deadline is None else deadline - clock(), outage.left())
                sleep(max(0.0, pause))
                continue
            # A leader election must not leave a half-placed job holding GPUs: keep trying until
            # the deadline, then act on the last state seen. Without a deadline, give up (the
            # client has already retried).
            error = exc
            left = remaining()
            if left is None or (left <= 0 and last is None):
                raise
            if left > 0:
                sleep(min(poll_s, left))
                continue
            state, new_index, n, sig = last, index, 0, last_sig
        else:
            error = None
            if outage is not None:
                outage.seen(state)
        calls += n
        last_sig = sig
        last = state
        key = state.change_key()
        if key != last_key:
            last_key = key
            if on_change:
                on_change(state)
        if on_tick:
            on_tick(state)
        if state.status in (JobStatus.RUNNING, JobStatus.COMPLETED):
            placed = True

        detail = _detail(state)
        dead = detail.dead
        survivors = _survivors(state)
        if dead and survivors and not detail.stop_requested and not keeper_alive(allocs):
            first = dead[0]
            who = f"server {first['server']}" if first.get("server") else f"node rank {first['node_rank']}"
            why = (f"{who} died first ({first['detail']}); halo-sched stopped the job: "
                   f"node rank{'s' if len(survivors) > 1 else ''} {ranks_text(survivors)} (the survivors) "
                   f"{'were' if len(survivors) > 1 else 'was'} stopped")
            _stop(client, job_id, why)
            calls += 1
            state.reason = why
            detail.stopped_by_watcher = True
            return result(state, stopped=True, stop_reason=why)
        if (state.status is JobStatus.COMPLETED and not detail.stop_requested
                and (detail.servers_running or (detail.servers_expected and state.raw_state != "dead"))):
            # The trainer's group completed; the server groups would keep the batch job alive:
            # running servers, or a server still waiting for a node (a blocked evaluation places
            # it later and it holds that node). Nomad marks a job "dead" only once nothing of it
            # can run any more (nomad/state/state_store.go getJobStatus).
            why = "the trainer completed; halo-sched stopped the job to end its server groups"
            _stop(client, job_id, why)
            calls += 1
            return result(state, stopped=True, stop_reason=why)
        if state.status.terminal or state.status is JobStatus.UNKNOWN:
            return result(state)
        if until_placed and placed:
            return result(state)

        now = clock()
        if not placed and placement_deadline is not None and now >= placement_deadline:
            why = (f"placement timed out after {placement_timeout_s:g}s: {state.nodes_running or 0}/"
                   f"{state.nodes_total} nodes running")
            blocked = detail.blocked
            because = "; ".join(blocked.values()) if blocked else state.reason
            why += f" ({because})" if because else ""
            if error is not None:
                why += f"; last Nomad error: {error}"
            _stop(client, job_id, why)
            calls += 1
            why += f"; job {job_id!r} stopped"
            return result(state, timed_out=True, stopped=True, stop_reason=why)
        if deadline is not None and now >= deadline:
            return result(state)

        if not wait_s:
            left = remaining()
            sleep(poll_s if left is None else max(0.0, min(poll_s, left)))
        index = new_index


def _least(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _stop(client: _WatchAPI, job_id: str, why: str) -> None:
    try:
        client.stop(job_id)
    except SchedulerError as exc:
        raise SchedulerError(
            f"{why}; stopping job {job_id!r} to release its nodes FAILED: {exc}. "
            f"Stop it by hand (nomad job stop {job_id}) or it keeps holding GPUs."
        ) from exc
