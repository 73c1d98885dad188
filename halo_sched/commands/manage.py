"""The commands that change things: ``cancel`` (or warn, ``--signal``), ``nodes`` (the node
ledger; ``nodes clear HOST``), ``gc`` (Nomad: the secrets of ended jobs), ``notify`` (deliver the
queued notifications) and ``export``."""
from __future__ import annotations

import json
import time

from . import json_line, say
from ..errors import UnknownJob, UsageError, shown
from .jobids import resolve_ids


def cmd_cancel(args, scheduler) -> int:
    from ..core import cancel_known
    from ..runs import newest_attempts

    if args.timeout is not None and not args.wait:
        raise UsageError("--timeout applies to cancel --wait")
    if args.wait and args.signal:
        raise UsageError("--wait and --signal: a warning does not end the job (wait with `halo-sched watch`)")
    # An attempt of a run (retry:) stands for the run: its newest attempt, pending or running, is
    # what is cancelled (or warned), and the line says which it was.
    groups, runs = newest_attempts(resolve_ids(args.ids, args.backend), scheduler)
    opts: dict = {}
    if args.purge:
        if set(groups) != {"nomad"}:
            raise UsageError("--purge applies to --backend nomad only")
        opts["purge"] = True
    if args.signal:
        if set(groups) != {"slurm"}:
            raise UsageError("--signal applies to --backend slurm only")
        opts["signal"] = _warning_signal(args.signal, groups["slurm"])
    done, unknown, where, ended = cancel_known(groups, scheduler, **opts)
    if not args.signal:  # an attempt that submitted its successor as it was cancelled: that one too
        later, runs2 = newest_attempts({b: [i for i in ids if i in done] for b, ids in groups.items()}, scheduler, 0.0)
        more = {b: [i for i in ids if i not in done and i not in ended] for b, ids in later.items()}
        if any(more.values()):
            runs.update(runs2)
            extra, _, _, also_ended = cancel_known({b: ids for b, ids in more.items() if ids}, scheduler, **opts)
            done += extra
            ended.update(also_ended)
    what = f"signal {args.signal}" if args.signal else "cancel"
    for job_id in done:
        say(f"halo-sched: {what} requested for {job_id}{runs.get(job_id, '')}")
    for job_id, words in ended.items():  # nothing to do: the job is not running (exit 0)
        words = " ".join(words.split())
        head, tail = (f"halo-sched: {job_id}{runs.get(job_id, '')} already ended (",
                      f"); nothing to {'signal' if args.signal else 'cancel'}")
        room = max(40, 160 - len(head + tail))
        say(head + (words if len(words) <= room else words[:room - 3] + "...") + tail)
    rc, finals = 0, {}
    if args.wait and done:
        by_backend = {b: [i for i in ids if i in done] for b, ids in groups.items()}
        rc, finals = _wait_ended(by_backend, scheduler, args.wait_default if args.timeout is None else args.timeout)
    if args.json:
        from .show import state_json

        print(json_line({"cancelled": [] if args.signal else done, "signalled": done if args.signal else [],
                         "already_ended": ended, "unknown": list(unknown),
                         **({"ended": {i: state_json(st) for i, st in finals.items()}} if args.wait else {})}))
    if unknown:
        raise UnknownJob(list(unknown), next(iter(where)) if len(where) == 1 else None,
                         reason=next(iter(unknown.values())) if len(unknown) == 1 else "",
                         others_done=" (the others were cancelled)" if done else "")
    return rc


def _wait_ended(groups: dict[str, list[str]], scheduler, timeout: float) -> tuple[int, dict]:
    """``cancel --wait``: until each job cancelled (backend -> ids) has ended, all within
    ``timeout`` seconds; each end said and kept in its record. An attempt of a run whose next
    attempt started all the same (decided before the cancel) is no end of the run: said, exit 1.
    Returns (exit code: 0 every one ended, 1 one still ran or its run went on, 3 one the
    scheduler no longer knows), the final states."""
    from ..backends.base import JobStatus
    from ..backends.watcher import watcher_for
    from ..core import keep_seen
    from ..errors import EXIT_OUTCOME_UNKNOWN

    deadline = time.monotonic() + timeout
    rc, finals = 0, {}
    for backend, ids in groups.items():
        sched = scheduler(backend)
        for job_id in ids:
            watcher_for(sched).forget(job_id)  # asked afresh: not a state seen before the cancel
            state = sched.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
            keep_seen(backend, job_id, state, sched)
            finals[job_id] = state
            if state.status is JobStatus.UNKNOWN:
                say(f"halo-sched: {job_id}: the scheduler no longer knows this job; its end was not seen ({state.reason})")
                rc = max(rc, EXIT_OUTCOME_UNKNOWN)
            elif not state.status.terminal:
                say(f"halo-sched: {job_id} still {state.status.value} after --timeout {timeout:g}s")
                rc = max(rc, 1)
            else:
                say(f"halo-sched: {job_id} {state.describe()}")
                went_on = _run_went_on(sched, job_id)
                if went_on:
                    say(f"halo-sched: {job_id}: its run went on as {went_on} (the next attempt, decided before the "
                        f"cancel): halo-sched cancel {went_on}")
                    rc = max(rc, 1)
    return rc, finals


