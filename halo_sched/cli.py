"""The ``halo-sched`` command. Its contract is fixed (pipelines depend on it):

- machine-readable results go to stdout (``submit``: the job id alone on the last line, or
  with ``--json`` one JSON object);
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
      ended, which it says; ``cancel --wait``: and each one has ended)
1     a job or the scheduler failed: the job ended other than COMPLETED or still ran at
      ``--timeout`` (``cancel --wait``: or its run went on); the scheduler refused a request or could not be reached, and nothing
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
its further output discarded (``logs`` stops reading). A closed stdout (``>&-``) or one that
cannot be written (a full disk) loses only the output: the command does what it was asked and
exits with its own code, saying so on stderr. Everything written to the terminal passes through
``halo_sched.node.text.escape_controls`` (a job's text never drives the terminal).

Imports stay lazy: start-up must not pay for backends it does not use, and never imports torch.

This module parses the command line and runs the command it names; the commands themselves are in
halo_sched/commands/ (``COMMANDS`` below says which module holds each; only that one is imported),
what they write to the terminal in halo_sched/commands/__init__.py. A new command: its arguments in
``build_parser``, its function ``cmd_NAME(args, scheduler)`` in a module of halo_sched/commands/,
its line in ``COMMANDS``.
"""
from __future__ import annotations

import argparse
import sys

from .commands import PipeGuard, outage_line, say
from .errors import EXIT_INTERRUPTED, HaloError, shown


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
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(why.format(value))
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1, "{} is not a positive number")


def _since(text: str) -> float:
    """``list --since``, ``logs --since``: an age (30m, 12h, 7d) or an ISO date/time, as the epoch
    seconds it means (values.parse_since, the library's too)."""
    import time

    from .values import parse_since

    try:
        return parse_since(text, time.time())
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: ``timeline --width``: wider than any terminal, and a bound on the rows built (ranks x width).
MAX_WIDTH = 1000


def _width(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"{value}: at most {MAX_WIDTH} characters per line")
    return value


#: ``list --limit``'s largest count (values.py: ``halo_sched.list(limit=)`` keeps to it too).
from .values import MAX_LIMIT  # noqa: E402


def _limit(text: str) -> int:
    """``list --limit``: a positive count, or 0 for all (as documented)."""
    value = _whole(text, 0, "{}: give a positive count (or 0 for every record)")
    if value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{text[:40]}{'...' if len(text) > 40 else ''}: at most {MAX_LIMIT} "
                                         "(0: every record)")
    return value


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


#: ``--set``: the longest field path and value taken (a job file's paths are short; its values bounded too).
MAX_SET_PATH, MAX_SET_VALUE = 200, 65536


def _setting(text: str) -> tuple[str, object]:
    """``--set KEY.PATH=VALUE``: the dotted field path and its value, read as in a job file (a
    YAML scalar, or a flow list/mapping: ``trainer.args=[--lr, "0.1"]``); the changes then
    follow ``halo_sched.with_changes``'s rules (halo_sched/commands/jobfile.py ``load_job``)."""
    path, eq, value = text.partition("=")
    path = path.strip()
    if not eq or not path:
        raise argparse.ArgumentTypeError(f"{shown(text)}: give KEY.PATH=VALUE, such as slurm.partition=gpu")
    if len(path) > MAX_SET_PATH:
        raise argparse.ArgumentTypeError(f"{shown(path)}: a field path of {len(path)} characters (at most {MAX_SET_PATH})")
    if len(value) > MAX_SET_VALUE:
        raise argparse.ArgumentTypeError(f"{path}: a value of {len(value)} characters (at most {MAX_SET_VALUE}; "
                                         "put large values in the job file)")
    from .spec import yaml_value

    try:
        return path, yaml_value(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{path}: {err}") from None


def _set_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", type=_setting, default=[], metavar="KEY.PATH=VALUE",
                   help="change a field of the job file first, as halo_sched.with_changes does (dotted names, "
                        "a list item by its index: servers.0.port=8000); VALUE is YAML as in the file (4, gpu, "
                        "'[--lr, \"0.1\"]'); repeatable, the last one of a path wins")


