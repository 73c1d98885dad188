"""One logical run: a job and its retry attempts (``retry:`` in the job file), and what they cost.

A run is named by its first attempt's job id. Each attempt is a submission of its own with a job
record of its own; the record's ``run`` says ``{"id": RUN, "attempt": n, "excluded": [...]}``
(n = 0 for the first). Attempt n runs with ``HALO_RESTART_COUNT=n`` on its ranks (SLURM adds its
own requeues, ``SLURM_RESTART_COUNT``), the same spec, the run's git state as first recorded, and
the hosts every earlier attempt failed on excluded (on top of the node ledger's).

Who starts the next attempt (docs/recovery.md): each backend's one actor, never a client. On
SLURM, the failed attempt itself (its batch script submits the successor from inside the
allocation: halo_sched/node/successor.py), or, when the attempt lost the host its batch script
ran on, the attempt's guardian job (halo_sched/node/guardian.py); locally, the run's keeper
(halo_sched/keeper.py, one detached process per run that ``submit`` starts: it decides each next
attempt and records it before it starts, so that exactly one follows a failure whichever step it
dies at); on Nomad, the keeper task group inside the job (halo_sched/node/nomad_keeper.py: a new
version of the job, exactly once by ``EnforceIndex``; a job without a keeper,
``nomad.keeper: false``, is not retried). Every process that reads a run (``submit --wait``,
``watch``, ``status RUN``, ``list``, :meth:`Run.wait`) only follows the chain from the store's
``successors`` rows, else from where the actor left it (:meth:`Scheduler.successor_of`: SLURM's
marker beside the output file, a Nomad version's Meta), and records what it finds
(:func:`follow`, records.adopt): it submits nothing. One that waits on a local run whose keeper
is gone starts a new keeper (``Scheduler.start_owner``), as Nomad places a lost keeper group
again; the keeper carries the run on from the attempt the dead one decided.

Cost: each attempt's node-hours are nodes (servers, slurm.spare_nodes and nomad.spare_nodes included) x wall time, GPU-hours nodes x gpus_per_node x wall
time; the wall time is the scheduler's own start and end where the backend reports them
(``JobState.started_at``/``ended_at``: local, the supervisor's times; SLURM, StartTime/EndTime;
Nomad, the allocations' task StartedAt/FinishedAt), else the times the waiting
process saw the attempt running and ended (``clock: observed``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from . import records
from .backends.base import Job, JobState, JobStatus, Scheduler
from .errors import HaloError
from .node.failure_classes import RETRIED, Classification
from .node.text import epoch_time

def wants_retry(spec, state: JobState, attempt: int) -> tuple[bool, str]:
    """Whether attempt ``attempt`` (0-based) ending in ``state`` starts another, and why not/why
    (the failure class's ``retry: on:`` word): node/failure_classes.py says which class each
    word retries."""
    policy = spec.retry
    if policy is None or state.status is JobStatus.COMPLETED or not state.status.terminal:
        return False, ""
    cls = state.failure_class()
    if cls is None or cls.failure.retry_on is None:
        return False, f"not retried: {cls.describe() if cls is not None else 'no failure class'}"
    if not cls.failure.retried_by(policy.on):
        return False, f"not retried: {cls.describe()} ({cls.failure.retry_on} is not in retry.on)"
    if attempt + 1 >= policy.attempts:
        return False, f"not retried: all {policy.attempts} attempts used"
    return True, cls.failure.retry_on


def culprit(state: JobState) -> str:
    cls = state.failure_class()
    host = cls.host if cls is not None else ""
    from .ledger import valid_host

    return host if host and valid_host(host) else ""


def _settle_times(sched: Scheduler, ids: list[str]) -> None:
    """The earlier attempts whose record has the scheduler's start but not its end
    (records.unended), asked once more as the run ends (Nomad: the wait on a failed attempt
    returns once the watcher stopped the survivors, before their tasks' FinishedAt; by the last
    attempt's end they have one), and their states kept (records.keep_states). One query for them
    all; a scheduler that does not answer leaves the observed times."""
    missing = records.unended(ids, sched.name)
    if not missing:
        return
    try:
        states = sched.query(missing)
    except HaloError:
        return
    records.keep_states(sched.name, states)


def next_spec(spec, run_id: str, number: int, exclude: tuple[str, ...], git: dict | None):
    """The spec of attempt ``number`` of run ``run_id``: the same spec, keeping off ``exclude``."""
    from .jobfile_rules import Attempt

    nxt = spec.model_copy()
    nxt._job_file = spec._job_file
    nxt._script_base = spec._script_base
    nxt._attempt = Attempt(run_id, number, tuple(sorted(set(exclude))), git)
    return nxt


#: How long a reader waits, after a failed SLURM attempt ended, for the successor its batch script
#: submits (it is written before the script exits, so normally at once; a shared filesystem may lag).
SUCCESSOR_WAIT_S = 30.0


def follow(sched: Scheduler, run_id: str, job_id: str) -> str | None:
    """The attempt that failed attempt ``job_id``'s actor started (a scheduler that
    ``starts_successor``: SLURM's marker, a Nomad keeper's version), recorded in the store once
    found (records.adopt: idempotent, from any number of readers), and its ``retried`` event
    queued by the reader that recorded it; None when it has none (yet)."""
    if not getattr(sched, "starts_successor", False):
        return None
    rec = (records.find(job_id, sched.name, on_bad=None) or [None])[0]
    if rec is None:
        return None
    found = sched.successor_of(rec)
    if found is None:
        return None
    run = rec.get("run") if isinstance(rec.get("run"), dict) else {}
    new = {k: v for k, v in rec.items() if k not in ("last_state", "rendered_file")}
    when = epoch_time(found.get("submitted_at")) or time.time()
    new.update(id=found["job"], submitted=when, submitted_iso=time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(when)),
               run={"id": run_id, "attempt": number(run.get("attempt")) + 1, "excluded": found["excluded"],
                    "submitted_by": job_id},
               **sched.attempt_fields(rec, found["job"]))
    new.pop("guardian", None)
    if found.get("guardian"):  # the new attempt's own guardian (SLURM: node/guardian.py), for cancel and readers
        new["guardian"] = found["guardian"]
    try:
        if records.adopt(new, run_id, job_id):  # first found here: its `retried` event queued (notify:)
            _notify_retried(rec, found.get("retry_on") or "node", found["job"], number(run.get("attempt")) + 1)
    except (OSError, HaloError):
        pass  # the store busy or broken: the chain is still followed, and recorded by a later reader
    return found["job"]


def next_attempt(sched: Scheduler, run_id: str, job_id: str) -> str | None:
    """The attempt after ``job_id``: as the store knows it, else as the failed attempt left it."""
    return records.successor(run_id, sched.name, job_id) or follow(sched, run_id, job_id)


def _being_started(sched: Scheduler, run_id: str, job_id: str) -> bool:
    """Whether ``job_id``'s successor is on its way: decided by the run's live actor and not
    started yet (local: the keeper, records.decide marked it)."""
    return records.being_started(run_id, sched.name, job_id) and not sched.owner_gone(run_id)


#: How often a reader asks whether a failed attempt's guardian still pends or runs (s).
GUARDIAN_POLL_S = 2.0


#: How many times a reader starts a local run's keeper again for one failed attempt (each one
#: killed before it started the next attempt) before it gives the run up.
OWNER_STARTS = 3


def _await_successor(sched: Scheduler, run_id: str, job_id: str, goes_on: bool, poll_s: float) -> str | None:
    """The successor of failed attempt ``job_id`` as its run's actor starts it, or None when none
    came. A failure the run retries (``goes_on``) is waited on for the scheduler's
    ``successor_wait_s`` (:data:`SUCCESSOR_WAIT_S` unless it says otherwise: SLURM's batch script
    writes it before it exits, the local keeper starts it at once, a Nomad keeper settles and
    registers), and on while something outside the attempt may still start it
    (:meth:`Scheduler.guardian_alive`: SLURM's guardian job, pending until the attempt's end is
    known, then running for seconds); any other end is looked at once (a lost SLURM node the
    reader cannot see is its guardian's). When the run's actor is gone (local: the keeper,
    killed; :meth:`Scheduler.owner_gone`), a new one is started (:meth:`Scheduler.start_owner`,
    at most :data:`OWNER_STARTS` times), which starts the attempt: this process starts none."""
    wait_s = getattr(sched, "successor_wait_s", SUCCESSOR_WAIT_S) if goes_on else 0.0
    deadline = time.monotonic() + wait_s
    asked_at, alive, starts = 0.0, True, 0
    while (nxt := next_attempt(sched, run_id, job_id)) is None:
        if goes_on and sched.owner_gone(run_id):
            if starts >= OWNER_STARTS or not sched.start_owner(run_id):
                return next_attempt(sched, run_id, job_id)
            starts += 1
            deadline = time.monotonic() + wait_s
            continue
        now = time.monotonic()
        if now >= deadline:
            if now - asked_at >= GUARDIAN_POLL_S:
                alive, asked_at = sched.guardian_alive(job_id), now
            if not alive:
                return next_attempt(sched, run_id, job_id)
        time.sleep(poll_s)
    return nxt


#: How long a cancel waits for an attempt being started (decided by the run's live actor, not named yet).
STARTING_WAIT_S = 30.0


@dataclass(frozen=True)
class Newest:
    """The newest attempt of the run a job belongs to: what cancelling the run stops."""

    id: str
    #: The attempt's number from 0 (None: the job is no run's attempt, it has no ``retry:``).
    attempt: int | None = None
    run: str | None = None

    def words(self) -> str:
        """``" (attempt 2 of run 100)"``, or nothing for a job of no run."""
        return "" if self.attempt is None else f" (attempt {self.attempt + 1} of run {self.run})"


def newest_attempt(sched: Scheduler, job_id: str, wait_s: float = STARTING_WAIT_S, poll_s: float = 0.2) -> Newest:
    """The newest attempt of the run ``job_id`` (any attempt of it) belongs to, pending or running
    or ended: the chain followed as :func:`next_attempt` knows it (the store, the marker a failed
    SLURM attempt left); an attempt whose successor is being started (decided by the run's live
    keeper, not named yet) is waited on for up to ``wait_s`` seconds, so that a cancel stops the
    attempt about to run rather than the one that failed. A job of no run is itself."""
    rec = (records.find(job_id, sched.name, on_bad=None) or [None])[0]
    run = rec.get("run") if isinstance(rec, dict) and isinstance(rec.get("run"), dict) else None
    if run is None:
        return Newest(job_id)
    run_id = run.get("id") if isinstance(run.get("id"), str) and run.get("id") else job_id
    current, count, seen = job_id, number(run.get("attempt")), {job_id}
    deadline = time.monotonic() + wait_s
    while True:
        nxt = next_attempt(sched, run_id, current)
        if nxt is not None and nxt not in seen:
            seen.add(nxt)
            current, count = nxt, count + 1
            continue
        if nxt is None and time.monotonic() < deadline and _being_started(sched, run_id, current):
            time.sleep(poll_s)
            continue
        return Newest(current, count, run_id)


def newest_attempts(groups: dict[str, list[str]], scheduler: Callable[[str], Scheduler],
                    wait_s: float | None = None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """``groups`` (backend -> ids) with each attempt of a run replaced by the run's newest attempt
    (runs.newest_attempt: pending or running; one being started waited for up to ``wait_s``,
    default runs.STARTING_WAIT_S), each once; and, for those, which attempt of which run each is
    in words (" (attempt 2 of run 100)"). An id without a record is left as it is."""
    out: dict[str, list[str]] = {}
    words: dict[str, str] = {}
    for backend, ids in groups.items():
        sched = None
        for job_id in ids:
            if records.exists(job_id, backend):
                sched = sched or scheduler(backend)
                newest = newest_attempt(sched, job_id, STARTING_WAIT_S if wait_s is None else wait_s)
                job_id = newest.id
                if newest.words():
                    words[job_id] = newest.words()
            if job_id not in out.setdefault(backend, []):
                out[backend].append(job_id)
    return out, words


def follow_run(sched: Scheduler, run_id: str) -> list[str]:
    """Every attempt of run ``run_id`` (a read: ``status RUN``, ``list``), each one found on the
    scheduler recorded, and the state of those not known to have ended asked once and kept."""
    ids = [run_id]
    while (nxt := next_attempt(sched, run_id, ids[-1])) is not None and nxt not in ids:
        ids.append(nxt)
    open_ids = [i for i in ids[1:] if not _ended(sched.name, i)]
    if open_ids:
        from .core import note

        try:
            states = sched.query(open_ids)
        except HaloError:
            states = {}
        for job_id, st in states.items():
            note(sched.name, job_id, st, sched)
    return ids


def _ended(backend: str, job_id: str) -> bool:
    last = (records.find(job_id, backend, on_bad=None) or [{}])[0].get("last_state") or {}
    try:
        return JobStatus(last.get("status")).terminal
    except ValueError:
        return False


def wait_run(sched: Scheduler, spec, job_id: str, wait: Callable[[str], JobState],
             on_retry: Callable[[str, JobState, str, str], None] | None = None,
             on_follow: Callable[[str, str], None] | None = None, poll_s: float = 0.5) -> tuple[str, JobState]:
    """Wait on the run that ``job_id`` (an attempt of it) belongs to, from its newest attempt,
    and on each next attempt its actor starts, until one ends and none follows. A read: the
    next attempt is its actor's (SLURM: the failed attempt's batch script or its guardian; local:
    the run's keeper, halo_sched/keeper.py; Nomad: the keeper task group of the job), waited for
    as long as that actor may still start it (:func:`_await_successor`) and followed; this
    process submits nothing, and records what it finds (:func:`next_attempt`). ``wait(job_id)``
    waits on one attempt (keeping each state it sees as an actor does: core.note) and returns
    its last state. ``on_retry(old_id, state, why, new_id)`` hears of each next attempt started
    after a failure this process waited on, ``on_follow(old_id, new_id)`` of each it found
    started before it came. Returns the last attempt's (id, final state)."""
    run_id, count = records.position(job_id, sched.name)
    current = job_id
    earlier: list[str] = []
    while True:
        while (nxt := next_attempt(sched, run_id, current)) is not None:
            earlier.append(current)
            if on_follow is not None:
                on_follow(current, nxt)
            current, count = nxt, count + 1
        state = wait(current)
        if state.status is JobStatus.COMPLETED or not state.status.terminal:
            break
        again, why = wants_retry(spec, state, count)
        nxt = _await_successor(sched, run_id, current, again, poll_s)
        if nxt is None:
            break
        if on_retry is not None:  # the retry this process saw happen: its actor started it
            on_retry(current, state, why or _retry_word(state), nxt)
        earlier.append(current)
        current, count = nxt, count + 1
    _settle_times(sched, earlier)
    return current, state


def _retry_word(state: JobState) -> str:
    """The ``retry.on`` word of a failure that this process would not retry and the run's actor
    did (a lost SLURM node it cannot see from here): its failure class's, else ``node``."""
    cls = state.failure_class()
    return cls.failure.retry_on if cls is not None and cls.failure.retry_on else "node"


def _notify_retried(rec: dict, why: str, new: str, attempt: int) -> None:
    """The ``retried`` event of ``notify:`` (halo_sched/notify.py) for the failed attempt of
    ``rec``, followed by attempt ``attempt`` (0-based) ``new``: queued once per job and event by
    whoever recorded the new attempt first (the local keeper that started it, a reader that found
    it), delivered by an actor."""
    from . import notify

    last = rec.get("last_state") if isinstance(rec.get("last_state"), dict) else {}
    said = last.get("describe") if isinstance(last.get("describe"), str) else "ended"
    notify.send(rec, RETRIED, f"attempt {attempt + 1} ({new}) after {why}: {said}", attempt=attempt, start=False)


# ---- a run's attempts and what they cost ------------------------------------------------------


@dataclass
class AttemptRow:
    """One attempt of a run, as ``status RUN`` shows it: ``number`` counts from 1 ("attempt 1"
    is the first); the record keeps it from 0 (``index``, and ``"attempt"`` in ``to_dict``, the
    shape of ``status --json``)."""

    number: int
    id: str
    backend: str
    status: str
    cause: str
    hosts_excluded: list
    nodes: int
    gpus_per_node: int
    wall_s: float | None
    clock: str  # "scheduler" or "observed" (or "" without times)

    @property
    def index(self) -> int:
        """The attempt's 0-based number, as its record and ``HALO_RESTART_COUNT`` hold it."""
        return self.number - 1

    @property
    def node_hours(self) -> float:
        return self.nodes * (self.wall_s or 0.0) / 3600

    @property
    def gpu_hours(self) -> float:
        return self.node_hours * self.gpus_per_node

    def to_dict(self) -> dict:
        return {"attempt": self.index, "id": self.id, "backend": self.backend, "status": self.status,
                "cause": self.cause, "excluded": self.hosts_excluded, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "wall_s": self.wall_s, "clock": self.clock,
                "node_hours": round(self.node_hours, 6), "gpu_hours": round(self.gpu_hours, 6)}




def _wall(rec: dict) -> tuple[float | None, str]:
    last = rec.get("last_state") or {}
    s, e = epoch_time(last.get("started_at")), epoch_time(last.get("ended_at"))
    if s is not None and e is not None and e >= s:
        return e - s, "scheduler"
    run = rec.get("run") or {}
    s, e = epoch_time(run.get("observed_start")), epoch_time(run.get("observed_end"))
    if s is not None and e is not None and e >= s:
        return e - s, "observed"
    return None, ""


def number(value) -> int:
    """A record's count (attempt, nodes, GPUs) as an int; 0 for anything a hand edit left there
    (10**400 is an int too, and no float can hold its hours)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31 else 0


def row_of(rec: dict) -> AttemptRow:
    last = rec.get("last_state") if isinstance(rec.get("last_state"), dict) else {}
    cls = Classification.from_dict(last.get("failure_class"))
    cause = cls.describe() if cls is not None else ""
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    servers = spec.get("servers") if isinstance(spec.get("servers"), list) else []
    nodes = number(rec.get("nodes") or spec.get("nodes")) + sum(number(s.get("nodes")) for s in servers
                                                                if isinstance(s, dict))
    # Hot spares are held the whole time, idle or not: their hours are the run's too (SLURM's in the
    # allocation, Nomad's allocations of the trainer's group).
    slurm = spec.get("slurm") if isinstance(spec.get("slurm"), dict) else {}
    nomad = spec.get("nomad") if isinstance(spec.get("nomad"), dict) else {}
    nodes += number(slurm.get("spare_nodes")) + number(nomad.get("spare_nodes"))
    gpus = number(spec.get("gpus_per_node"))
    wall, clock = _wall(rec)
    run = rec.get("run") if isinstance(rec.get("run"), dict) else {}
    return AttemptRow(number(run.get("attempt")) + 1, rec["id"], rec["backend"], last.get("status") or "UNKNOWN",
                      cause, [h for h in run.get("excluded") if isinstance(h, str)] if isinstance(run.get("excluded"), list) else [], nodes, gpus, wall, clock)


def attempts_of(run_id: str, backend: str | None = None) -> list[AttemptRow]:
    """Every attempt of run ``run_id`` (its first attempt's id), in order, from the job records."""
    rows = [row_of(r) for r in records.of_run(run_id, backend)
            if isinstance(r.get("run"), dict) and r["run"].get("id") == run_id]
    return sorted(rows, key=lambda a: a.number)


def totals(rows: list[AttemptRow], effective: dict | None = None) -> dict:
    """GPU-hours and node-hours of a run, in total and lost to failed attempts; with
    ``effective`` (halo_sched/ettr.py ``of_run``), its effective training time too: ``ettr``
    (0..1, None without progress reports), ``lost_s`` by cause, ``span_s``, ``held_s``,
    ``train_s``, ``failures`` and, where the trainer reports its checkpoints, ``checkpoint``."""
    lost = [a for a in rows if a.status != "COMPLETED"]
    return {"attempts": len(rows),
            "node_hours": round(sum(a.node_hours for a in rows), 6),
            "gpu_hours": round(sum(a.gpu_hours for a in rows), 6),
            "node_hours_lost": round(sum(a.node_hours for a in lost), 6),
            "gpu_hours_lost": round(sum(a.gpu_hours for a in lost), 6),
            **(effective or {})}


def effective(run_id: str, backend: str | None) -> dict | None:
    """The run's effective training time, measured from its records and files (halo_sched/ettr.py)."""
    from . import ettr

    return ettr.of_run(run_id, backend)


def describe_rows(rows: list[AttemptRow], effective: dict | None = None) -> list[str]:
    """``status RUN``'s lines under the run's own: one per attempt, then the totals (and the
    effective training time, where measured)."""
    out = []
    for a in rows:
        wall = f"{a.wall_s:.0f}s" if a.wall_s is not None else "?"
        extra = f"; excluded {','.join(a.hosts_excluded)}" if a.hosts_excluded else ""
        cause = f" ({a.cause})" if a.cause else ""
        out.append(f"  attempt {a.number}: {a.id} {a.status}{cause}; {a.nodes} nodes x {wall}"
                   f"{' (observed)' if a.clock == 'observed' else ''}: {a.node_hours:.4f} node-h, "
                   f"{a.gpu_hours:.4f} GPU-h{extra}")
    t = totals(rows)
    out.append(f"  run: {t['attempts']} attempts, {t['node_hours']:.4f} node-h ({t['node_hours_lost']:.4f} lost), "
               f"{t['gpu_hours']:.4f} GPU-h ({t['gpu_hours_lost']:.4f} lost to failures)")
    from .ettr import describe

    out += [f"  {line}" for line in describe(effective)]
    return out


class Run(Job):
    """A logical run: a job and the attempts ``retry:`` starts after it. What
    :func:`halo_sched.submit` returns and :func:`halo_sched.run` finds again by id.

    ``id`` is the run's (its first attempt's job id); ``current`` the newest attempt, on which
    ``status()``, ``done()``, ``cancel()`` and ``logs()`` act. ``wait()`` is ``submit --wait``'s:
    it waits through a scheduler outage, keeps each state in the job records (the node ledger
    and ``notify:`` hear of it there), and after a failure follows the next attempt the run's
    actor starts (it submits none: :func:`wait_run`) until one ends and none follows. ``result()`` raises for a run that did not complete (Job.result)."""

    def __init__(self, scheduler: Scheduler, run_id: str, spec=None, current: str | None = None,
                 submitted: bool = False):
        super().__init__(scheduler, run_id)
        self.spec = spec
        self.current = Job(scheduler, current or run_id)
        # The attempts this process submitted: their wait starts with the backend's placement
        # guard (Nomad), as ``submit --wait``'s does.
        self._submitted_here = {self.current.id} if submitted else set()

    @classmethod
    def submit(cls, spec, backend: str | None = None) -> "Run":
        """Submit ``spec`` (a JobSpec) as a new run: :func:`halo_sched.submit` with a spec."""
        from . import backends
        from .backends.base import checked_spec

        with checked_spec(spec) as spec:
            sched = backends.get(backend or backends.default())
            return cls(sched, sched.submit(spec).id, spec, submitted=True)

    def _newest(self) -> Job:
        """The newest attempt (the run's actor may have started another since)."""
        current = self.current.id
        while (nxt := next_attempt(self.scheduler, self.id, current)) is not None:
            current = nxt
        if current != self.current.id:
            self.current = Job(self.scheduler, current)
        return self.current

    def status(self) -> JobState:
        """The newest attempt's state (:meth:`Job.status`)."""
        return self._newest().status()

    def wait(self, timeout: float | None = None, poll: float = 1.0, max_poll: float = 30.0,
             on_change=None, outage_s: float | None = None, on_outage=None, *, on_retry=None,
             timeout_per_attempt: float | None = None) -> JobState:
        """Until the run ends: its last attempt's final state (or, past ``timeout`` seconds in
        all or ``timeout_per_attempt`` on one attempt, the current attempt's state so far).
        ``on_retry(old_id, state, why, new_id)`` hears of each next attempt the run's actor
        started after a failure this call waited on;
        ``on_change(state)`` of each new state of each attempt; the rest as :meth:`Job.wait`
        (``poll``/``max_poll`` for an attempt this call did not submit: one it did is waited on
        as ``submit --wait`` waits)."""
        from .core import note, noting, wait_after_submit

        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            bounds = [b for b in (timeout_per_attempt, None if deadline is None else max(0.0, deadline - time.monotonic()))
                      if b is not None]
            return min(bounds) if bounds else None

        def one(job_id: str) -> JobState:
            if job_id in self._submitted_here:  # just submitted: the backend's guard first
                st = wait_after_submit(self.scheduler, self.spec, job_id, timeout=left(), on_change=on_change,
                                       outage_s=outage_s)
            else:
                st = self.scheduler.wait(job_id, timeout=left(), poll=poll, max_poll=max_poll,
                                         on_change=noting(self.scheduler.name, job_id, on_change, self.scheduler),
                                         outage_s=outage_s, on_outage=on_outage)
                note(self.scheduler.name, job_id, st, self.scheduler)
            return st

        def retried(old: str, state: JobState, why: str, new: str) -> None:
            self._submitted_here.add(new)
            if on_retry is not None:
                on_retry(old, state, why, new)

        spec = self.spec if self.spec is not None else recorded_spec(self.scheduler.name, self.id)
        if spec is None or getattr(spec, "retry", None) is None:  # one attempt: no run to follow
            last_id, state = self._newest().id, one(self._newest().id)
        else:
            self.spec = spec
            last_id, state = wait_run(self.scheduler, spec, self._newest().id, one, retried)
        self.current = Job(self.scheduler, last_id)
        return self._known(state)

    async def wait_async(self, timeout: float | None = None) -> JobState:
        """:meth:`wait` for asyncio, holding no thread while an attempt runs: each attempt is
        awaited on the shared watcher (halo_sched/backends/watcher.py); what follows an attempt's end
        (keeping its state, following the next attempt) runs once in the loop's executor."""
        import asyncio

        from .backends.watcher import wait_async

        deadline = None if timeout is None else time.monotonic() + timeout
        loop = asyncio.get_running_loop()
        while True:
            current = self._newest().id
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            state = self._known(await wait_async(self.scheduler, current, left))
            if not state.status.terminal:
                return state  # timeout: the state so far
            self._submitted_here.discard(current)  # its end is known: no placement guard now

            def after(ended: JobState = state, cur: str = current) -> JobState:
                one_shot = {cur: ended}

                def known(job_id: str) -> JobState:
                    if job_id in one_shot:
                        st = one_shot.pop(job_id)
                    else:  # the next attempt, just started: its state now, awaited above
                        st = self.scheduler.query([job_id])[job_id]
                    from .core import note

                    note(self.scheduler.name, job_id, st, self.scheduler)
                    return st

                spec = self.spec if self.spec is not None else recorded_spec(self.scheduler.name, self.id)
                if spec is None or getattr(spec, "retry", None) is None:
                    return known(cur)
                self.spec = spec
                last, st = wait_run(self.scheduler, spec, cur, known)
                self.current = Job(self.scheduler, last)
                return st

            final = await loop.run_in_executor(None, after)
            if final.status.terminal or final.status is JobStatus.UNKNOWN:
                return self._known(final)

    def cancel(self, wait: bool = True, timeout: float | None = 60.0, **opts) -> JobState | None:
        """Cancel the run's newest attempt, pending or running (:func:`newest_attempt`: one being
        started is waited for; :meth:`Job.cancel`): a cancelled attempt is not retried."""
        self.current = Job(self.scheduler, newest_attempt(self.scheduler, self.current.id).id)
        return self.current.cancel(wait=wait, timeout=timeout, **opts)

    def logs(self, node: int | None = None, rank: int | None = None, follow: bool = False, *,
             since=None, grep: str | None = None, stream: str | None = None):
        """The newest attempt's output, filtered as :meth:`Job.logs` filters it."""
        return self._newest().logs(node=node, rank=rank, follow=follow, since=since, grep=grep, stream=stream)

    def describe(self) -> dict:
        """The record of the run's newest attempt (:meth:`Job.describe`); ``attempts()`` has them all."""
        return self._newest().describe()

    def attempts(self) -> list[AttemptRow]:
        """Every attempt so far, numbered as the CLI shows them (``number``: 1 for the first);
        a job without ``retry:`` is a run of one attempt."""
        rows = attempts_of(self.id, self.scheduler.name)
        if not rows:
            rows = [row_of(r) for r in records.find(self.id, self.scheduler.name)[:1]]
        return rows

    def totals(self) -> dict:
        """:func:`totals` of :meth:`attempts`, with the run's effective training time
        (``ettr``, ``lost_s`` by cause: halo_sched/ettr.py)."""
        return totals(self.attempts(), effective(self.id, self.scheduler.name))


def as_completed(handles, timeout: float | None = None):
    """Each handle (a :class:`Run` or :class:`~halo_sched.backends.base.Job`) as it ends, in the
    order they end (``concurrent.futures.as_completed``'s, submitit's ``as_completed``): a run
    ends when its last attempt did (its retries run meanwhile, as :meth:`Run.wait` runs them).
    Its outcome is then at hand without waiting: ``result()`` returns or raises, ``exception()``
    says which. Past ``timeout`` seconds (all of them together) with handles left, raises
    :class:`~halo_sched.errors.StillRunning` (a TimeoutError) for the first of them; they go on.
    A handle whose wait raised (an unknown id, an outcome unknown) ends here too: its
    ``exception()`` asks again. Each waits in a thread of its own, every one of a scheduler on
    its one shared poll (backends/watcher.py)."""
    import queue
    import threading

    from .errors import StillRunning

    todo = list({id(h): h for h in handles}.values())
    deadline = None if timeout is None else time.monotonic() + timeout
    done: queue.Queue = queue.Queue()

    def wait(h) -> None:
        state = None
        try:
            state = h.wait(timeout)  # ends at the deadline at the latest: the state so far
        except BaseException:  # noqa: BLE001 - the handle's own result()/exception() tells it
            pass
        done.put((h, state))

    for h in todo:
        threading.Thread(target=wait, args=(h,), name=f"as-completed-{h.id}", daemon=True).start()
    left = {id(h): h for h in todo}
    while left:
        try:  # a second past the deadline: the waits that ran out have said so
            h, state = done.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()) + 1.0)
        except queue.Empty:
            break
        if state is not None and not state.status.terminal:
            continue  # its wait ran out: still running
        del left[id(h)]
        yield h
    if left:
        first = next(iter(left.values()))
        try:
            state = first.status()
        except HaloError:
            state = JobState(first.id, JobStatus.UNKNOWN)
        raise StillRunning(first.id, state, timeout, others=len(left) - 1)


# ---- the listing: recent jobs, each run's attempts followed ------------------------------------


def listing(backend: str | None, state: str | None, limit: int, scheduler: Callable[[str], Scheduler],
            on_error: Callable[[str, HaloError], None], name: str | None = None, run: str | None = None,
            since: float | None = None):
    """``halo-sched list`` and ``halo_sched.list()``: the rows of the newest ``limit`` records (0:
    all) matching the filters, a batch at a time (core.recent_batches: one scheduler query per
    backend per batch), each run's attempts followed: an attempt a failed attempt submitted
    itself (``starts_successor``) and the store did not know yet is recorded and listed with the
    batch it was found in, newest first. A generator: close it to stop early."""
    from .core import recent_batches

    def batches():
        return recent_batches(backend, state, limit, scheduler, on_error, name=name, run=run, since=since)

    it = batches()
    try:
        first = next(it, [])
        if _followed(first, scheduler):  # attempts a failed attempt submitted itself, recorded now: read again
            it.close()
            it = batches()
            first = next(it, [])
        yield first
        for rows in it:
            found = _followed(rows, scheduler)
            if found:  # later than this batch's snapshot: shown with it, newest first
                rows = sorted(rows + _rows_of_found(found, state, scheduler, on_error), key=_submitted, reverse=True)
            yield rows
    finally:
        it.close()


def _submitted(row) -> float:
    r = row.record
    when = r.mtime if not isinstance(r, dict) else r.get("submitted")
    return float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else 0.0


def _rows_of_found(found: list[tuple[str, str]], state: str | None, scheduler, on_error) -> list:
    from .core import rows_of

    recs = [r for backend, job in found for r in records.find(job, backend, on_bad=None)]
    return rows_of(recs, state, scheduler, on_error) if recs else []


def _followed(rows, scheduler) -> list[tuple[str, str]]:
    """The attempts (backend, id) found now and recorded: for each attempt of a run that ended
    other than COMPLETED, on a scheduler whose failed attempts submit their successor
    (``starts_successor``), the successor the store did not know yet."""
    found = []
    for r, status, _, _ in rows:
        of_run = r.get("run") if isinstance(r, dict) else None
        if not isinstance(of_run, dict) or not isinstance(of_run.get("id"), str) or status in ("COMPLETED", "UNREADABLE"):
            continue
        try:
            if not JobStatus(status).terminal:
                continue
            sched = scheduler(r["backend"])
            if getattr(sched, "starts_successor", False) and records.successor(of_run["id"], r["backend"], r["id"]) is None:
                job = follow(sched, of_run["id"], r["id"])
                if job is not None:
                    found.append((r["backend"], job))
        except (ValueError, HaloError, OSError):
            continue
    return found


def list_jobs(backend: str | None = None, state: str | None = None, limit: int = 50, name: str | None = None,
              run: str | None = None, since=None) -> list:
    """``halo_sched.list()``: the recent jobs as ``halo-sched list`` finds them (:func:`listing`,
    the same filters with the same checks), newest first, each a :class:`~halo_sched.core.JobRow`
    (a value: ``to_dict()`` is what ``list --json`` prints). ``state``: a state's name (``"FAILED"``,
    a ``JobStatus``; ``"UNREADABLE"``: records that cannot be read); ``limit``: the newest N
    records (0: all); ``since``: an age (``"12h"``), an ISO date/time, a ``datetime``, a
    ``timedelta`` or epoch seconds. A backend that does not answer leaves its jobs' last known
    states (``live`` False), and says so on the ``halo_sched`` logger. Bad input: UsageError."""
    from . import backends
    from .core import JobRow, check_listing

    backend, state, limit, since = check_listing(backend, state, limit, since)
    import logging

    def on_error(name_: str, err: HaloError) -> None:
        logging.getLogger("halo_sched").warning("%s did not answer (%s); its jobs show their last known state",
                                                name_, " ".join(str(err).split())[:200])

    it = listing(backend, state, limit, backends.get, on_error, name=name, run=run, since=since)
    try:
        return [JobRow.of(row) for rows in it for row in rows]
    finally:
        it.close()


def recorded_spec(backend: str, job_id: str):
    """The spec a job was submitted with, from its record (None without one): a run found by id
    retries as its job file says, as ``watch`` does."""
    rec = (records.find(job_id, backend) or [{}])[0]
    data = rec.get("spec")
    if not isinstance(data, dict):
        return None
    from .spec import from_record

    return from_record(rec)


__all__ = ["AttemptRow", "Newest", "Run", "as_completed", "attempts_of", "describe_rows", "effective", "follow", "follow_run",
           "list_jobs", "listing", "newest_attempt", "newest_attempts", "next_attempt", "next_spec", "recorded_spec", "totals",
           "wait_run", "wants_retry"]
