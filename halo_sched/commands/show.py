"""The commands that read jobs: ``status`` (with a run's attempts), ``list`` (recent job records
with their states) and ``logs`` (a job's output, by node or rank)."""
from __future__ import annotations

import sys

from . import PipeGuard, json_line, say
from ..errors import HaloError, UnknownJob, UsageError, shown
from .jobids import refuse_unknown, resolve_ids, resolve_one


def cmd_status(args, scheduler) -> int:
    from ..core import query_or_last, unknown as unknown_of
    from ..errors import EXIT_OUTCOME_UNKNOWN

    states, unknown, fallen, where = {}, [], {}, {}
    for backend, ids in resolve_ids(args.ids, args.backend).items():
        got, last = query_or_last(backend, scheduler(backend), ids)
        states.update(got)
        fallen.update(last)
        where.update(dict.fromkeys(ids, backend))
        unknown += [(i, backend, got[i].reason) for i in unknown_of(backend, got, ids)]
    gone = {i for i, _, _ in unknown}
    for job_id in args.ids:
        if job_id in gone:
            continue
        try:
            if job_id not in fallen:
                _follow(job_id, where[job_id], scheduler)
            _show_status(args, job_id, where[job_id], states.get(job_id), fallen.get(job_id))
            _print_undelivered(job_id, where[job_id])
        except Exception as err:  # noqa: BLE001 - one job that cannot be shown costs itself only
            _unshowable(args.json, job_id, where[job_id], err)
    if unknown:
        backends = sorted({b for _, b, _ in unknown})
        raise UnknownJob([i for i, _, _ in unknown], backends[0] if len(backends) == 1 else None,
                         unknown[0][2] if len(unknown) == 1 else "")
    if fallen:
        from ..outage import display_name

        names = ", ".join(sorted({display_name(where[i]) for i in fallen}))
        say(f"halo-sched: {names} did not answer: showing the last known state from the job record "
             f"(--debug: why)")
        from ..errors import debug

        if debug():
            say(f"  {next(iter(fallen.values())).why}")
        if any(not fb.last for fb in fallen.values()):
            return 1  # nothing is known of some id: the scheduler could not be reached
        # An end seen earlier stays the end; anything else may have changed since.
        if not all(fb.final for fb in fallen.values()):
            return EXIT_OUTCOME_UNKNOWN
    return 0


def _follow(job_id: str, backend: str, scheduler) -> None:
    """``status RUN`` of a run whose attempts start each other (SLURM): the chain followed from
    the scheduler and the output directory, what is found recorded (runs.follow_run)."""
    from .. import records
    from ..runs import follow_run

    run = (records.find(job_id, backend, on_bad=None) or [{}])[0].get("run")
    if not (isinstance(run, dict) and run.get("id") == job_id):
        return
    sched = scheduler(backend)
    if getattr(sched, "starts_successor", False):
        follow_run(sched, job_id)


def _print_undelivered(job_id: str, backend: str) -> None:
    """A notification not delivered is said (never lost silently), with how it gets delivered:
    ``status`` reads, it never sends (halo_sched/notify.py)."""
    from ..notify import queued_lines, undelivered_lines

    for line in undelivered_lines(job_id, backend) + queued_lines(job_id, backend):
        say(f"halo-sched: {job_id}: {line}")


def _show_status(args, job_id: str, backend: str, state, fallen) -> None:
    """``status``'s lines (or JSON object) for one job: its state, or (``fallen``) the last known
    one from its record when the scheduler did not answer; a run's attempts."""
    if fallen is not None:  # the scheduler did not answer: the record's last known state
        fb = fallen
        if args.json:
            print(json_line({"id": job_id, "status": (fb.last or {}).get("status") or "UNKNOWN",
                             "live": False, "last_known": fb.last, "unreachable": fb.why}))
        else:
            print(f"{job_id}\t{fb.describe(backend)}")
            _print_run(job_id, backend)
        return
    st = state
    if args.json:
        print(json_line({**state_json(st),
                         # A run's first attempt (retry:): each attempt with its hours, and the totals.
                         **_run_json(st.id, backend)}))
    elif st.last_known is not None:
        print(f"{job_id}\t{st.last_known['describe']} (last known: the scheduler no longer knows the job)")
    else:
        print(f"{job_id}\t{st.describe()}")
        if (line := value_line(st)) is not None:
            print(f"{job_id}\t{line}")
    if not args.json:
        _print_run(job_id, backend)


