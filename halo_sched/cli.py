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
    # None until resolved: for a job id, its record names the backend (see _resolve_ids).
    p.add_argument(
        "--backend", "-b", default=None,
        help="local, slurm or nomad (default: a job id's record, else $HALO_SCHED_BACKEND, else local)",
    )


def _default_backend() -> str:
    return os.environ.get("HALO_SCHED_BACKEND", "local")


# Commands that take job ids: without --backend, each id's job record says where it went.
_BY_ID = {"status", "watch", "logs", "cancel"}


def _resolve_ids(ids, backend: str | None) -> dict[str, list[str]]:
    """backend -> ids. An explicit --backend wins; else the id's record; else the default."""
    from . import records

    if backend:
        return {backend: list(ids)}
    out: dict[str, list[str]] = {}
    for job_id in ids:
        found = sorted({r["backend"] for r in records.find(job_id)})
        if len(found) > 1:
            raise UsageError(f"job id {job_id!r} has records for backends {', '.join(found)}; give --backend")
        out.setdefault(found[0] if found else _default_backend(), []).append(job_id)
    return out


def _resolve_one(job_id: str, backend: str | None) -> str:
    return next(iter(_resolve_ids([job_id], backend)))


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

    p = sub.add_parser("logs", help="a job's output, each line tagged [node K rank R]")
    p.add_argument("id", metavar="ID")
    _backend_arg(p)
    p.add_argument("--follow", "-f", action="store_true")
    p.add_argument("--node", type=int, default=None, metavar="K", help="only node K's lines")
    p.add_argument("--rank", type=int, default=None, metavar="R", help="only global rank R's own lines")

    p = sub.add_parser("list", help="recent jobs from their records, with their state (one scheduler query per backend)")
    p.add_argument("--backend", "-b", default=None, help="only this backend's jobs")
    p.add_argument("--state", default=None, help="only jobs in this state (RUNNING, FAILED, ...)")
    p.add_argument("--limit", type=int, default=50, help="the newest N records (default 50; 0: all)")
    p.add_argument("--json", action="store_true", help="one JSON object per job")

    p = sub.add_parser("cancel", help="cancel jobs")
    p.add_argument("ids", nargs="+", metavar="ID")
    _backend_arg(p)
    p.add_argument("--purge", action="store_true", help="Nomad: also purge the job")
    p.add_argument("--signal", default=None, help="SLURM: warn the job instead of ending it: its warning signal (slurm.signal, USR2 when unset) reaches every rank")

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
    from .records import git_state_started, record_submit

    git = git_state_started(spec)  # read while the scheduler answers the submit
    job_id = sched.schedule(dry)
    record_submit(sched, dry, job_id, args.file, git)
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
    _note(args.backend, job_id, state)
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
    sched = _scheduler(_resolve_one(args.id, args.backend))
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
    states = {}
    for backend, ids in _resolve_ids(args.ids, args.backend).items():
        states.update(_describe_and_note(backend, ids))
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
                # Which rank failed first, and every failure the nodes reported.
                **({"failure": st.failure.to_dict()} if st.failure is not None else {}),
                **({"last_known": st.extra["last_known"]} if "last_known" in st.extra else {}),
            }))
        elif "last_known" in st.extra:
            print(f"{job_id}\t{st.extra['last_known']['describe']} (last known: the scheduler no longer knows the job)")
        else:
            print(f"{job_id}\t{st.describe()}")
    return 0


def _note(backend: str, job_id: str, state) -> dict | None:
    """Keep ``state`` in the job's record (when the scheduler knows it); return the record."""
    from . import records

    for rec in records.find(job_id, backend):
        try:
            records.update_state(rec, state)
        except OSError:
            pass
        return rec
    return None


def _describe_and_note(backend: str, ids) -> dict:
    """One describe for ``ids``; each state the scheduler knows is kept in the job's record, and
    for a job the scheduler forgot, the record's last known state is shown instead."""
    from .backends.base import JobStatus

    states = _scheduler(backend).describe(ids)
    for job_id, st in states.items():
        rec = _note(backend, job_id, st)
        last = (rec or {}).get("last_state")
        if st.status is JobStatus.UNKNOWN and last:
            st.extra["last_known"] = last
    return states