def _run_went_on(sched, job_id: str) -> str | None:
    """The next attempt of ``job_id``'s run, when it is an attempt of one and one was started."""
    from .. import records
    from ..runs import next_attempt

    run = ((records.find(job_id, sched.name, on_bad=None) or [{}])[0]).get("run")
    if not isinstance(run, dict) or not isinstance(run.get("id"), str):
        return None
    return next_attempt(sched, run["id"], job_id)


def _warning_signal(given: str, ids: list[str]) -> str:
    """``cancel --signal``'s signal, which must be each job's warning signal: the batch script
    traps that one alone, and any other would end it (and the job) by its default action."""
    from ..core import warning_of
    from ..values import WARNING_SIGNALS, parse_warning

    asked = parse_warning(given.upper())
    name = asked[1] if asked and not asked[0] and asked[2] is None else None
    if name not in WARNING_SIGNALS:
        raise UsageError(f"--signal {given}: the warning is one of {', '.join(WARNING_SIGNALS)} "
                         "(the job's slurm.signal, USR2 when unset)")
    for job_id in ids:
        theirs = warning_of(job_id)
        if theirs is not None and theirs != name:
            raise UsageError(f"--signal {given}: job {job_id}'s warning is {theirs} (slurm.signal); its batch "
                             f"script would end on {name}: send {theirs}")
    return name


def cmd_nodes(args, scheduler) -> int:
    """``nodes``: the active ledger entries; ``nodes clear HOST``: forget HOST."""
    from .. import ledger

    if args.action is None:
        if args.host is not None:
            raise UsageError(f"nodes: unexpected {shown(args.host)} (did you mean `nodes clear {shown(args.host)}`?)")
        ledger.expiry_hours()  # a bad HALO_SCHED_NODE_EXPIRY_HOURS is said here, exit 2
        rows = ledger.active()
        avoided = ledger.fenced(rows)
        if args.json:  # one JSON array, `[]` for an empty ledger: JSON whatever it holds
            print(json_line([{**e.to_dict(), "avoided": (e.backend, e.host) in avoided} for e in rows]))
            return 0
        if not rows:
            say(f"halo-sched: the node ledger is empty (new jobs avoid no host) [{ledger.path()}]")
            return 0
        fmt = "%Y-%m-%d %H:%M:%S"

        def safe(text: str) -> str:  # the file is data: nothing in it drives the terminal
            return "".join(c if c.isprintable() else "?" for c in text)[:200]

        def reason(e) -> str:
            # Only a rank's words blamed the node: avoided once REPEATED jobs failed so there.
            if not e.said:
                return safe(e.reason)
            jobs = len({x.job for x in rows if x.said and (x.backend, x.host) == (e.backend, e.host)})
            state = "avoided" if (e.backend, e.host) in avoided else f"not avoided before {ledger.REPEATED} jobs"
            return safe(e.reason) + f" [a rank's report; {jobs} job{'s' if jobs != 1 else ''} so far: {state}]"

        table = [("HOST", "REASON", "JOB", "SINCE", "EXPIRES")] + [
            (e.host, reason(e), safe(f"{e.job}@{e.backend}"), time.strftime(fmt, time.localtime(e.since)),
             time.strftime(fmt, time.localtime(e.expires))) for e in rows]
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        for r in table:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
        return 0
    if args.host is None:
        raise UsageError("nodes clear: HOST is required")
    host = ledger.check_host(args.host)
    gone = ledger.clear(host)
    if not gone:
        raise UsageError(f"nodes clear: HOST {host!r} is not in the node ledger")
    if args.json:
        print(json_line({"host": host, "cleared": gone}))
    else:
        say(f"halo-sched: {host}: forgot {gone} ledger {'entry' if gone == 1 else 'entries'}; new jobs may run there")
    return 0


def cmd_gc(args, scheduler) -> int:
    """The logic is the Nomad backend's (``collect_secrets``); this only picks the records."""
    from .. import records

    ids = [r["id"] for r in records.page(0, backend="nomad") if not isinstance(r, records.BadRecord)]
    if not ids:
        say("halo-sched: gc: no Nomad job records; nothing to delete")
        return 0
    removed, kept, failed, notes = scheduler("nomad").collect_secrets(ids)
    for job_id, path in removed:
        print(f"{job_id}\t{path}", flush=True)
    for line in notes + failed:
        say(f"halo-sched: gc: {line}")
    say(f"halo-sched: gc: deleted the secrets of {len(removed)} ended job{'s' * (len(removed) != 1)}"
         + (f"; kept those of {len(kept)} job{'s' * (len(kept) != 1)} still pending or running" if kept else ""))
    return 1 if failed else 0


