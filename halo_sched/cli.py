"""The ``halo-sched`` command. Its contract is fixed (pipelines depend on it):

- machine-readable results go to stdout (``submit``: the job id alone on the last line);
  human text goes to stderr;
- exit 0 on success, 1 when a job or the scheduler failed, 2 for bad input (never a traceback).

Imports stay lazy: start-up must not pay for backends it does not use, and never imports torch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .errors import HaloError, UsageError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", "-b", default=os.environ.get("HALO_SCHED_BACKEND", "local"),
        help="local (default, or $HALO_SCHED_BACKEND), slurm or nomad",
    )


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = argparse.ArgumentParser(
        prog="halo-sched",
        description="Compile one multi-node torchrun job file to SLURM, Nomad or local processes; submit, watch, cancel.",
    )
    ap.add_argument("--version", action="version", version=f"halo-sched {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("validate", help="check job files; exit 2 naming each bad field")
    p.add_argument("files", nargs="+", metavar="FILE")

    p = sub.add_parser("render", help="print what would be submitted")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--format", choices=("hcl", "json"), default=None, help="Nomad only: HCL (default) or the API JSON")

    p = sub.add_parser("submit", help="submit a job; prints its id on the last line of stdout")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--wait", action="store_true", help="wait for the end; exit 0 only if the job completed")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted, submit nothing")
    p.add_argument("--timeout", type=float, default=None, help="with --wait: stop waiting after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="with --wait: no live logs or progress")

    p = sub.add_parser("plan", help="Nomad: ask the scheduler whether each node group can place")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)

    p = sub.add_parser("status", help="state of one or more jobs (one scheduler query)")
    p.add_argument("ids", nargs="+", metavar="ID")
    _backend_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object per job")

    p = sub.add_parser("watch", help="wait for a submitted job's end (Nomad: stop it when a rank dies); exit like submit --wait")
    p.add_argument("id", metavar="ID")
    _backend_arg(p)
    p.add_argument("--timeout", type=float, default=None, help="stop watching after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")

    p = sub.add_parser("logs", help="a job's output, each line with its node")
    p.add_argument("id", metavar="ID")
    _backend_arg(p)
    p.add_argument("--follow", "-f", action="store_true")

    p = sub.add_parser("cancel", help="cancel jobs")
    p.add_argument("ids", nargs="+", metavar="ID")
    _backend_arg(p)
    p.add_argument("--purge", action="store_true", help="Nomad: also purge the job")
    p.add_argument("--signal", default=None, help="SLURM: send this signal to the job's steps instead of ending it")

    p = sub.add_parser("preflight", help="run the NCCL bandwidth test and node checks as the job would run; exit 0 pass, 1 fail")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--size", default="1G", help="bytes per transfer: 4M, 1G, 1GiB, ... (default 1G)")
    p.add_argument("--iters", type=int, default=3, help="timed runs of each test; the median is reported (default 3)")
    p.add_argument("--min-mibps", type=float, default=None, help="fail when any pair or the all_gather is slower")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    p.add_argument("--timeout", type=float, default=None, help="cancel the test job after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")

    sub.add_parser("schema", help="print the job file's JSON Schema")
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
    dry = sched.dryrun(spec)
    if args.dry_run:
        sys.stdout.write(dry.text if dry.text.endswith("\n") else dry.text + "\n")
        return 0
    job_id = sched.schedule(dry)
    rc = 0
    try:
        _err(f"halo-sched: submitted {spec.name} to {args.backend} as {job_id}")
        if args.wait:
            rc = _wait_after_submit(args, spec, sched, job_id)
    except KeyboardInterrupt:
        _err(f"\nhalo-sched: stopped waiting; {job_id} keeps running (halo-sched cancel {job_id} --backend {args.backend})")
        rc = 130
    finally:
        # The job exists whatever happened while waiting: its id is always the last line.
        try:
            print(job_id, flush=True)
        except BrokenPipeError:
            pass
    return rc


def _wait_after_submit(args, spec, sched, job_id: str) -> int:
    stream_logs = not args.quiet and getattr(sched, "streams_logs", False)
    follower = None
    if stream_logs:
        import threading

        def follow():
            try:
                for line in sched.logs(job_id, follow=True):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            except HaloError as err:
                _err(f"halo-sched: log stream ended: {err}")

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
    progress = Progress(sched, job_id)
    if stream_logs:
        progress.tty = False  # a rewritten line would garble the interleaved logs
    state = sched.watch(spec, job_id, on_progress=None if args.quiet else progress.change)
    if not state.status.terminal:
        state = sched.wait(
            job_id, timeout=args.timeout,
            on_change=None if args.quiet else progress.change,
            on_tick=None if args.quiet else progress.tick,
        )
    if follower is not None:
        follower.join(timeout=5)
    return _report_end(job_id, state, args.timeout)


def _report_end(job_id: str, state, timeout: float | None) -> int:
    """The last word of a wait on stderr; the exit code: 0 only for a completed job."""
    from .backends.base import JobStatus

    if state.status is JobStatus.UNKNOWN:
        _err(f"halo-sched: {job_id}: the scheduler no longer knows this job; its outcome is unknown ({state.reason})")
    elif not state.status.terminal:
        _err(f"halo-sched: {job_id} still {state.status.value} after --timeout {timeout:g}s")
    else:
        _err(f"halo-sched: {job_id} {state.describe()}")
    return 0 if state.status is JobStatus.COMPLETED else 1


def cmd_watch(args) -> int:
    sched = _scheduler(args.backend)
    progress = Progress(sched, args.id)
    try:
        state = sched.wait(args.id, timeout=args.timeout, on_change=None if args.quiet else progress.change,
                           on_tick=None if args.quiet else progress.tick)
    except KeyboardInterrupt:
        _err(f"\nhalo-sched: stopped watching; {args.id} keeps running")
        return 130
    return _report_end(args.id, state, args.timeout)


def cmd_plan(args) -> int:
    from .spec import load

    spec = load(args.file)
    sched = _scheduler(args.backend)
    plan = getattr(sched, "plan", None)
    if plan is None:
        raise UsageError(f"plan is a Nomad command; backend {args.backend!r} has no scheduler dry run")
    ok, text = plan(spec)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0 if ok else 1


def cmd_status(args) -> int:
    states = _scheduler(args.backend).describe(args.ids)
    for job_id in args.ids:
        st = states[job_id]
        if args.json:
            print(json.dumps({
                "id": st.id, "status": st.status.value, "raw_state": st.raw_state, "exit_code": st.exit_code,
                "nodes_total": st.nodes_total, "nodes_running": st.nodes_running, "reason": st.reason,
                # Nomad: per node rank, the allocation that runs it (alloc id, node, client status).
                **({"nodes": st.extra["nodes"]} if "nodes" in st.extra else {}),
                # SLURM: how many times the job was requeued (the run is restarts + 1).
                **({"restarts": st.extra["restarts"]} if "restarts" in st.extra else {}),
            }))
        else:
            print(f"{job_id}\t{st.describe()}")
    return 0


def cmd_logs(args) -> int:
    sched = _scheduler(args.backend)
    try:
        for line in sched.logs(args.id, follow=args.follow):
            sys.stdout.write(line)
            sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


def cmd_cancel(args) -> int:
    opts: dict = {}
    if args.purge:
        if args.backend != "nomad":
            raise UsageError("--purge applies to --backend nomad only")
        opts["purge"] = True
    if args.signal:
        if args.backend != "slurm":
            raise UsageError("--signal applies to --backend slurm only")
        opts["signal"] = args.signal
    _scheduler(args.backend).cancel(args.ids, **opts)
    what = f"signal {args.signal}" if args.signal else "cancel"
    for job_id in args.ids:
        _err(f"halo-sched: {what} requested for {job_id}")
    return 0


def cmd_preflight(args) -> int:
    from . import preflight
    from .spec import load, parse_size

    spec = load(args.file)
    try:
        size = parse_size(args.size)
    except ValueError as err:
        raise UsageError(f"--size: {err}") from None
    if args.min_mibps is not None and not args.min_mibps > 0:
        raise UsageError("--min-mibps must be a positive number of MiB/s")
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


def cmd_schema(args) -> int:
    from .spec import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


COMMANDS = {
    "validate": cmd_validate, "render": cmd_render, "submit": cmd_submit, "plan": cmd_plan,
    "status": cmd_status, "watch": cmd_watch, "logs": cmd_logs, "cancel": cmd_cancel, "schema": cmd_schema,
    "preflight": cmd_preflight,
}


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "backend", None) is not None:
        from . import backends

        if args.backend not in backends.BUILTIN and args.backend not in backends.names():
            parser.error(f"argument --backend: unknown backend {args.backend!r} (choose from {', '.join(backends.names())})")
    _show_layout_warnings()
    try:
        return COMMANDS[args.command](args)
    except HaloError as err:
        _err(f"halo-sched: {err}")
        return err.exit_code
    except KeyboardInterrupt:
        _err("halo-sched: interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as err:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("HALO_SCHED_DEBUG"):
            raise
        _err(f"halo-sched: internal error: {type(err).__name__}: {err} (set HALO_SCHED_DEBUG=1 for a traceback)")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