#: ``status``'s line of rank 0's result shows at most this many characters of its JSON (``--json``: all of it).
VALUE_SHOWN = 200


def value_line(st) -> str | None:
    """``status``'s line for rank 0's result: ``value: {"loss": 0.21}`` (its JSON, bounded and
    ASCII: a job's text never drives the terminal), or why it cannot be had (``value: none (not
    carried: ...)``, what is wrong with the file); None when there is nothing to say (a job that
    has not ended, wrote none, or whose backend could not be asked now: ``--json`` says why)."""
    from ..outcome import NO_RESULT

    if st.value_note is None or st.value_note == NO_RESULT or st.value_note.startswith("not read"):
        return None
    if st.value_note:
        return f"value: none ({st.value_note})"
    text = json_line(st.value)
    return f"value: {text if len(text) <= VALUE_SHOWN else text[:VALUE_SHOWN - 3] + '...'}"


def state_json(st) -> dict:
    """A job's state as ``status --json`` (and ``submit --json --wait``, ``cancel --json --wait``)
    write it."""
    from ..jobstate import in_place_fields

    return {
        "id": st.id, "status": st.status.value, "raw_state": st.raw_state, "exit_code": st.exit_code,
        "nodes_total": st.nodes_total, "nodes_running": st.nodes_running, "reason": st.reason,
        # Nomad: per node rank, the allocation that runs it (alloc id, node, client status).
        **({"nodes": st.nomad.nodes} if st.nomad is not None else {}),
        # SLURM: how many times the job was requeued (the run is restarts + 1).
        **({"restarts": st.restarts} if st.restarts is not None else {}),
        # Which rank failed first, and every failure the nodes reported.
        **({"failure": st.failure.to_dict()} if st.failure is not None else {}),
        # Whose fault: node, job or unknown (docs/failures.md, "Whose fault").
        **({"failure_class": cls.to_dict()} if (cls := st.failure_class()) is not None else {}),
        # SLURM hot spares (slurm.spare_nodes): how many are left, and each swap.
        **({"spares": st.spares} if st.spares else {}),
        # SLURM with retry: the restarts in place inside the allocation (and a crash loop's end).
        # (in_place_restarts: each restart's signed line; crash_loop: the one that ended the run).
        **in_place_fields(st.in_place),
        **({"last_known": st.last_known} if st.last_known is not None else {}),
        # An end: rank 0's result (HALO_RESULT_FILE), or why there is none.
        **({"value": st.value, "value_note": st.value_note} if st.value_note is not None else {}),
    }


def _unshowable(as_json: bool, job_id: str, backend: str, err: Exception) -> None:
    """A job whose record or state cannot be shown (a bug, or a record no check foresaw): its
    row says so and the other jobs are shown; ``--debug`` raises it instead."""
    from ..errors import debug

    if debug():
        raise err
    why = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
    if as_json:
        print(json_line({"id": job_id, "backend": backend, "status": "UNREADABLE", "live": False,
                         "error": f"cannot be shown ({why})"}))
    else:
        print(f"{job_id}\t{backend}\t\tUNREADABLE (cannot be shown: {why})")
    say(f"halo-sched: warning: {job_id}@{backend} cannot be shown ({why}; --debug shows the traceback)")


def _run_json(job_id: str, backend: str) -> dict:
    """``status --json RUN``: ``{"run": {"id", "attempts": [...], "totals": {...}}}``; {} otherwise."""
    from .. import records
    from ..runs import attempts_of, effective, totals

    run = (records.find(job_id, backend) or [{}])[0].get("run")
    if not isinstance(run, dict):
        return {}
    if run.get("id") != job_id:  # a later attempt: which run and which attempt it is
        return {"run": {"id": run.get("id"), "attempt": run.get("attempt")}}
    rows = attempts_of(job_id, backend)
    return {"run": {"id": job_id, "attempt": 0, "attempts": [a.to_dict() for a in rows],
                    "totals": totals(rows, effective(job_id, backend))}}