def _state_name(text: str) -> str:
    """``list --state``: jobstate.py ``state_named``, as ``halo_sched.list(state=)``."""
    from .jobstate import state_named

    try:
        return state_named(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: ``cancel --wait``'s bound when --timeout is not given: the library's (``Job.cancel(wait=True)``).
CANCEL_WAIT_S = 60.0
#: The shells ``completion`` writes a script for (halo_sched/commands/completion.py).
SHELLS = ("bash", "zsh", "fish")

# Commands that take job ids: without --backend, each id's job record says where it went.
_BY_ID = {"status", "watch", "logs", "cancel", "timeline"}


class _Unread:
    """Stands in for the parser of a command that this run does not parse (see build_parser): its
    arguments are not built."""

    def add_argument(self, *args, **kw) -> None:
        pass

    def set_defaults(self, **kw) -> None:
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
    p.add_argument("--backend", "-b", default=None,
                   help="whose nodes run it, for trainer.script (default: $HALO_SCHED_BACKEND, else local): local "
                        "and SLURM on the host read this machine's files, so the script is checked; an image or "
                        "Nomad's task cannot be looked into (a warning says so)")
    _set_arg(p)
    p.add_argument("--json", action="store_true",
                   help="one JSON object per file on stdout: {file, ok, name, nodes, ...} or {file, ok: false, "
                        "problems: [{field, line, message}]}; warnings too")

    p = command("render", help="print what would be submitted")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--format", choices=("hcl", "json"), default=None, help="Nomad only: HCL (default) or the API JSON")
    _set_arg(p)

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
    _set_arg(p)
    p.add_argument("--json", action="store_true",
                   help="the last line of stdout is one JSON object instead of the id alone: {id, backend, name}, "
                        "with --wait also the final state (as status --json shows it)")

    p = command("plan", help="ask the scheduler whether the job can run, submitting nothing (Nomad: each node group's placement; SLURM: sbatch --test-only and the preemption settings)")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    _set_arg(p)

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
    p.add_argument("--grep", default=None, metavar="REGEX",
                   help="only lines whose text (after the [node K rank R] tag) this regular expression finds")
    p.add_argument("--since", type=_since, default=None, metavar="WHEN",
                   help="only lines written since WHEN: an age (30s, 10m, 2h) or an ISO date/time (local: the "
                        "backend that keeps a time per line)")
    p.add_argument("--stream", choices=("stdout", "stderr"), default=None,
                   help="only the ranks' and scripts' stdout, or stderr (local and Nomad keep them apart)")
    _outage_arg(p)

    p = command("list", help="recent jobs from their records, with their state (one scheduler query per backend)")
    p.add_argument("--backend", "-b", default=None, help="only this backend's jobs")
    p.add_argument("--state", type=_state_name, default=None,
                   help="only jobs in this state (RUNNING, FAILED, ...; UNREADABLE: records that cannot be read)")
    p.add_argument("--limit", type=_limit, default=50, help="the newest N records (default 50; 0: all)")
    p.add_argument("--name", default=None, help="only jobs of this name (the job file's name)")
    p.add_argument("--run", default=None, metavar="RUN", help="only the attempts of this run (its first attempt's id)")
    p.add_argument("--since", type=_since, default=None, metavar="WHEN",
                   help="only jobs submitted since WHEN: an ISO date/time (2026-12-01, 2026-12-01T08:00) or an age "
                        "(30m, 12h, 7d)")
    p.add_argument("--json", action="store_true", help="one JSON object per line, per job (JSON Lines: none when no job matches)")

    p = command("cancel", help="cancel jobs")
    p.add_argument("ids", nargs="+", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--purge", action="store_true", help="Nomad: also purge the job")
    p.add_argument("--signal", default=None, help="SLURM: warn the job instead of ending it: its warning signal (slurm.signal, USR2 when unset) reaches every rank")
    p.add_argument("--wait", action="store_true",
                   help="then wait until each job has ended (a run: and started no next attempt); exit 0 when every "
                        "one did, 1 when one still ran at --timeout")
    p.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                   help=f"with --wait: stop waiting after this many seconds (default {CANCEL_WAIT_S:g}, as "
                        "Job.cancel(wait=True))")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on stdout: the ids cancelled, those that had already ended, and with --wait "
                        "each one's final state")
    p.set_defaults(wait_default=CANCEL_WAIT_S)

    p = command("preflight", help="run the NCCL bandwidth test and node checks as the job would run; exit 0 pass, 1 fail")
    p.add_argument("file", metavar="FILE")
    _backend_arg(p)
    p.add_argument("--size", default="1G", help="bytes per transfer: 4M, 1G, 1GiB, ... (default 1G)")
    p.add_argument("--iters", type=_positive_int, default=3, help="timed runs of each test; the median is reported (default 3)")
    p.add_argument("--min-mibps", type=_positive_float, default=None, help="fail when any pair or the all_gather is slower")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    p.add_argument("--timeout", type=_positive_float, default=None, help="cancel the test job after this many seconds")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    _set_arg(p)

    p = command("nodes", help="the node ledger: hosts that failed a job as a node would, which new jobs avoid "
                              "until they expire; `nodes clear HOST` forgets one (exit 2 if the ledger does not know it)")
    p.add_argument("action", nargs="?", choices=("clear",), metavar="clear", help="forget HOST")
    p.add_argument("host", nargs="?", metavar="HOST")
    p.add_argument("--json", action="store_true", help="the entries as one JSON array ([] when the ledger is empty)")

    p = command("timeline", help="each rank's progress, stall, failure or hang over the job's wall time, "
                                 "drawn in the terminal (and as SVG with --svg)")
    p.add_argument("id", metavar="ID")
    _backend_arg(p, by_id=True)
    p.add_argument("--svg", default=None, metavar="FILE", help="also write the timeline to FILE as an SVG image")
    p.add_argument("--width", type=_width, default=None, metavar="N",
                   help=f"characters per line, at most {MAX_WIDTH} (default: the terminal's width, else 100)")

    command("gc", help="Nomad: delete the secrets (Variables) of every recorded job that ended or that Nomad no "
                       "longer knows; prints each removed Variable; exit 1 if one could not be deleted")

    p = command("export", help="write what the history store holds (job records, the node ledger, notifications): "
                               "one JSON object per line, each with its kind")
    p.add_argument("--json", action="store_true", help="one JSON document instead: {schema, jobs, ledger, notifications}")

    p = command("notify", help="deliver the queued webhook notifications (notify: in the job file) whose variable "
                               "this environment sets and whose next try is due, then exit: for a job nobody waits "
                               "on (submit --wait and watch deliver their own; status and list only queue); exit 1 "
                               "if one this run tried could not be delivered")
    p.add_argument("--now", action="store_true",
                   help="also try the notifications waiting for their next try (the backoff after a failed one)")

    command("schema", help="print the job file's JSON Schema")

    p = command("completion", help="print a shell completion script for halo-sched, made from these commands and "
                                   "options: source <(halo-sched completion bash)")
    p.add_argument("shell", choices=SHELLS, metavar="bash|zsh|fish")
    p.set_defaults(whole_parser=build_parser)  # the script covers every command, not the one parsed
    return ap


