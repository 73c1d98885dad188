"""The ``halo-sched`` command. Its contract is fixed (pipelines depend on it):

- machine-readable results go to stdout (``submit``: the job id alone on the last line);
  human text goes to stderr, one short line per event (``--debug`` adds the exceptions behind
  them, and the traceback of an internal error);
- never a traceback, never a hang on bad input.

Exit codes: the one table (docs/cli.md, "Exit codes", repeats it; halo_sched/errors.py names them):

====  =================================================================================
code  meaning
====  =================================================================================
0     success: the command did what was asked (``submit --wait``/``watch``: the job
      COMPLETED; ``preflight``: it passed; ``status``: every id was known; ``gc``: every
      ended job's secrets are gone; ``cancel``: each job was cancelled, or had already
      ended, which it says)
1     a job or the scheduler failed: the job ended other than COMPLETED or still ran at
      ``--timeout``; the scheduler refused a request or could not be reached, and nothing
      was done; ``preflight`` or ``plan`` failed; ``gc``: a Variable could not be deleted;
      an internal error (a bug)
2     bad input, nothing done: a bad job file or option value, an unknown, over-long or
      malformed job id, an unset ``secret_env`` variable, a missing dependency
3     outcome unknown: a request may or may not have taken effect (the scheduler stayed
      unreachable after an attempt that may have reached it: the message names the token
      to look for), or a waited-on job vanished from the scheduler before its end was seen;
      ``submit --wait``/``watch``/``logs --follow``: the scheduler stayed unreachable past
      the outage budget (``--outage-budget``, ``HALO_OUTAGE_S``, default 600 s) or at
      ``--timeout``; ``status``: the scheduler did not answer within 10 s and a job's last
      known state (shown from its record, labelled) is not an end (an end stays 0; an id
      with no record then is 1)
130   interrupted (Ctrl-C); a submitted job keeps running
====  =================================================================================

A reader that goes away (``| head``) changes nothing: the command finishes with its own code,
its further output discarded (``logs`` stops reading).

Imports stay lazy: start-up must not pay for backends it does not use, and never imports torch.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

from .errors import EXIT_INTERRUPTED, HaloError, UnknownJob, UsageError, shown

def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _outage_line(line: str) -> None:
    """A line about the scheduler being unreachable, on a line of its own (a terminal's
    rewritten progress line is cleared first)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    _err(f"halo-sched: {line}")


def _backend_arg(p: argparse.ArgumentParser, by_id: bool = False) -> None:
    # None until resolved: for a job id, its record names the backend (see _resolve_ids).
    where = "the backend in the job's record, else " if by_id else ""
    p.add_argument(
        "--backend", "-b", default=None,
        help=f"local, slurm or nomad (default: {where}$HALO_SCHED_BACKEND, else local)",
    )


# ---- option values: refused by argparse (exit 2, naming the option) --------------------------


def _whole(text: str, least: int, why: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(why.format(value))
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1, "{} is not a positive number")


def _limit(text: str) -> int:
    """``list --limit``: a positive count, or 0 for all (as documented)."""
    return _whole(text, 0, "{}: give a positive count (or 0 for every record)")


def _index(text: str) -> int:
    return _whole(text, 0, "{}: indexes count from 0")


def _seconds(text: str) -> float:
    """``--outage-budget``: seconds, 0 (do not wait through an outage) or more."""
    from .outage import outage_budget

    try:
        return outage_budget(float(text))
    except (ValueError, HaloError):
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, 0 to 604800") from None


def _outage_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--outage-budget", type=_seconds, default=None, metavar="SECONDS",
                   help="keep waiting this long while the scheduler is unreachable, then exit 3 "
                        "(outcome unknown); default $HALO_OUTAGE_S, else 600")


