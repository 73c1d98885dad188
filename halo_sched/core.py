"""The orchestration the commands share with the library, once: which backend a job id went to,
which ids nobody knows, waiting after a submit, and keeping each state the scheduler reports in
the job's record (``status``, ``list``).

Reading is not acting. What a read (``status``, ``list``, ``Job.status()``) learns it records,
idempotently, in the history store (:func:`keep_seen`): the state, a node fault's host in the
node ledger, a notification queued in the outbox, each in one transaction. It never submits and
never delivers a notification. Delivering (:func:`note`) belongs to the actors: the processes
that wait on a job (``submit --wait``, ``watch``, ``Run.wait``), and ``halo-sched notify`` for a
job nobody waits on. The CLI (cli.py parses arguments; commands/ holds the commands) calls these and
prints; the submit sequence itself is :meth:`halo_sched.backends.base.Scheduler.submit`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from . import backends, records
from .backends.base import JobState, JobStatus, Scheduler
from .errors import HaloError, UsageError, shown
# Which ids nobody knows, cancelling the known ones, a job's size: in known.py, which the job
# handles (backends/base.py) use too; named here for the commands.
from .known import (_MAY_RETURN, cancel_known, check_node_rank, ended_by_record, job_size,  # noqa: F401
                    unknown, unknown_asked)

#: The longest job id accepted (the longest real one, a Nomad [REGION:][NAMESPACE/]ID, is far shorter).
MAX_ID_CHARS = 256


def check_id(job_id: str) -> None:
    """An id no scheduler could have issued is bad input before anything is asked."""
    if not job_id:
        raise UsageError("a job id is empty")
    if len(job_id) > MAX_ID_CHARS:
        raise UsageError(f"job id {shown(job_id)} is too long ({len(job_id)} characters; at most {MAX_ID_CHARS})")
    if any(c.isspace() or not c.isprintable() for c in job_id):
        raise UsageError(f"job id {shown(job_id)} contains whitespace or control characters")


def known_backend(name: str) -> bool:
    return name in backends.BUILTIN or name in backends.names()


def backends_of(ids: Iterable[str], backend: str | None) -> dict[str, list[str]]:
    """backend -> ids. An explicit ``backend`` wins; else the id's record; else the default."""
    ids = list(ids)
    for job_id in ids:
        check_id(job_id)
    if backend:
        return {backend: ids}
    out: dict[str, list[str]] = {}
    for job_id in ids:
        bad: list = []

        def on_bad(b) -> None:  # an unreadable record still says, by its name, where the job went
            records.warn_bad(b)
            bad.append(b)

        found = sorted({r["backend"] for r in records.find(job_id, on_bad=on_bad)}
                       | {b.backend for b in bad if known_backend(b.backend)})
        if len(found) > 1:
            raise UsageError(f"job id {shown(job_id)} has records for backends {', '.join(found)}; give --backend")
        out.setdefault(found[0] if found else backends.default(), []).append(job_id)
    return out


def backend_of(job_id: str, backend: str | None) -> str:
    return next(iter(backends_of([job_id], backend)))


def warning_of(job_id: str) -> str | None:
    """The warning signal of a SLURM job from its record (``slurm.signal``'s, USR2 when unset),
    None without a record."""
    from .values import DEFAULT_WARNING, parse_warning

    for rec in records.find(job_id, "slurm"):
        own = ((rec.get("spec") or {}).get("slurm") or {}).get("signal")
        return (parse_warning(own) or DEFAULT_WARNING)[1]
    return None


# ---- states kept in the records -----------------------------------------------------------------


