"""``submit`` and ``watch``: submitting a job and waiting for its end (live progress, its logs,
a run's next attempt after a failure ``retry.on`` lists), and the exit code that end gives."""
from __future__ import annotations

import sys

from . import Progress, raw, say
from ..errors import EXIT_INTERRUPTED
from .jobids import refuse_unknown, resolve_one


def cmd_submit(args, scheduler) -> int:
    from ..spec import load

    spec = load(args.file)
    sched = scheduler(args.backend)
    if args.dry_run:
        dry = sched.dryrun(spec)
        raw(sys.stdout, dry.text if dry.text.endswith("\n") else dry.text + "\n")  # byte for byte
        sys.stdout.flush()
        # What submit would refuse before sending anything, refused here too (exit 2): an unset
        # secret_env variable names its field; no value is ever shown.
        spec.secret_values()
        return 0
    job_id = sched.submit(spec).id  # the one submit pipeline (backends/base.py), as the library's
    rc = 0
    args.current = job_id  # a run's attempt being waited on (a retry moves it on)
    try:
        say(f"halo-sched: submitted {spec.name} to {args.backend} as {job_id}")
        if args.wait:
            rc = _wait_after_submit(args, spec, sched, job_id)
    except KeyboardInterrupt:
        now = args.current
        say(f"\nhalo-sched: stopped waiting; {now} keeps running (halo-sched cancel {now} --backend {args.backend})")
        rc = EXIT_INTERRUPTED
    finally:
        # The job exists whatever happened while waiting: its id is always the last line.
        print(job_id, flush=True)
    return rc


def _wait_after_submit(args, spec, sched, job_id: str) -> int:
    from ..core import wait_after_submit

    progress = Progress(sched, job_id)
    streams = not args.quiet and sched.streams_logs
    if streams:
        progress.tty = False  # a rewritten line would garble the interleaved logs

    def log(line: str) -> None:
        sys.stderr.write(line)
        sys.stderr.flush()

    if getattr(spec, "retry", None) is not None:  # a run: the next attempt after a listed failure
        return _wait_run(args, spec, sched, job_id)
    state = wait_after_submit(
        sched, spec, job_id, timeout=args.timeout,
        on_change=None if args.quiet else progress.change, on_tick=None if args.quiet else progress.tick,
        on_log=log if streams else None, on_log_end=lambda err: say(f"halo-sched: log stream ended: {err}"))
    rc = _report_end(job_id, state, args.timeout)
    _notify_note(job_id, sched.name)
    return rc


def _notify_note(job_id: str, backend: str, wait_s: float = 1.0) -> None:
    """After the end: a notification delivered within ``wait_s`` is not mentioned; one that failed
    is said; one still on its way is said to go on in the background (never waited for longer)."""
    import time

    from ..notify import outcomes, undelivered_lines

    deadline = time.monotonic() + wait_s
    while any(state == "pending" for _, state, _, _ in outcomes(job_id, backend)) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = undelivered_lines(job_id, backend)
    for line in lines:
        say(f"halo-sched: {job_id}: {line}")
    if not lines and any(state == "pending" for _, state, _, _ in outcomes(job_id, backend)):
        say(f"halo-sched: {job_id}: notify: delivery goes on in the background (halo-sched status {job_id} shows "
            f"its outcome)")


