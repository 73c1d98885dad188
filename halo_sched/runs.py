"""One logical run: a job and its retry attempts (``retry:`` in the job file), and what they cost.

A run is named by its first attempt's job id. Each attempt is a submission of its own with a job
record of its own; the record's ``run`` says ``{"id": RUN, "attempt": n, "excluded": [...]}``
(n = 0 for the first). Attempt n runs with ``HALO_RESTART_COUNT=n`` on its ranks (SLURM adds its
own requeues, ``SLURM_RESTART_COUNT``), the same spec, the run's git state as first recorded, and
the hosts every earlier attempt failed on excluded (on top of the node ledger's).

Where the retry happens: in the process that waits on the run (``submit --wait``,
:meth:`Run.wait`). Without one, a failed attempt stays failed (docs/failures.md, "Retry").

Cost: each attempt's node-hours are nodes x wall time, GPU-hours nodes x gpus_per_node x wall
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

#: How a failure class (a record's ``last_state.failure_class``, or a Classification) maps onto
#: the names ``retry.on`` takes.


def retry_kind(cls) -> str | None:
    """``node``, ``preflight`` or ``hang`` for a failure ``retry.on`` can name; None for a job's
    own fault or an unknown one. Read defensively: a HUNG kind (its own class, or a node class
    decided ``by`` a hang) is ``hang``."""
    if cls is None:
        return None
    get = cls.get if isinstance(cls, dict) else (lambda k, d="": getattr(cls, k, d))
    kind = str(get("class", "") or get("kind", "") or "").lower()
    by = str(get("by", "") or "").lower()
    if kind in ("hung", "hang") or by in ("hung", "hang"):
        return "hang"
    if kind != "node":
        return None
    return "preflight" if by == "preflight" else "node"


def wants_retry(spec, state: JobState, attempt: int) -> tuple[bool, str]:
    """Whether attempt ``attempt`` (0-based) ending in ``state`` starts another, and why not/why."""
    policy = spec.retry
    if policy is None or state.status is JobStatus.COMPLETED or not state.status.terminal:
        return False, ""
    cls = state.failure_class()
    kind = retry_kind(cls)
    if kind is None:
        return False, f"not retried: {cls.describe() if cls is not None else 'no failure class'}"
    listed = set(policy.on)
    if not (kind in listed or (kind in ("preflight", "hang") and "node" in listed and cls is not None
                               and getattr(cls, "node", False))):
        return False, f"not retried: {kind} is not in retry.on"
    if attempt + 1 >= policy.attempts:
        return False, f"not retried: all {policy.attempts} attempts used"
    return True, kind


def culprit(state: JobState) -> str:
    cls = state.failure_class()
    host = getattr(cls, "host", "") if cls is not None else ""
    from .ledger import valid_host

    return host if host and valid_host(host) else ""


def _observe(backend: str, job_id: str, state: JobState) -> None:
    """Keep, in the attempt's record, when the waiting process saw it running and ended (the
    fallback clock when the scheduler reports neither)."""
    for rec in records.find(job_id, backend):
        run = rec.get("run")
        if not isinstance(run, dict):
            return
        now = time.time()
        changed = False
        if state.status is JobStatus.RUNNING and "observed_start" not in run:
            run["observed_start"] = now
            changed = True
        if state.status.terminal and "observed_end" not in run:
            run.setdefault("observed_start", now)
            run["observed_end"] = now
            changed = True
        if changed:
            try:
                records.write(rec)
            except OSError:
                pass
        return


def _settle_times(sched: Scheduler, ids: list[str]) -> None:
    """The earlier attempts whose record has the scheduler's start but not its end, asked once
    more as the run ends (Nomad: the wait on a failed attempt returns once the watcher stopped
    the survivors, before their tasks' FinishedAt; by the last attempt's end they have one).
    One query for them all; a scheduler that does not answer leaves the observed times."""
    from .errors import HaloError

    missing = []
    for job_id in ids:
        last = ((records.find(job_id, sched.name) or [{}])[0].get("last_state") or {})
        if isinstance(last.get("started_at"), (int, float)) and not isinstance(last.get("ended_at"), (int, float)):
            missing.append(job_id)
    if not missing:
        return
    try:
        states = sched.query(missing)
    except HaloError:
        return
    from .core import note

    for job_id, st in states.items():
        note(sched.name, job_id, st)


def next_spec(spec, run_id: str, number: int, exclude: tuple[str, ...], git: dict | None):
    """The spec of attempt ``number`` of run ``run_id``: the same spec, keeping off ``exclude``."""
    from .jobfile_rules import Attempt

    nxt = spec.model_copy()
    nxt._job_file = spec._job_file
    nxt._attempt = Attempt(run_id, number, tuple(sorted(set(exclude))), git)
    return nxt


def wait_run(sched: Scheduler, spec, job_id: str, wait: Callable[[str, Callable], JobState],
             on_retry: Callable[[str, JobState, str, str], None] | None = None) -> tuple[str, JobState]:
    """Wait on the run that ``job_id`` (its first attempt) starts; after a failure ``retry.on``
    lists, submit the next attempt and wait on it, until one ends otherwise or the attempts run
    out. ``wait(job_id, observe)`` waits on one attempt, calling ``observe(state)`` on each new
    state. ``on_retry(old_id, state, why, new_id)`` hears of each retry. Returns the last
    attempt's (id, final state)."""
    rec = (records.find(job_id, sched.name) or [{}])[0]
    run_id = (rec.get("run") or {}).get("id") or job_id
    count = number((rec.get("run") or {}).get("attempt"))
    exclude = tuple(h for h in (rec.get("run") or {}).get("excluded") or () if isinstance(h, str))
    git = rec.get("git")
    current = job_id
    earlier: list[str] = []
    while True:
        state = wait(current, lambda st, cur=current: _observe(sched.name, cur, st))
        _observe(sched.name, current, state)
        again, why = wants_retry(spec, state, count)
        if not again:
            _settle_times(sched, earlier)
            return current, state
        earlier.append(current)
        host = culprit(state)
        exclude = exclude + ((host,) if host else ())
        count += 1
        # Nomad: a new version of the same job (its id names the version); SLURM, local: a new
        # job (Scheduler.submit_attempt's default, which is submit).
        nxt = next_spec(spec, run_id, count, exclude, git)
        resubmit = getattr(sched, "submit_attempt", None)
        new = (resubmit(nxt, current) if resubmit is not None else sched.submit(nxt)).id
        if on_retry is not None:
            on_retry(current, state, why, new)
        _notify_retried(sched.name, current, state, why, new, count)
        current = new