def keep_state(rec: dict, state: JobState, observed: bool = False) -> None:
    """Keep ``state`` in the job's record ``rec`` (``observed``: as a process waiting on it saw it
    now, records.update_state); a node's fault also goes into the node ledger
    (halo_sched/ledger.py: once per job and host), so new jobs avoid that host, and the event of
    a job whose file asks for ``notify:`` is queued in the outbox (once per job and event). All
    of it recording: nothing is submitted and nothing is sent from here."""
    if state.spares and state.spares.get("swaps"):  # what each swap cost, from the ranks' progress
        from .backends.slurm.spares import with_costs

        state.spares["swaps"] = with_costs(state.spares["swaps"], _progress_firsts(rec))
    try:
        records.update_state(rec, state, observed)
    except (OSError, HaloError) as err:  # the store busy or broken: this command still reports the state
        from .errors import debug

        if debug():
            import sys

            print(f"halo-sched: warning: the record of {shown(rec.get('id'))} was not updated: {err}", file=sys.stderr)
    cls = state.failure_class()
    if cls is not None and (cls.node or cls.said):  # a rank's word alone counts only when repeated (ledger.py)
        from . import ledger

        ledger.observe(rec.get("id") or "", rec.get("backend") or "", cls)
    if state.spares and state.spares.get("swaps"):  # hosts a spare replaced (slurm.spare_nodes)
        from . import ledger

        ledger.observe_swaps(rec.get("id") or "", rec.get("backend") or "", state.spares["swaps"])
    spec = rec.get("spec")
    if isinstance(spec, dict) and spec.get("notify"):  # a webhook to tell (halo_sched/notify.py: once per event)
        from . import notify

        notify.observe(rec, state)


def _progress_firsts(rec: dict):
    """``(lo, hi) -> [each node rank's first progress report in [lo, hi), or None]`` of the job of
    ``rec``, from its ranks' progress copies as the effective training time reads them (ettr.py:
    bounded, read once here)."""
    from . import ettr

    root = ettr.progress_root(rec)
    nodes = [[s for p in files if (s := ettr.source(p)) is not None] for files in (ettr._rank_files(root)[0] if root else [])]
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    want = min(ettr._count(rec.get("nodes") or spec.get("nodes")), ettr.MAX_NODES)
    if len(nodes) < want:  # a node rank that never reports: when every one trains again is not known
        return lambda lo, hi: [None]
    return lambda lo, hi: [min((p[0] for s in srcs if (p := s.first_where(lo, hi)) is not None), default=None)
                           for srcs in nodes]


def keep_seen(backend: str, job_id: str, state: JobState, sched: Scheduler | None = None,
              observed: bool = False) -> dict | None:
    """What a read does with a state it saw: keep it in the job's record (when the scheduler
    knows it), a node's fault in the node ledger, its notification in the outbox
    (:func:`keep_state`; ``observed``: seen by a process waiting on it); for an end, rank 0's
    result on ``state`` and in the record (outcome.attach_value, asked of ``sched``, else of the
    backend by its name); return the record."""
    for rec in records.find(job_id, backend):
        keep_state(rec, state, observed)
        if state.status.terminal:
            from .outcome import attach_value

            attach_value(sched if sched is not None else backends.get(backend), job_id, state, keep=True)
        return rec
    return None


def note(backend: str, job_id: str, state: JobState, sched: Scheduler | None = None) -> dict | None:
    """What an actor (a process waiting on the job) does with a state it saw: :func:`keep_seen`,
    as observed now (an attempt of a run keeps when it was seen running and ended: the fallback
    clock of its hours), then start the delivery of the notifications queued
    (halo_sched/notify.py: a detached process, never waited for); return the record. Reads use
    :func:`keep_seen` alone."""
    rec = keep_seen(backend, job_id, state, sched, observed=True)
    spec = (rec or {}).get("spec")
    if isinstance(spec, dict) and spec.get("notify"):
        from . import notify

        notify.start_delivery()
    return rec


class Fallback(NamedTuple):
    """A job ``status`` could not ask about (the scheduler unreachable): its record's last known
    state (``last``: status, describe, at; None without a record) and why it was not asked."""

    id: str
    last: dict | None
    why: str

    @property
    def final(self) -> bool:
        """The last known state is an end: nothing the scheduler says later can change it."""
        return bool(self.last) and JobStatus(self.last.get("status", "UNKNOWN")).terminal

    def describe(self, backend: str) -> str:
        from .outage import clock_text, display_name

        who = display_name(backend)
        if not self.last:
            return f"UNKNOWN: {who} unreachable and no job record to fall back on"
        at = self.last.get("at")
        when = f" at {clock_text(at)}" if isinstance(at, (int, float)) else ""
        return f"last known {self.last.get('describe') or self.last.get('status')}{when}; {who} unreachable"