def _wait_run(args, spec, sched, job_id: str, watching: bool = False) -> int:
    """``submit --wait`` of a job with ``retry:``: each attempt waited on as a plain job is, the
    next one submitted after a failure ``retry.on`` lists (halo_sched/runs.py); the run's
    attempts and GPU-hours at the end."""
    from ..core import wait_after_submit
    from ..runs import attempts_of, describe_rows, wait_run

    submitted_here = set() if watching else {job_id}  # the attempts this process submitted

    def one(attempt_id: str, observe) -> "object":
        progress = Progress(sched, attempt_id)

        def changed(st) -> None:
            observe(st)
            if not args.quiet:
                progress.change(st)

        if attempt_id not in submitted_here:  # submitted earlier or elsewhere: no placement guard
            from ..core import noting

            return sched.wait(attempt_id, timeout=args.timeout, on_change=noting(sched.name, attempt_id, changed),
                              on_tick=None if args.quiet else progress.tick)
        return wait_after_submit(sched, spec, attempt_id, timeout=args.timeout, on_change=changed,
                                 on_tick=None if args.quiet else progress.tick)

    def retried(old: str, state, why: str, new: str) -> None:
        args.current = new
        submitted_here.add(new)
        seen_end.add(old)
        say(f"halo-sched: {old} {state.describe()}")
        say(f"halo-sched: retrying ({why} fault) as {new}")

    from .. import records

    def followed(old: str, new: str) -> None:
        args.current = new
        last = ((records.find(old, sched.name, on_bad=None) or [{}])[0].get("last_state") or {}).get("describe")
        if isinstance(last, str) and old not in seen_end:
            say(f"halo-sched: {old} {last}")
        say(f"halo-sched: {old} was followed by {new} (the run's next attempt)")

    seen_end: set = set()  # attempts whose end this process already said

    run_id = ((records.find(job_id, sched.name) or [{}])[0].get("run") or {}).get("id") or job_id
    last_id, state = wait_run(sched, spec, job_id, one, retried, followed)
    if watching:
        from ..core import note

        note(sched.name, last_id, state)
    rc = _report_end(last_id, state, args.timeout)
    for line in describe_rows(attempts_of(run_id, sched.name)):
        say(f"halo-sched: {run_id}: {line.strip()}")
    _notify_note(last_id, sched.name)
    return rc


def _report_end(job_id: str, state, timeout: float | None) -> int:
    """The last word of a wait on stderr; the exit code: 0 only for a completed job."""
    from ..backends.base import JobStatus
    from ..errors import EXIT_OUTCOME_UNKNOWN

    if state.status is JobStatus.UNKNOWN:
        say(f"halo-sched: {job_id}: the scheduler no longer knows this job; its outcome is unknown ({state.reason})")
        return EXIT_OUTCOME_UNKNOWN
    if not state.status.terminal:
        say(f"halo-sched: {job_id} still {state.status.value} after --timeout {timeout:g}s")
    else:
        say(f"halo-sched: {job_id} {state.describe()}")
    return 0 if state.status is JobStatus.COMPLETED else 1


def cmd_watch(args, scheduler) -> int:
    backend = resolve_one(args.id, args.backend)
    sched = scheduler(backend)
    refuse_unknown(backend, sched, args.id)
    from ..core import noting

    spec = _run_spec(backend, args.id)
    if spec is not None:  # an attempt of a run with retry: the next attempt after a listed failure
        args.current = args.id
        try:
            return _wait_run(args, spec, sched, args.id, watching=True)
        except KeyboardInterrupt:
            say(f"\nhalo-sched: stopped watching; {args.current} (the run's current attempt) keeps running")
            return EXIT_INTERRUPTED
    progress = Progress(sched, args.id)
    try:
        state = sched.wait(args.id, timeout=args.timeout,
                           on_change=noting(backend, args.id, None if args.quiet else progress.change),
                           on_tick=None if args.quiet else progress.tick)
    except KeyboardInterrupt:
        say(f"\nhalo-sched: stopped watching; {args.id} keeps running")
        return EXIT_INTERRUPTED
    return _report_end(args.id, state, args.timeout)


def _run_spec(backend: str, job_id: str):
    """The spec of a recorded job that has ``retry:`` (``watch`` then retries as ``submit --wait``
    would), with its job file and git state as recorded; None otherwise."""
    from .. import records

    rec = (records.find(job_id, backend) or [{}])[0]
    data = rec.get("spec")
    if not isinstance(data, dict) or not data.get("retry"):
        return None
    from ..spec import from_dict

    return from_dict(data, source=f"the record of {job_id}")