def _notify_retried(backend: str, old: str, state: JobState, why: str, new: str, attempt: int) -> None:
    """The ``retried`` event of ``notify:`` (halo_sched/notify.py), once per failed attempt that
    started another: sent by the process that resubmitted, the only one that knows it did."""
    from . import notify

    for rec in records.find(old, backend)[:1]:
        notify.send(rec, "retried", f"attempt {attempt + 1} ({new}) after {why}: {state.describe()}", attempt=attempt)


# ---- a run's attempts and what they cost ------------------------------------------------------


@dataclass
class AttemptRow:
    """One attempt of a run, as ``status RUN`` shows it."""

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
    def node_hours(self) -> float:
        return self.nodes * (self.wall_s or 0.0) / 3600

    @property
    def gpu_hours(self) -> float:
        return self.node_hours * self.gpus_per_node

    def to_dict(self) -> dict:
        return {"attempt": self.number, "id": self.id, "backend": self.backend, "status": self.status,
                "cause": self.cause, "excluded": self.hosts_excluded, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "wall_s": self.wall_s, "clock": self.clock,
                "node_hours": round(self.node_hours, 6), "gpu_hours": round(self.gpu_hours, 6)}


def _when(value) -> float | None:
    """A time of a record (epoch seconds) within [0, 2**34), else None: Infinity, NaN or 1e300
    are no clock's, and would make the hours infinite or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if 0 <= value < 2 ** 34 else None


def _wall(rec: dict) -> tuple[float | None, str]:
    last = rec.get("last_state") or {}
    s, e = _when(last.get("started_at")), _when(last.get("ended_at"))
    if s is not None and e is not None and e >= s:
        return e - s, "scheduler"
    run = rec.get("run") or {}
    s, e = _when(run.get("observed_start")), _when(run.get("observed_end"))
    if s is not None and e is not None and e >= s:
        return e - s, "observed"
    return None, ""


def number(value) -> int:
    """A record's count (attempt, nodes, GPUs) as an int; 0 for anything a hand edit left there
    (10**400 is an int too, and no float can hold its hours)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31 else 0