def query_or_last(backend: str, sched: Scheduler, ids: Sequence[str],
                  bound_s: float | None = None) -> tuple[dict[str, JobState], dict[str, Fallback]]:
    """``status``: :func:`query_and_note` within ``bound_s`` seconds (default
    ``halo_sched.outage.ASK_BOUND_S``); when the scheduler cannot be reached, each id's last
    known state from its record instead, labelled as such (``Fallback``); with no last known
    state for any of them, the scheduler's error."""
    from .outage import ASK_BOUND_S, is_outage
    from .retry import within

    try:
        with within(ASK_BOUND_S if bound_s is None else bound_s):
            return query_and_note(backend, sched, ids), {}
    except HaloError as err:
        if not is_outage(err):
            raise
        why = str(err)
        out = {}
        for job_id in dict.fromkeys(ids):
            rec = (records.find(job_id, backend) or [None])[0]
            out[job_id] = Fallback(job_id, (rec or {}).get("last_state") or None, why)
        if not any(fb.last for fb in out.values()):
            raise  # nothing to fall back on: the scheduler could not be reached (exit 1)
    return {}, out


def query_and_note(backend: str, sched: Scheduler, ids: Sequence[str]) -> dict[str, JobState]:
    """One query for ``ids``; each state the scheduler knows is kept in the job's record, and a
    job the scheduler forgot carries the record's last known state (``last_known``)."""
    states = sched.query(ids)
    for job_id, st in states.items():
        rec = keep_seen(backend, job_id, st, sched)
        last = (rec or {}).get("last_state")
        if st.status is JobStatus.UNKNOWN and last:
            st.last_known = last
    return states


class Row(NamedTuple):
    """One line of ``list``: the record (or the unreadable record file), its status and text,
    and whether the scheduler said so now (``live``) or the record kept it."""

    record: dict | records.BadRecord
    status: str
    text: str
    live: bool


@dataclass(frozen=True)
class JobRow:
    """One job as ``halo-sched list`` finds it, as a value: what ``halo_sched.list()`` returns and
    ``list --json`` prints (:meth:`to_dict`). ``status`` is a :class:`JobStatus`'s name (or
    ``UNREADABLE``: ``error`` says why the record cannot be used); ``describe`` the state in
    words; ``live`` whether the scheduler said it now (else the record's last known state);
    ``value`` rank 0's result where its record keeps one (halo_sched/node/result.py)."""

    id: str
    backend: str
    name: str | None
    status: str
    describe: str
    live: bool
    submitted: str | None = None
    run: dict | None = None
    submit_dir: str | None = None
    record: str = ""
    value: object = None
    value_note: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, row: Row) -> "JobRow":
        r = row.record
        if isinstance(r, records.BadRecord):
            return cls(r.id, r.backend, None, row.status, row.text, False, record=str(r.path), error=r.reason)
        kept = r.get("result") if isinstance(r.get("result"), dict) else {}
        note = kept.get("note") if isinstance(kept.get("note"), str) else None
        return cls(r["id"], r["backend"], r.get("name"), row.status, row.text, row.live, r.get("submitted_iso"),
                   r["run"] if isinstance(r.get("run"), dict) else None, r.get("submit_dir"),
                   records.ref(r["id"], r["backend"]), kept.get("value") if note is not None else None, note)

    def to_dict(self) -> dict:
        """``list --json``'s object: every field but those a row does not have."""
        if self.error is not None:
            return {"id": self.id, "backend": self.backend, "status": self.status, "describe": self.describe,
                    "live": False, "record": self.record, "error": self.error}
        return {"id": self.id, "backend": self.backend, "name": self.name, "status": self.status,
                "describe": self.describe, "live": self.live, "submitted": self.submitted,
                **({"run": self.run} if self.run is not None else {}), "submit_dir": self.submit_dir,
                "record": self.record, **({"value": self.value, "value_note": self.value_note}
                                          if self.value_note is not None else {})}