def _scheduler(name: str):
    from . import backends

    return backends.get(name)


# Every command: "module:function" in halo_sched/commands/; the function takes the parsed
# arguments and _scheduler, and returns the exit code. Only the command run is imported.
COMMANDS = {
    "validate": "jobfile:cmd_validate",
    "render": "jobfile:cmd_render",
    "plan": "jobfile:cmd_plan",
    "schema": "jobfile:cmd_schema",
    "preflight": "jobfile:cmd_preflight",
    "submit": "wait:cmd_submit",
    "watch": "wait:cmd_watch",
    "status": "show:cmd_status",
    "list": "show:cmd_list",
    "logs": "show:cmd_logs",
    "cancel": "manage:cmd_cancel",
    "nodes": "manage:cmd_nodes",
    "gc": "manage:cmd_gc",
    "export": "manage:cmd_export",
    "notify": "manage:cmd_notify",
    "timeline": "show:cmd_timeline",
    "completion": "completion:cmd_completion",
}


def _command(name: str):
    """The function of command ``name`` (its module imported now)."""
    import importlib

    module, _, function = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(f"{__package__}.commands.{module}"), function)


def _show_layout_warnings() -> None:
    """Layout warnings (parallelism that runs but does nothing) as one stderr line each, every time."""
    import warnings

    from .layout import LayoutWarning

    warnings.simplefilter("always", LayoutWarning)
    shown = warnings.showwarning

    def show(message, category, *args, **kw):
        if issubclass(category, LayoutWarning):
            say(f"halo-sched: warning: {message}")
        else:
            shown(message, category, *args, **kw)

    warnings.showwarning = show


def _reopen_closed() -> None:
    """Descriptors 0-2 that the caller closed (``>&-``) are opened on /dev/null: otherwise the
    next file opened (a job record) would take descriptor 1, and a child that inherits stdout
    (sbatch, git, a local node) would write into it."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def main(argv: list[str] | None = None) -> int:
    from .node.text import escape_controls

    _reopen_closed()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PipeGuard(sys.stdout, escape_controls), PipeGuard(sys.stderr, escape_controls)
    try:
        return _main(argv)
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        for guard in (sys.stdout, sys.stderr):
            if isinstance(guard, PipeGuard):
                guard.flush()
        out = sys.stdout
        if isinstance(out, PipeGuard) and out.dropped:  # its action stands, and so does its exit code
            say(f"halo-sched: warning: stdout {out.lost}: this command's output was not written")
        sys.stdout, sys.stderr = saved


def _main(argv: list[str] | None) -> int:
    parser = build_parser(only=_command_in(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    from .errors import set_debug

    set_debug(args.debug)
    from . import outage

    outage.set_note_sink(outage_line)
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
    try:
        if args.command not in ("validate", "schema", "completion"):  # the rest read or keep state
            from .store import check_home

            check_home()
        return _command(args.command)(args, _scheduler)
    except HaloError as err:
        from .errors import debug

        say(f"halo-sched: {err}")
        if debug() and (err.__cause__ or err.__context__):
            from .errors import cause_chain

            say(f"  {cause_chain(err)}")
        return err.exit_code
    except KeyboardInterrupt:
        say("halo-sched: interrupted")
        return EXIT_INTERRUPTED
    except Exception as err:  # a bug, not bad input: one line, the traceback on request
        from .errors import debug

        if debug():
            raise
        say(f"halo-sched: internal error: {type(err).__name__}: {_one_line(err)} (--debug shows the traceback)")
        return 1


def _one_line(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


if __name__ == "__main__":
    raise SystemExit(main())