def row_of(rec: dict) -> AttemptRow:
    last = rec.get("last_state") if isinstance(rec.get("last_state"), dict) else {}
    cls = last.get("failure_class") if isinstance(last.get("failure_class"), dict) else {}
    cause = ""
    if cls.get("class") == "unknown":
        cause = "unknown cause"
    elif cls:
        bits = [b for b in (cls.get("class") and f"{cls.get('class')} fault", cls.get("host") and f"host {cls['host']}",
                            cls.get("reason")) if b]
        cause = ", ".join(bits)
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    servers = spec.get("servers") if isinstance(spec.get("servers"), list) else []
    nodes = number(rec.get("nodes") or spec.get("nodes")) + sum(number(s.get("nodes")) for s in servers
                                                                if isinstance(s, dict))
    gpus = number(spec.get("gpus_per_node"))
    wall, clock = _wall(rec)
    run = rec.get("run") if isinstance(rec.get("run"), dict) else {}
    return AttemptRow(number(run.get("attempt")), rec["id"], rec["backend"], last.get("status") or "UNKNOWN",
                      cause, [h for h in run.get("excluded") if isinstance(h, str)] if isinstance(run.get("excluded"), list) else [], nodes, gpus, wall, clock)


def attempts_of(run_id: str, backend: str | None = None) -> list[AttemptRow]:
    """Every attempt of run ``run_id`` (its first attempt's id), in order, from the job records."""
    rows = [row_of(r) for r in records.load_all(lambda b: None)
            if isinstance(r.get("run"), dict) and r["run"].get("id") == run_id
            and (backend is None or r["backend"] == backend)]
    return sorted(rows, key=lambda a: a.number)


def totals(rows: list[AttemptRow]) -> dict:
    """GPU-hours and node-hours of a run, in total and lost to failed attempts."""
    lost = [a for a in rows if a.status != "COMPLETED"]
    return {"attempts": len(rows),
            "node_hours": round(sum(a.node_hours for a in rows), 6),
            "gpu_hours": round(sum(a.gpu_hours for a in rows), 6),
            "node_hours_lost": round(sum(a.node_hours for a in lost), 6),
            "gpu_hours_lost": round(sum(a.gpu_hours for a in lost), 6)}


def describe_rows(rows: list[AttemptRow]) -> list[str]:
    """``status RUN``'s lines under the run's own: one per attempt, then the totals."""
    out = []
    for a in rows:
        wall = f"{a.wall_s:.0f}s" if a.wall_s is not None else "?"
        extra = f"; excluded {','.join(a.hosts_excluded)}" if a.hosts_excluded else ""
        cause = f" ({a.cause})" if a.cause else ""
        out.append(f"  attempt {a.number + 1}: {a.id} {a.status}{cause}; {a.nodes} nodes x {wall}"
                   f"{' (observed)' if a.clock == 'observed' else ''}: {a.node_hours:.4f} node-h, "
                   f"{a.gpu_hours:.4f} GPU-h{extra}")
    t = totals(rows)
    out.append(f"  run: {t['attempts']} attempts, {t['node_hours']:.4f} node-h ({t['node_hours_lost']:.4f} lost), "
               f"{t['gpu_hours']:.4f} GPU-h ({t['gpu_hours_lost']:.4f} lost to failures)")
    return out


class Run:
    """A logical run in the library: ``Run.submit(spec, backend)`` then ``wait()`` (which
    retries as ``spec.retry`` says); ``attempts()`` and ``totals()`` from the job records."""

    def __init__(self, scheduler: Scheduler, run_id: str, spec=None):
        self.scheduler, self.id, self.spec = scheduler, run_id, spec
        self.current = Job(scheduler, run_id)

    @classmethod
    def submit(cls, spec, backend: str | None = None) -> "Run":
        from . import backends
        from .backends.base import checked_spec

        with checked_spec(spec) as spec:
            sched = backends.get(backend or backends.DEFAULT)
            return cls(sched, sched.submit(spec).id, spec)

    def wait(self, timeout_per_attempt: float | None = None, on_retry=None) -> JobState:
        from .core import noting

        def one(job_id: str, observe) -> JobState:
            def seen(st: JobState) -> None:
                observe(st)

            st = self.scheduler.wait(job_id, timeout=timeout_per_attempt,
                                     on_change=noting(self.scheduler.name, job_id, seen))
            from .core import note

            note(self.scheduler.name, job_id, st)
            return st

        last_id, state = wait_run(self.scheduler, self.spec, self.current.id, one, on_retry)
        self.current = Job(self.scheduler, last_id)
        return state

    def attempts(self) -> list[AttemptRow]:
        return attempts_of(self.id, self.scheduler.name)

    def totals(self) -> dict:
        return totals(self.attempts())


__all__ = ["AttemptRow", "Run", "attempts_of", "describe_rows", "next_spec", "retry_kind", "totals", "wait_run",
           "wants_retry"]