def _print_run(job_id: str, backend: str) -> None:
    """``status RUN``: under a run's first attempt, each attempt (its outcome, cause, excluded
    hosts, node-hours and GPU-hours) and the run's totals, from the job records."""
    from .. import records
    from ..runs import attempts_of, describe_rows, effective

    rec = (records.find(job_id, backend) or [{}])[0]
    run = rec.get("run")
    if not isinstance(run, dict) or run.get("id") != job_id:
        return
    for line in describe_rows(attempts_of(job_id, backend), effective(job_id, backend)):
        print(f"{job_id}\t{line.strip()}")


def cmd_list(args, scheduler) -> int:
    """The rows a batch at a time (runs.listing, the library's halo_sched.list() too): the first
    lines come after one scheduler query, and memory holds one batch, whatever the history's
    length (issue 43)."""
    from ..runs import listing

    it = listing(args.backend, args.state, args.limit, scheduler, on_error=_list_note, name=args.name,
                 run=args.run, since=args.since)
    try:
        for rows in it:
            _print_rows(args, rows)
            if isinstance(sys.stdout, PipeGuard) and sys.stdout.broken:
                break  # the reader went away (| head): nothing more to show
    finally:
        it.close()
    return 0


def _print_rows(args, rows) -> None:
    from .. import records

    for r, status, text, known in rows:
        try:
            _list_row(args, r, status, text, known)
        except Exception as err:  # noqa: BLE001 - one record that cannot be shown costs itself only
            _unshowable(args.json, r.id if isinstance(r, records.BadRecord) else r["id"],
                        r.backend if isinstance(r, records.BadRecord) else r["backend"], err)


def _list_row(args, r, status: str, text: str, known: bool) -> None:
    """``list``'s line (or JSON object: core.JobRow, what halo_sched.list() returns) for one record."""
    from .. import records
    from ..core import JobRow, Row

    if args.json:
        print(json_line(JobRow.of(Row(r, status, text, known)).to_dict()))
    elif isinstance(r, records.BadRecord):
        print(f"{r.id}\t{r.backend}\t\t{text}")
    else:
        when = (r.get("submitted_iso") or "")[:19].replace("T", " ")
        run = r.get("run") if isinstance(r.get("run"), dict) else None
        from ..runs import number

        rid = "".join(c for c in str(run.get("id"))[:256] if c.isprintable()) if run else ""
        of_run = f" [run {rid}, attempt {number(run.get('attempt')) + 1}]" if run else ""
        print(f"{r['id']}\t{r['backend']}\t{when}\t{text}{'' if known else ' (last known)'}{of_run}")


def _list_note(backend: str, err: HaloError) -> None:
    """``list``: one line of at most 160 characters for a backend that did not answer (its rows
    show the last known states): the error with its advice when that fits, else the condition."""
    head, tail = f"halo-sched: {backend}: ", "; states below: last known"
    text = " ".join(str(err).split())
    if len(head + text + tail) > 160:
        text = " ".join((err.short or text).split())
    room = 160 - len(head + tail)
    say(head + (text if len(text) <= room else text[:room - 3] + "...") + tail)
    from ..errors import debug

    if debug() and (err.__cause__ or err.__context__):
        from ..errors import cause_chain

        say(f"  {cause_chain(err)}")


def cmd_logs(args, scheduler) -> int:
    from ..logtags import log_filter, select

    backend = resolve_one(args.id, args.backend)
    sched = scheduler(backend)
    refuse_unknown(backend, sched, args.id)
    # The library's Job.logs() filters with the same (halo_sched/logtags.py).
    keep = log_filter(args.node, args.rank, args.grep, args.since, args.stream, backend=backend,
                      fields=sched.log_fields)
    if args.node is not None or args.rank is not None:
        _check_node_rank(args, backend, sched)
    for line in select(sched.logs(args.id, follow=args.follow), keep=keep):
        sys.stdout.write(line)
        sys.stdout.flush()
        if isinstance(sys.stdout, PipeGuard) and sys.stdout.broken:
            break  # the reader went away (| head): nothing more to show
    return 0


def _check_node_rank(args, backend: str, sched) -> None:
    """``--node``/``--rank`` inside the job (its record's size, else the scheduler's node count)."""
    from ..core import check_node_rank

    check_node_rank(backend, sched, args.id, args.node, args.rank)


def cmd_timeline(args, scheduler) -> int:
    from ..timeline import main as timeline

    backend = resolve_one(args.id, args.backend)
    sched = scheduler(backend)
    refuse_unknown(backend, sched, args.id)
    return timeline(args.id, backend, sched, args.svg, args.width)