def _positive_float(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite positive number")
    return value


def _state_name(text: str) -> str:
    from .backends.base import JobStatus

    name = text.strip().upper()
    valid = [s.value for s in JobStatus] + ["UNREADABLE"]
    if name not in valid:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a state; use one of {', '.join(valid)}")
    return name


# ---- job ids: the core knows which backend each went to ------------------------------------------

# Commands that take job ids: without --backend, each id's job record says where it went.
_BY_ID = {"status", "watch", "logs", "cancel", "timeline"}


def _resolve_ids(ids, backend: str | None) -> dict[str, list[str]]:
    from .core import backends_of

    return backends_of(ids, backend)


def _resolve_one(job_id: str, backend: str | None) -> str:
    return next(iter(_resolve_ids([job_id], backend)))


class _Unread:
    """Stands in for the parser of a command that this run does not parse (see build_parser): its
    arguments are not built."""

    def add_argument(self, *args, **kw) -> None:
        pass


def _command_in(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), if it is one; top-level
    options (--debug, --version, --help) take no value."""
    for word in argv:
        if word == "--" or not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (a command), that command alone: a run parses one
    command, and building the other eleven is ~1 ms of start-up (docs/performance.md)."""
    from . import __version__

    # --debug is taken before or after the command (argparse.SUPPRESS: a subcommand that does not
    # see it leaves the top level's value alone).
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the exceptions behind errors and retries, and an internal error's traceback")
    ap = argparse.ArgumentParser(
        prog="halo-sched",
        description="Compile one multi-node torchrun job file to SLURM, Nomad or local processes; submit, watch, cancel.",
        epilog="Exit codes: 0 success; 1 the job or the scheduler failed; 2 bad input; 3 outcome unknown; "
               "130 interrupted (see README.md, Exit codes).",
    )
    ap.add_argument("--version", action="version", version=f"halo-sched {__version__}")
    ap.add_argument("--debug", action="store_true", default=False,
                    help="show the exceptions behind errors and retries, and an internal error's traceback")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, **kw) -> argparse.ArgumentParser:
        if only is not None and name != only:
            return _Unread()  # type: ignore[return-value]
        return sub.add_parser(name, parents=[debug], **kw)

    p = command("validate", help="check job files; exit 2 naming each bad field")
    p.add_argument("files", nargs="+", metavar="FILE")

    p = command("render", help="print what would be submitted")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--format", choices=("hcl", "json"), default=None, help="Nomad only: HCL (default) or the API JSON")

    p = command("submit", help="submit a job; prints its id on the last line of stdout")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--wait", action="store_true", help="wait for the end; exit 0 only if the job completed")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be submitted, submit nothing (exit 2 on what submit would refuse, "
                        "such as an unset secret_env variable)")
    p.add_argument("--timeout", type=_positive_float, default=None, help="with --wait: stop waiting after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="with --wait: no live logs or progress")
    _outage_arg(p)

    p = command("plan", help="ask the scheduler whether the job can run, submitting nothing (Nomad: each node group's placement; SLURM: sbatch --test-only and the preemption settings)")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)

    p = command("status", help="state of one or more jobs (one scheduler query; when it does not answer within "
                               "10 s, each job's last known state, labelled); exit 2 naming ids nobody knows")
    p.add_argument("ids", nargs="+", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--json", action="store_true", help="one JSON object per job")

    p = command("watch", help="wait for a submitted job's end (Nomad: stop it when a rank dies); exit like submit --wait")
    p.add_argument("id", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--timeout", type=_positive_float, default=None, help="stop watching after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    _outage_arg(p)

    p = command("logs", help="a job's output, each line tagged [node K rank R]")
    p.add_argument("id", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--follow", "-f", action="store_true")
    p.add_argument("--node", type=_index, default=None, metavar="K", help="only node K's lines (0 .. nodes-1)")
    p.add_argument("--rank", type=_index, default=None, metavar="R", help="only global rank R's own lines (0 .. world size-1)")
    _outage_arg(p)

    p = command("list", help="recent jobs from their records, with their state (one scheduler query per backend)")
    p.add_argument("--backend", "-b", default=None, help="only this backend's jobs")
    p.add_argument("--state", type=_state_name, default=None,
                   help="only jobs in this state (RUNNING, FAILED, ...; UNREADABLE: records that cannot be read)")
    p.add_argument("--limit", type=_limit, default=50, help="the newest N records (default 50; 0: all)")
    p.add_argument("--json", action="store_true", help="one JSON object per job")

    p = command("cancel", help="cancel jobs")
    p.add_argument("ids", nargs="+", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--purge", action="store_true", help="Nomad: also purge the job")
    p.add_argument("--signal", default=None, help="SLURM: warn the job instead of ending it: its warning signal (slurm.signal, USR2 when unset) reaches every rank")

    p = command("preflight", help="run the NCCL bandwidth test and node checks as the job would run; exit 0 pass, 1 fail")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--size", default="1G", help="bytes per transfer: 4M, 1G, 1GiB, ... (default 1G)")
    p.add_argument("--iters", type=_positive_int, default=3, help="timed runs of each test; the median is reported (default 3)")
    p.add_argument("--min-mibps", type=_positive_float, default=None, help="fail when any pair or the all_gather is slower")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    p.add_argument("--timeout", type=_positive_float, default=None, help="cancel the test job after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")

    p = command("nodes", help="the node ledger: hosts that failed a job as a node would, which new jobs avoid "
                              "until they expire; `nodes clear HOST` forgets one (exit 2 if the ledger does not know it)")
    p.add_argument("action", nargs="?", choices=("clear",), metavar="clear", help="forget HOST")
    p.add_argument("host", nargs="?", metavar="HOST")
    p.add_argument("--json", action="store_true", help="one JSON object per entry")

    p = command("timeline", help="each rank's progress, stall, failure or hang over the job's wall time, "
                                 "drawn in the terminal (and as SVG with --svg)")
    p.add_argument("id", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--svg", default=None, metavar="FILE", help="also write the timeline to FILE as an SVG image")
    p.add_argument("--width", type=_positive_int, default=None, metavar="N",
                   help="characters per line (default: the terminal's width, else 100)")

    command("gc", help="Nomad: delete the secrets (Variables) of every recorded job that ended or that Nomad no "
                       "longer knows; prints each removed Variable; exit 1 if one could not be deleted")

    command("schema", help="print the job file's JSON Schema")
    return ap


def _scheduler(name: str):
    from . import backends

    return backends.get(name)


def cmd_validate(args) -> int:
    from .errors import SpecError
    from .spec import load

    bad = 0
    for f in args.files:
        try:
            s = load(f)
        except SpecError as err:
            _err(str(err))
            bad += 1
            continue
        print(f"{f}: ok ({s.name}: {s.nodes} nodes x {s.nproc_per_node} processes = {s.world_size} ranks)")
    return 2 if bad else 0


def cmd_render(args) -> int:
    from .spec import load

    spec = load(args.file)
    opts = {}
    if args.format:
        if args.backend != "nomad":
            raise UsageError("--format applies to --backend nomad only")
        opts["format"] = args.format
    text = _scheduler(args.backend).render(spec, **opts)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


class Progress:
    """Live progress for --wait: one rewritten line on a terminal, plain lines otherwise."""

    def __init__(self, scheduler, job_id: str, stream=None):
        # sys.stderr at call time, not at import (it may have been replaced since).
        self.scheduler, self.job_id, self.stream = scheduler, job_id, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()

    def _line(self, state) -> str:
        el = int(time.monotonic() - self.start)
        return f"[{el // 60:02d}:{el % 60:02d}] {self.job_id}: {self.scheduler.progress(state)}"

    def change(self, state) -> None:
        line = self._line(state)
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if state.status.terminal else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def tick(self, state) -> None:
        if self.tty and not state.status.terminal:
            self.stream.write("\r\033[K" + self._line(state))
            self.stream.flush()


def cmd_submit(args) -> int:
    from .spec import load

    spec = load(args.file)
    sched = _scheduler(args.backend)
    if args.dry_run:
        dry = sched.dryrun(spec)
        sys.stdout.write(dry.text if dry.text.endswith("\n") else dry.text + "\n")
        sys.stdout.flush()
        # What submit would refuse before sending anything, refused here too (exit 2): an unset
        # secret_env variable names its field; no value is ever shown.
        spec.secret_values()
        return 0
    job_id = sched.submit(spec).id  # the one submit pipeline (backends/base.py), as the library's
    rc = 0
    try:
        _err(f"halo-sched: submitted {spec.name} to {args.backend} as {job_id}")
        if args.wait:
            rc = _wait_after_submit(args, spec, sched, job_id)
    except KeyboardInterrupt:
        _err(f"\nhalo-sched: stopped waiting; {job_id} keeps running (halo-sched cancel {job_id} --backend {args.backend})")
        rc = EXIT_INTERRUPTED
    finally:
        # The job exists whatever happened while waiting: its id is always the last line.
        print(job_id, flush=True)
    return rc


def _wait_after_submit(args, spec, sched, job_id: str) -> int:
    from .core import wait_after_submit

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
        on_log=log if streams else None, on_log_end=lambda err: _err(f"halo-sched: log stream ended: {err}"))
    return _report_end(job_id, state, args.timeout)


def _wait_run(args, spec, sched, job_id: str, watching: bool = False) -> int:
    """``submit --wait`` of a job with ``retry:``: each attempt waited on as a plain job is, the
    next one submitted after a failure ``retry.on`` lists (halo_sched/runs.py); the run's
    attempts and GPU-hours at the end."""
    from .core import wait_after_submit
    from .runs import attempts_of, describe_rows, wait_run

    def one(attempt_id: str, observe) -> "object":
        progress = Progress(sched, attempt_id)

        def changed(st) -> None:
            observe(st)
            if not args.quiet:
                progress.change(st)

        if attempt_id == job_id and watching:  # watch: a job submitted earlier, no placement guard
            from .core import noting

            return sched.wait(attempt_id, timeout=args.timeout, on_change=noting(sched.name, attempt_id, changed),
                              on_tick=None if args.quiet else progress.tick)
        return wait_after_submit(sched, spec, attempt_id, timeout=args.timeout, on_change=changed,
                                 on_tick=None if args.quiet else progress.tick)

    def retried(old: str, state, why: str, new: str) -> None:
        _err(f"halo-sched: {old} {state.describe()}")
        _err(f"halo-sched: retrying ({why} fault) as {new}")

    from . import records

    run_id = ((records.find(job_id, sched.name) or [{}])[0].get("run") or {}).get("id") or job_id
    last_id, state = wait_run(sched, spec, job_id, one, retried)
    if watching:
        from .core import note

        note(sched.name, last_id, state)
    rc = _report_end(last_id, state, args.timeout)
    for line in describe_rows(attempts_of(run_id, sched.name)):
        _err(f"halo-sched: {run_id}: {line.strip()}")
    return rc


def _report_end(job_id: str, state, timeout: float | None) -> int:
    """The last word of a wait on stderr; the exit code: 0 only for a completed job."""
    from .backends.base import JobStatus
    from .errors import EXIT_OUTCOME_UNKNOWN

    if state.status is JobStatus.UNKNOWN:
        _err(f"halo-sched: {job_id}: the scheduler no longer knows this job; its outcome is unknown ({state.reason})")
        return EXIT_OUTCOME_UNKNOWN
    if not state.status.terminal:
        _err(f"halo-sched: {job_id} still {state.status.value} after --timeout {timeout:g}s")
    else:
        _err(f"halo-sched: {job_id} {state.describe()}")
    return 0 if state.status is JobStatus.COMPLETED else 1


def cmd_watch(args) -> int:
    backend = _resolve_one(args.id, args.backend)
    sched = _scheduler(backend)
    _refuse_unknown(backend, sched, args.id)
    from .core import noting

    spec = _run_spec(backend, args.id)
    if spec is not None:  # an attempt of a run with retry: the next attempt after a listed failure
        try:
            return _wait_run(args, spec, sched, args.id, watching=True)
        except KeyboardInterrupt:
            _err("\nhalo-sched: stopped watching; the run's current attempt keeps running (halo-sched list)")
            return EXIT_INTERRUPTED
    progress = Progress(sched, args.id)
    try:
        state = sched.wait(args.id, timeout=args.timeout,
                           on_change=noting(backend, args.id, None if args.quiet else progress.change),
                           on_tick=None if args.quiet else progress.tick)
    except KeyboardInterrupt:
        _err(f"\nhalo-sched: stopped watching; {args.id} keeps running")
        return EXIT_INTERRUPTED
    return _report_end(args.id, state, args.timeout)


def _run_spec(backend: str, job_id: str):
    """The spec of a recorded job that has ``retry:`` (``watch`` then retries as ``submit --wait``
    would), with its job file and git state as recorded; None otherwise."""
    from . import records

    rec = (records.find(job_id, backend) or [{}])[0]
    data = rec.get("spec")
    if not isinstance(data, dict) or not data.get("retry"):
        return None
    from .spec import from_dict

    return from_dict(data, source=f"the record of {job_id}")


def cmd_plan(args) -> int:
    from .spec import load

    spec = load(args.file)
    sched = _scheduler(args.backend)
    from .backends.base import Plans

    if not isinstance(sched, Plans):
        raise UsageError(f"plan asks a scheduler (nomad, slurm); backend {args.backend!r} has no scheduler dry run")
    ok, text = sched.plan(spec)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0 if ok else 1


def _refuse_unknown(backend: str, sched, job_id: str) -> None:
    from .core import unknown_asked

    unknown = unknown_asked(backend, sched, [job_id])
    if unknown:
        raise UnknownJob([job_id], backend, unknown[job_id])


def cmd_status(args) -> int:
    from .core import query_or_last, unknown as unknown_of
    from .errors import EXIT_OUTCOME_UNKNOWN

    states, unknown, fallen, where = {}, [], {}, {}
    for backend, ids in _resolve_ids(args.ids, args.backend).items():
        got, last = query_or_last(backend, _scheduler(backend), ids)
        states.update(got)
        fallen.update(last)
        where.update(dict.fromkeys(ids, backend))
        unknown += [(i, backend, got[i].reason) for i in unknown_of(backend, got, ids)]
    gone = {i for i, _, _ in unknown}
    for job_id in args.ids:
        if job_id in gone:
            continue
        if job_id in fallen:  # the scheduler did not answer: the record's last known state
            fb = fallen[job_id]
            if args.json:
                print(json.dumps({"id": job_id, "status": (fb.last or {}).get("status") or "UNKNOWN",
                                  "live": False, "last_known": fb.last, "unreachable": fb.why}))
            else:
                print(f"{job_id}\t{fb.describe(where[job_id])}")
                _print_run(job_id, where[job_id])
            continue
        st = states[job_id]
        if args.json:
            print(json.dumps({
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
                **({"last_known": st.last_known} if st.last_known is not None else {}),
                # A run's first attempt (retry:): each attempt with its hours, and the totals.
                **_run_json(st.id, where[job_id]),
            }))
        elif st.last_known is not None:
            print(f"{job_id}\t{st.last_known['describe']} (last known: the scheduler no longer knows the job)")
        else:
            print(f"{job_id}\t{st.describe()}")
        if not args.json:
            _print_run(job_id, where[job_id])
    if unknown:
        backends = sorted({b for _, b, _ in unknown})
        raise UnknownJob([i for i, _, _ in unknown], backends[0] if len(backends) == 1 else None,
                         unknown[0][2] if len(unknown) == 1 else "")
    if fallen:
        from .outage import display_name

        names = ", ".join(sorted({display_name(where[i]) for i in fallen}))
        _err(f"halo-sched: {names} did not answer: showing the last known state from the job record "
             f"(--debug: why)")
        from .errors import debug

        if debug():
            _err(f"  {next(iter(fallen.values())).why}")
        if any(not fb.last for fb in fallen.values()):
            return 1  # nothing is known of some id: the scheduler could not be reached
        # An end seen earlier stays the end; anything else may have changed since.
        if not all(fb.final for fb in fallen.values()):
            return EXIT_OUTCOME_UNKNOWN
    return 0


def _run_json(job_id: str, backend: str) -> dict:
    """``status --json RUN``: ``{"run": {"id", "attempts": [...], "totals": {...}}}``; {} otherwise."""
    from . import records
    from .runs import attempts_of, totals

    run = (records.find(job_id, backend) or [{}])[0].get("run")
    if not isinstance(run, dict):
        return {}
    if run.get("id") != job_id:  # a later attempt: which run and which attempt it is
        return {"run": {"id": run.get("id"), "attempt": run.get("attempt")}}
    rows = attempts_of(job_id, backend)
    return {"run": {"id": job_id, "attempt": 0, "attempts": [a.to_dict() for a in rows], "totals": totals(rows)}}


def _print_run(job_id: str, backend: str) -> None:
    """``status RUN``: under a run's first attempt, each attempt (its outcome, cause, excluded
    hosts, node-hours and GPU-hours) and the run's totals, from the job records."""
    from . import records
    from .runs import attempts_of, describe_rows

    rec = (records.find(job_id, backend) or [{}])[0]
    run = rec.get("run")
    if not isinstance(run, dict) or run.get("id") != job_id:
        return
    for line in describe_rows(attempts_of(job_id, backend)):
        print(f"{job_id}\t{line.strip()}")


def cmd_list(args) -> int:
    from . import records
    from .core import recent

    rows = recent(args.backend, args.state, args.limit, _scheduler, on_error=_list_note)
    for r, status, text, known in rows:
        if isinstance(r, records.BadRecord):
            if args.json:
                print(json.dumps({"id": r.id, "backend": r.backend, "status": status, "describe": text, "live": False,
                                  "record": str(r.path), "error": r.reason}))
            else:
                print(f"{r.id}\t{r.backend}\t\t{text}")
        elif args.json:
            print(json.dumps({"id": r["id"], "backend": r["backend"], "name": r.get("name"), "status": status,
                              "describe": text, "live": known, "submitted": r.get("submitted_iso"),
                              **({"run": r["run"]} if isinstance(r.get("run"), dict) else {}),
                              "submit_dir": r.get("submit_dir"), "record": str(records.path_for(r["id"], r["backend"]))}))
        else:
            when = (r.get("submitted_iso") or "")[:19].replace("T", " ")
            run = r.get("run") if isinstance(r.get("run"), dict) else None
            from .runs import number

            rid = "".join(c for c in str(run.get("id"))[:256] if c.isprintable()) if run else ""
            of_run = f" [run {rid}, attempt {number(run.get('attempt')) + 1}]" if run else ""
            print(f"{r['id']}\t{r['backend']}\t{when}\t{text}{'' if known else ' (last known)'}{of_run}")
    return 0


def _list_note(backend: str, err: HaloError) -> None:
    """``list``: one line of at most 160 characters for a backend that did not answer (its rows
    show the last known states): the error with its advice when that fits, else the condition."""
    head, tail = f"halo-sched: {backend}: ", "; states below: last known"
    text = " ".join(str(err).split())
    if len(head + text + tail) > 160:
        text = " ".join((err.short or text).split())
    room = 160 - len(head + tail)
    _err(head + (text if len(text) <= room else text[:room - 3] + "...") + tail)
    from .errors import debug

    if debug() and (err.__cause__ or err.__context__):
        from .errors import cause_chain

        _err(f"  {cause_chain(err)}")


def cmd_logs(args) -> int:
    from .logtags import select

    backend = _resolve_one(args.id, args.backend)
    sched = _scheduler(backend)
    _refuse_unknown(backend, sched, args.id)
    if args.node is not None or args.rank is not None:
        _check_node_rank(args, backend, sched)
    for line in select(sched.logs(args.id, follow=args.follow), args.node, args.rank):
        sys.stdout.write(line)
        sys.stdout.flush()
        if isinstance(sys.stdout, _PipeGuard) and sys.stdout.broken:
            break  # the reader went away (| head): nothing more to show
    return 0


def _check_node_rank(args, backend: str, sched) -> None:
    """``--node``/``--rank`` inside the job (its record's size, else the scheduler's node count)."""
    from .core import job_size

    nodes, per_node = job_size(backend, sched, args.id)
    if args.node is not None and nodes and args.node >= nodes:
        raise UsageError(f"--node {args.node}: job {shown(args.id)} has {nodes} node{'s' if nodes != 1 else ''} "
                         f"(0..{nodes - 1})")
    world = nodes * per_node if nodes and per_node else None
    if args.rank is not None and world and args.rank >= world:
        raise UsageError(f"--rank {args.rank}: job {shown(args.id)} has {world} rank{'s' if world != 1 else ''} (0..{world - 1})")


def cmd_cancel(args) -> int:
    from .core import cancel_known

    groups = _resolve_ids(args.ids, args.backend)
    opts: dict = {}
    if args.purge:
        if set(groups) != {"nomad"}:
            raise UsageError("--purge applies to --backend nomad only")
        opts["purge"] = True
    if args.signal:
        if set(groups) != {"slurm"}:
            raise UsageError("--signal applies to --backend slurm only")
        opts["signal"] = _warning_signal(args.signal, groups["slurm"])
    done, unknown, where, ended = cancel_known(groups, _scheduler, **opts)
    what = f"signal {args.signal}" if args.signal else "cancel"
    for job_id in done:
        _err(f"halo-sched: {what} requested for {job_id}")
    for job_id, words in ended.items():  # nothing to do: the job is not running (exit 0)
        words = " ".join(words.split())
        head, tail = f"halo-sched: {job_id} already ended (", f"); nothing to {'signal' if args.signal else 'cancel'}"
        room = max(40, 160 - len(head + tail))
        _err(head + (words if len(words) <= room else words[:room - 3] + "...") + tail)
    if unknown:
        raise UnknownJob(list(unknown), next(iter(where)) if len(where) == 1 else None,
                         reason=next(iter(unknown.values())) if len(unknown) == 1 else "",
                         others_done=" (the others were cancelled)" if done else "")
    return 0


def _warning_signal(given: str, ids: list[str]) -> str:
    """``cancel --signal``'s signal, which must be each job's warning signal: the batch script
    traps that one alone, and any other would end it (and the job) by its default action."""
    from .core import warning_of
    from .values import WARNING_SIGNALS, parse_warning

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


def cmd_preflight(args) -> int:
    from . import preflight
    from .spec import load
    from .values import parse_size

    spec = load(args.file)
    try:
        size = parse_size(args.size)
    except ValueError as err:
        raise UsageError(f"--size: {err}") from None
    sched = _scheduler(args.backend)
    progress = {}

    def on_submit(job_id: str) -> None:
        _err(f"halo-sched: preflight of {spec.name} submitted to {args.backend} as {job_id}")
        progress["p"] = Progress(sched, job_id)

    def on_change(state) -> None:
        if not args.quiet and "p" in progress:
            progress["p"].change(state)

    rep = preflight.run(spec, args.backend, size, min_mibps=args.min_mibps, iters=args.iters,
                        timeout=args.timeout, on_change=on_change, on_submit=on_submit)
    if rep.result is None and rep.log_tail:
        _err("halo-sched: the test did not report; the job's last lines:")
        for line in rep.log_tail:
            _err(f"  {line}")
    if args.json:
        print(preflight.as_json(rep))
    else:
        sys.stdout.write(preflight.format_table(rep))
    return 0 if rep.passed else 1


def cmd_nodes(args) -> int:
    """``nodes``: the active ledger entries; ``nodes clear HOST``: forget HOST."""
    from . import ledger

    if args.action is None:
        if args.host is not None:
            raise UsageError(f"nodes: unexpected {shown(args.host)} (did you mean `nodes clear {shown(args.host)}`?)")
        ledger.expiry_hours()  # a bad HALO_SCHED_NODE_EXPIRY_HOURS is said here, exit 2
        rows = ledger.active()
        if args.json:
            for e in rows:
                print(json.dumps(e.to_dict(), sort_keys=True))
            return 0
        if not rows:
            _err(f"halo-sched: the node ledger is empty (new jobs avoid no host) [{ledger.path()}]")
            return 0
        fmt = "%Y-%m-%d %H:%M:%S"

        def safe(text: str) -> str:  # the file is data: nothing in it drives the terminal
            return "".join(c if c.isprintable() else "?" for c in text)[:200]

        table = [("HOST", "REASON", "JOB", "SINCE", "EXPIRES")] + [
            (e.host, safe(e.reason), safe(f"{e.job}@{e.backend}"), time.strftime(fmt, time.localtime(e.since)),
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
        print(json.dumps({"host": host, "cleared": gone}))
    else:
        _err(f"halo-sched: {host}: forgot {gone} ledger {'entry' if gone == 1 else 'entries'}; new jobs may run there")
    return 0


def cmd_timeline(args) -> int:
    from .timeline import main as timeline

    backend = _resolve_one(args.id, args.backend)
    sched = _scheduler(backend)
    _refuse_unknown(backend, sched, args.id)
    return timeline(args.id, backend, sched, args.svg, args.width)


def cmd_schema(args) -> int:
    from .spec import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_gc(args) -> int:
    """The logic is the Nomad backend's (``collect_secrets``); this only picks the records."""
    from . import records

    ids = [r["id"] for r in records.load_all() if r.get("backend") == "nomad"]
    if not ids:
        _err("halo-sched: gc: no Nomad job records; nothing to delete")
        return 0
    removed, kept, failed, notes = _scheduler("nomad").collect_secrets(ids)
    for job_id, path in removed:
        print(f"{job_id}\t{path}", flush=True)
    for line in notes + failed:
        _err(f"halo-sched: gc: {line}")
    _err(f"halo-sched: gc: deleted the secrets of {len(removed)} ended job{'s' * (len(removed) != 1)}"
         + (f"; kept those of {len(kept)} job{'s' * (len(kept) != 1)} still pending or running" if kept else ""))
    return 1 if failed else 0


COMMANDS = {
    "gc": cmd_gc,
    "validate": cmd_validate, "render": cmd_render, "submit": cmd_submit, "plan": cmd_plan,
    "status": cmd_status, "watch": cmd_watch, "logs": cmd_logs, "cancel": cmd_cancel, "schema": cmd_schema,
    "preflight": cmd_preflight, "list": cmd_list, "nodes": cmd_nodes, "timeline": cmd_timeline,
}


# Commands that read a job file (and build its models).
_SPEC_COMMANDS = {"validate", "render", "submit", "plan", "preflight", "schema"}


def _show_layout_warnings() -> None:
    """Layout warnings (parallelism that runs but does nothing) as one stderr line each, every time."""
    import warnings

    from .layout import LayoutWarning

    warnings.simplefilter("always", LayoutWarning)
    shown = warnings.showwarning

    def show(message, category, *args, **kw):
        if issubclass(category, LayoutWarning):
            _err(f"halo-sched: warning: {message}")
        else:
            shown(message, category, *args, **kw)

    warnings.showwarning = show


class _PipeGuard:
    """sys.stdout or sys.stderr, minus the broken pipe: when the reader goes away (``| head``),
    the stream's descriptor is pointed at /dev/null (as Python's documentation of SIGPIPE
    advises) and everything after is discarded. The command itself carries on to its own exit
    code, which a pipeline under ``set -o pipefail`` then sees; no write, flush or interpreter
    exit raises BrokenPipeError. ``broken`` tells a command that streams (``logs``) to stop."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def _discard(self) -> None:
        self.broken = True
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return
        try:
            self._stream.flush()  # what the buffer still holds goes to /dev/null now
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._discard()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._discard()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PipeGuard(sys.stdout), _PipeGuard(sys.stderr)
    try:
        return _main(argv)
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        for guard in (sys.stdout, sys.stderr):
            if isinstance(guard, _PipeGuard):
                guard.flush()
        sys.stdout, sys.stderr = saved


def _main(argv: list[str] | None) -> int:
    parser = build_parser(only=_command_in(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    from .errors import set_debug

    set_debug(args.debug)
    from . import outage

    outage.set_note_sink(_outage_line)
    if getattr(args, "outage_budget", None) is not None:
        outage.set_default_budget(args.outage_budget)
    backend_given = "backend" in vars(args)  # the commands that take --backend
    if backend_given and args.backend is None and args.command not in _BY_ID | {"list"}:
        from . import backends

        args.backend = backends.default()
    if backend_given and args.backend is not None:
        from . import backends

        if args.backend not in backends.BUILTIN and args.backend not in backends.names():
            parser.error(f"argument --backend: unknown backend {args.backend!r} (choose from {', '.join(backends.names())})")
    _show_layout_warnings()
    # pydantic reads every installed package's metadata for plugins when the first model is built
    # (~30 ms of start-up with torch installed); the job file's models use none. Only while this
    # process builds them: the environment the nodes inherit is left as it was.
    no_plugins = "PYDANTIC_DISABLE_PLUGINS" not in os.environ
    if no_plugins and args.command in _SPEC_COMMANDS:
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
        try:
            from . import spec  # noqa: F401 - builds the models now, without the plugin scan
        except Exception:  # noqa: S110 - the command imports it again and reports the error its way
            pass
        finally:
            os.environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
    try:
        return COMMANDS[args.command](args)
    except HaloError as err:
        from .errors import debug

        _err(f"halo-sched: {err}")
        if debug() and (err.__cause__ or err.__context__):
            from .errors import cause_chain

            _err(f"  {cause_chain(err)}")
        return err.exit_code
    except KeyboardInterrupt:
        _err("halo-sched: interrupted")
        return EXIT_INTERRUPTED
    except Exception as err:  # a bug, not bad input: one line, the traceback on request
        from .errors import debug

        if debug():
            raise
        _err(f"halo-sched: internal error: {type(err).__name__}: {_one_line(err)} (--debug shows the traceback)")
        return 1


def _one_line(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


if __name__ == "__main__":
    raise SystemExit(main())