def cmd_export(args, scheduler) -> int:
    """Every job record (newest first, an unusable one with why), ledger entry and notification
    of the history store, as JSON: what it holds stays inspectable and portable. Streamed
    (records.stream, one snapshot): the first line comes at once and memory stays flat whatever
    the history's length; ``--json`` writes the same one document piece by piece."""
    import sys

    from .. import db, ledger, records

    def jobs():
        for r in records.stream(0, on_bad=None):
            if isinstance(r, records.BadRecord):
                yield {"id": r.id, "backend": r.backend, "unreadable": r.reason}
            else:  # the job's failure key stays in the store (records.public, Job.describe() too)
                yield records.public(r)

    def notes():
        if not db.exists():
            return
        with db.reading() as con:
            cur = con.execute("SELECT job, backend, event, state, tries, last_error, payload FROM outbox "
                              "ORDER BY created")
            while rows := cur.fetchmany(records.FETCH):
                for j, b, e, st, n, why, p in rows:
                    yield {"job": j, "backend": b, "event": e, "state": st, "tries": n, "last_error": why,
                           "payload": json.loads(p)}

    def dumps(value) -> str:
        return json.dumps(value, allow_nan=False)

    out = sys.stdout
    if args.json:  # {"schema": N, "jobs": [...], "ledger": [...], "notifications": [...]}, as json.dumps writes it
        out.write(f'{{"schema": {db.SCHEMA_VERSION}, "jobs": [')
        for i, item in enumerate(jobs()):
            out.write((", " if i else "") + dumps(item))
        out.write(f'], "ledger": {dumps([e.to_dict() for e in ledger.entries()])}, "notifications": [')
        for i, item in enumerate(notes()):
            out.write((", " if i else "") + dumps(item))
        out.write("]}\n")
        return 0
    for kind, items in (("job", jobs()), ("ledger", (e.to_dict() for e in ledger.entries())), ("notification", notes())):
        for item in items:
            out.write(dumps({"kind": kind, **item}) + "\n")
    return 0


def cmd_notify(args, scheduler) -> int:
    """Deliver, in the foreground, the queued notifications whose webhook variable this
    environment sets and whose backoff is over (``--now``: those waiting too; each try within its
    deadline: halo_sched/notify.py): for a job nobody waits on. ``status`` and ``list`` queue a
    notification and never send it; ``submit --wait`` and ``watch`` deliver their own. Exit 1 when
    this run tried one and could not deliver it (it stays queued); a row another live run is
    delivering, or one waiting for its next try, is said and is no failure of this run."""
    import os

    from .. import db, notify

    done = notify.deliver(due_only=not getattr(args, "now", False)) if db.exists() else notify.Delivery()
    for job, backend, event, tries, error, state, next_try in done.failed:
        if state == "given-up":
            say(f"halo-sched: {job}@{backend}: notify: the {event} notification was given up after {tries} tries"
                f"{' (' + error + ')' if error else ''}")
        else:
            say(f"halo-sched: {job}@{backend}: notify: the {event} notification is not delivered yet ({notify.tries_words(tries)}"
                f"{': ' + error if error else ''}); {notify.next_try_words(next_try)}")
    rows = db.read("SELECT job, backend, event, webhook_env, claimed_until, claimed_by, next_try FROM outbox "
                   "WHERE state = 'pending' ORDER BY created") if db.exists() else []
    now = time.time()
    failed = {(j, b, e) for j, b, e, *_ in done.failed}
    mine = [r for r in rows if os.environ.get(r[3]) and (r[0], r[1], r[2]) not in failed]
    elsewhere = sorted({r[3] for r in rows if not os.environ.get(r[3])})
    in_flight = [r for r in mine if notify.held_elsewhere(r[4], r[5], now)]
    waiting = [r for r in mine if r not in in_flight and r[6] > now]
    parts = [f"{done.delivered} delivered"] + ([f"{len(done.failed)} not delivered"] if done.failed else [])
    tail = []
    if in_flight:
        tail.append(f"{len(in_flight)} being delivered by another halo-sched process")
    if waiting:
        soonest = min(r[6] for r in waiting)
        tail.append(f"{len(waiting)} waiting for a next try ({notify.next_try_words(soonest, now)}; "
                    f"`halo-sched notify --now` tries now)")
    if elsewhere:
        tail.append(f"{sum(1 for r in rows if not os.environ.get(r[3]))} wait for a variable this environment "
                    f"does not set ({', '.join(elsewhere)})")
    say("halo-sched: notify: " + ", ".join(parts) + ("; " + "; ".join(tail) if tail else ""))
    return 1 if done.failed else 0