def cmd_list(args) -> int:
    from . import records
    from .backends.base import JobStatus

    recs = [r for r in records.load_all() if not args.backend or r["backend"] == args.backend]
    if args.limit:
        recs = recs[:args.limit]
    by_backend: dict[str, list[dict]] = {}
    for r in recs:
        by_backend.setdefault(r["backend"], []).append(r)
    rows = []
    for backend, rs in by_backend.items():
        try:
            states = _scheduler(backend).describe([r["id"] for r in rs])  # one query for all of them
        except HaloError as err:
            _err(f"halo-sched: {backend}: {err}; showing the last known states")
            states = {}
        for r in rs:
            st = states.get(r["id"])
            last = r.get("last_state") or {}
            if st is not None and st.status is not JobStatus.UNKNOWN:
                try:
                    records.update_state(r, st)
                except OSError:
                    pass
                status, text, known = st.status.value, st.describe(), True
            else:  # the scheduler forgot it (or did not answer): what we saw last
                status = last.get("status", "UNKNOWN")
                text, known = last.get("describe", "UNKNOWN"), False
            rows.append((r, status, text, known))
    if args.state:
        rows = [row for row in rows if row[1] == args.state.upper()]
    for r, status, text, known in rows:
        if args.json:
            print(json.dumps({"id": r["id"], "backend": r["backend"], "name": r.get("name"), "status": status,
                              "describe": text, "live": known, "submitted": r.get("submitted_iso"),
                              "submit_dir": r.get("submit_dir"), "record": str(records.path_for(r["id"], r["backend"]))}))
        else:
            when = (r.get("submitted_iso") or "")[:19].replace("T", " ")
            print(f"{r['id']}\t{r['backend']}\t{when}\t{text}{'' if known else ' (last known)'}")
    return 0


def cmd_logs(args) -> int:
    from .logtags import select

    sched = _scheduler(_resolve_one(args.id, args.backend))
    try:
        for line in select(sched.logs(args.id, follow=args.follow), args.node, args.rank):
            sys.stdout.write(line)
            sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


def cmd_cancel(args) -> int:
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
    for backend, ids in groups.items():
        _scheduler(backend).cancel(ids, **opts)
    what = f"signal {args.signal}" if args.signal else "cancel"
    for job_id in args.ids:
        _err(f"halo-sched: {what} requested for {job_id}")
    return 0


def _warning_signal(given: str, ids: list[str]) -> str:
    """``cancel --signal``'s signal, which must be each job's warning signal: the batch script
    traps that one alone, and any other would end it (and the job) by its default action."""
    from . import records
    from .spec import SLURM_SIGNAL_RE, WARNING_SIGNALS

    m = SLURM_SIGNAL_RE.match(given.upper())
    name = m.group(2) if m and not m.group(1) and not m.group(3) else None
    if name not in WARNING_SIGNALS:
        raise UsageError(f"--signal {given}: the warning is one of {', '.join(WARNING_SIGNALS)} "
                         "(the job's slurm.signal, USR2 when unset)")
    for job_id in ids:
        for rec in records.find(job_id, "slurm"):
            own = ((rec.get("spec") or {}).get("slurm") or {}).get("signal")
            mo = SLURM_SIGNAL_RE.match(own) if isinstance(own, str) else None
            theirs = mo.group(2) if mo else "USR2"
            if theirs != name:
                raise UsageError(f"--signal {given}: job {job_id}'s warning is {theirs} (slurm.signal); its batch "
                                 f"script would end on {name}: send {theirs}")
    return name


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
    "preflight": cmd_preflight, "list": cmd_list,
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "backend", "") is None and args.command not in _BY_ID | {"list"}:
        args.backend = _default_backend()
    if getattr(args, "backend", None) is not None:
        from . import backends

        if args.backend not in backends.BUILTIN and args.backend not in backends.names():
            parser.error(f"argument --backend: unknown backend {args.backend!r} (choose from {', '.join(backends.names())})")
    _show_layout_warnings()
    # pydantic reads every installed package's metadata for plugins when the first model is built
    # (~30 ms of start-up with torch installed); the job file's models use none. Only while this
    # process builds them: the environment the nodes inherit is left as it was.
    no_plugins = "PYDANTIC_DISABLE_PLUGINS" not in os.environ
    # Its plugin loader's module imports importlib.metadata (~25 ms) even when plugins are off:
    # a stand-in that finds no plugins answers while the models are built, and is removed after.
    stub = no_plugins and "pydantic.plugin._loader" not in sys.modules and args.command in _SPEC_COMMANDS
    if no_plugins:
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    if stub:
        import types

        loader = types.ModuleType("pydantic.plugin._loader")
        loader.get_plugins = lambda: ()
        sys.modules["pydantic.plugin._loader"] = loader
    try:
        if no_plugins and args.command in _SPEC_COMMANDS:
            from . import spec  # noqa: F401 - builds the models now, without the plugin scan
    except Exception:  # noqa: S110 - the command imports it again and reports the error its way
        pass
    finally:
        if no_plugins:
            os.environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
        if stub and sys.modules.get("pydantic.plugin._loader") is loader:
            del sys.modules["pydantic.plugin._loader"]
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
