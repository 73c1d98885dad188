"""The progress protocol: how a rank tells halo-sched's hang monitor that it is still stepping.

The entry script of every node exports ``HALO_PROGRESS_DIR`` (a directory on the node). After
each step, rank ``$RANK`` appends one line ``STEP UNIX_TIME`` to ``$HALO_PROGRESS_DIR/rank-$RANK``;
that is the whole protocol, and a trainer may write it without halo-sched on the node::

    open(f"{os.environ['HALO_PROGRESS_DIR']}/rank-{os.environ['RANK']}", "a").write(f"{step} {time.time()}\\n")

(guard it with ``if "HALO_PROGRESS_DIR" in os.environ`` to run outside halo-sched too). The
monitor takes the time of a report from the file's modification time and the step from its last
line. A rank that reports is judged by its reports only (``hang.timeout_s`` without one is a
hang); until its first report, by its output (``hang.first_step_s``). A long evaluation or
checkpoint between two steps should report the same step again now and then.

:func:`report` below does the same, plus one thing the one-liner cannot: on its first call it
registers :mod:`faulthandler` on ``HALO_STACK_SIGNAL``, so that the monitor can read this rank's
Python stack without ending it (written to ``rank-$RANK.stack`` beside the reports). Copy this
file beside a trainer to use it where halo-sched is not installed. Standard library only.
"""
from __future__ import annotations

import os
import time

_fd: int | None = None
_stack = None  # the file faulthandler writes to: kept open for the life of the process


def report(step: int) -> None:
    """Say that this rank finished ``step``. Costs one ``write`` (a few microseconds); does
    nothing outside halo-sched (no ``HALO_PROGRESS_DIR``)."""
    global _fd
    if _fd is None:
        d = os.environ.get("HALO_PROGRESS_DIR")
        if not d:
            return
        base = os.path.join(d, f"rank-{os.environ.get('RANK', '0')}")
        _fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _register_stack_dump(base + ".stack")
    os.write(_fd, f"{int(step)} {time.time():.3f}\n".encode())


def _register_stack_dump(path: str) -> None:
    global _stack
    sig = os.environ.get("HALO_STACK_SIGNAL", "")
    if not sig.isdigit():
        return
    try:
        import faulthandler

        _stack = open(path, "a")
        faulthandler.register(int(sig), file=_stack, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError, AttributeError):
        _stack = None