def check_listing(backend, state, limit, since) -> tuple[str | None, str | None, int, float | None]:
    """``halo_sched.list()``'s filters checked as ``list``'s options are (a UsageError naming the
    filter): a known backend, a state's name (jobstate.py ``state_named``), a count from
    0 to ``values.MAX_LIMIT``, and ``since`` as epoch seconds (values.parse_since)."""
    import time

    from .jobstate import state_named
    from .values import MAX_LIMIT, parse_since

    if backend is not None and (not isinstance(backend, str) or not known_backend(backend)):
        raise UsageError(f"backend {shown(backend)}: unknown (choose from {', '.join(backends.names())})")
    try:
        state = None if state is None else state_named(state)
    except ValueError as err:
        raise UsageError(f"state: {err}") from None
    try:
        since = None if since is None else parse_since(since, time.time())
    except ValueError as err:
        raise UsageError(f"since: {err}") from None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT:
        raise UsageError(f"limit {shown(limit)}: give a count from 0 (every record) to {MAX_LIMIT}")
    return backend, state, limit, since


#: Records per scheduler query in a long ``list`` (``--limit 0``): the first batch is a page of
#: ``list`` (its first rows come as soon as a plain ``list``'s would), the rest this many each;
#: memory holds one batch whatever the history's length.
FIRST_BATCH, BATCH = 50, 500


def recent(backend: str | None, state: str | None, limit: int, scheduler: Callable[[str], Scheduler],
           on_error: Callable[[str, HaloError], None], name: str | None = None, run: str | None = None,
           since: float | None = None) -> list[Row]:
    """The newest ``limit`` records (0: all) matching ``backend``, ``name``, ``run`` and ``since``
    with their states (every batch of :func:`recent_batches` at once)."""
    return [row for rows in recent_batches(backend, state, limit, scheduler, on_error, name, run, since) for row in rows]


def recent_batches(backend: str | None, state: str | None, limit: int, scheduler: Callable[[str], Scheduler],
                   on_error: Callable[[str, HaloError], None], name: str | None = None, run: str | None = None,
                   since: float | None = None, batch: int | None = None) -> Iterator[list[Row]]:
    """The newest ``limit`` records (0: all) matching ``backend``, ``name``, ``run`` and ``since``
    (read by index from one snapshot of the store: records.stream), with their states, ``batch``
    records at a time (default: :data:`FIRST_BATCH`, then :data:`BATCH`): one scheduler query per
    backend per batch
    (:meth:`~halo_sched.backends.base.Scheduler.for_listing`: bounded, no retries; a backend that
    could not answer is not asked again, and ``on_error`` hears why once), each state kept in its
    record; a job the scheduler forgot (or a backend that cannot answer) shows its last known
    state; an unreadable record is a row too (status ``UNREADABLE``). ``state``: only rows in it."""
    size = batch or FIRST_BATCH
    down: set[str] = set()
    items: list = []
    for item in records.stream(limit, backend=backend, name=name, run=run, since=since):
        items.append(item)
        if len(items) >= size:
            yield rows_of(items, state, scheduler, on_error, down)
            items, size = [], batch or BATCH
    if items:
        yield rows_of(items, state, scheduler, on_error, down)


def rows_of(items: list, state: str | None, scheduler: Callable[[str], Scheduler],
            on_error: Callable[[str, HaloError], None], down: set[str] | None = None) -> list[Row]:
    """The rows of ``list`` for ``items`` (records and unreadable ones): one query per backend not
    in ``down`` (a backend that cannot answer joins it)."""
    down = set() if down is None else down
    by_backend: dict[str, list[dict]] = {}
    for r in items:
        if not isinstance(r, records.BadRecord):
            by_backend.setdefault(r["backend"], []).append(r)
    states: dict = {}
    for name_, rs in by_backend.items():
        if name_ in down:
            continue
        try:
            # One query for all of them, giving up at once when the scheduler is down.
            sched = scheduler(name_)
            states[name_] = sched.for_listing().query([r["id"] for r in rs])
        except HaloError as err:
            down.add(name_)
            on_error(name_, err)
    rows = []
    for r in items:
        if isinstance(r, records.BadRecord):
            rows.append(Row(r, "UNREADABLE", f"UNREADABLE record ({r.reason})", False))
            continue
        st = states.get(r["backend"], {}).get(r["id"])
        last = r.get("last_state") or {}
        try:
            if st is not None and st.status is not JobStatus.UNKNOWN:
                keep_state(r, st)
                rows.append(Row(r, st.status.value, st.describe(), True))
                continue
        except Exception as err:  # noqa: BLE001 - one job's record or state costs that job only
            from .errors import debug

            if debug():
                raise
            import sys

            why = " ".join(f"{type(err).__name__}: {err}".split())[:200]
            print(f"halo-sched: warning: {r['id']}@{r['backend']}: its state cannot be shown ({why}); "
                  "its last known one is", file=sys.stderr, flush=True)
        # The scheduler forgot it (or did not answer): what we saw last.
        rows.append(Row(r, last.get("status") or "UNKNOWN", last.get("describe") or "UNKNOWN", False))
    return [row for row in rows if not state or row.status == state]


# ---- waiting after a submit ---------------------------------------------------------------------


def noting(backend: str, job_id: str, on_change: Callable[[JobState], None] | None,
           sched: Scheduler | None = None) -> Callable[[JobState], None]:
    """For an actor's wait: ``on_change`` that first keeps each new state in the job's record
    (its last known) and delivers what it queued (:func:`note`)."""

    def changed(state: JobState) -> None:
        note(backend, job_id, state, sched)
        if on_change is not None:
            on_change(state)

    return changed



def wait_after_submit(sched: Scheduler, spec, job_id: str, timeout: float | None = None,
                      on_change: Callable[[JobState], None] | None = None,
                      on_tick: Callable[[JobState], None] | None = None,
                      on_log: Callable[[str], None] | None = None,
                      on_log_end: Callable[[HaloError], None] | None = None,
                      outage_s: float | None = None) -> JobState:
    """``submit --wait``: the backend's guard right after submit (Nomad: placement), then until
    the job ends (or ``timeout`` seconds), through a scheduler outage of up to ``outage_s``
    seconds (halo_sched/outage.py; then OutcomeUnknown). Each state seen on the way is kept in
    the job's record (``status`` falls back on it while the scheduler is unreachable). With ``on_log`` and a backend that streams its log
    (``streams_logs``), every log line goes there as it comes (``on_log_end`` hears why the
    stream ended early). The final state is kept in the job's record."""
    follower = None
    if on_log is not None and sched.streams_logs:
        def follow() -> None:
            try:
                for line in sched.logs(job_id, follow=True):
                    on_log(line)
            except HaloError as err:
                if on_log_end is not None:
                    on_log_end(err)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
    from .outage import is_outage

    on_change = noting(sched.name, job_id, on_change, sched)
    try:
        state = sched.guard_placement(spec, job_id, on_change=on_change, outage_s=outage_s)
    except HaloError as err:  # the scheduler went away right after the submit: wait through it
        if not is_outage(err):
            raise
        state = None
    if state is None or not state.status.terminal:
        state = sched.wait(job_id, timeout=timeout, on_change=on_change, on_tick=on_tick, outage_s=outage_s)
    if follower is not None:
        follower.join(timeout=5)
    note(sched.name, job_id, state, sched)
    return state


__all__ = ["Fallback", "JobRow", "MAX_ID_CHARS", "Row", "check_listing", "check_node_rank", "noting", "query_or_last", "backend_of", "backends_of", "cancel_known", "check_id", "ended_by_record", "job_size",
           "keep_state", "known_backend", "keep_seen", "note", "query_and_note", "recent", "recent_batches", "rows_of", "unknown", "unknown_asked", "wait_after_submit",
           "warning_of"]
