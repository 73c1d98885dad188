"""The progress protocol: how a rank tells halo-sched's hang monitor that it is still stepping.

The entry script of every node exports ``HALO_PROGRESS_DIR`` (a directory on the node). After
each step, rank ``$RANK`` writes a line ``STEP UNIX_TIME`` to ``$HALO_PROGRESS_DIR/rank-$RANK``;
that is the whole protocol, and a trainer may append such lines without halo-sched on the node::

    open(f"{os.environ['HALO_PROGRESS_DIR']}/rank-{os.environ['RANK']}", "a").write(f"{step} {time.time()}\\n")

(guard it with ``if "HALO_PROGRESS_DIR" in os.environ`` to run outside halo-sched too). Readers
(the hang monitor, ``status``'s stragglers) take every line of the file that reads as a step and
a time, newest time last, so a file of appended lines and this helper's file read the same. A
rank that reports is judged by its reports only (``hang.timeout_s`` without one is a hang); until
its first report, by its output (``hang.first_step_s``). A long evaluation or checkpoint between
two steps should report the same step again now and then.

:func:`report` below writes the same lines without a system call per step: the file is a ring
of ``SLOTS`` fixed-width lines (one page) mapped into memory and rewritten in place, so a report
costs about half a microsecond and never touches the file system's metadata (a ``write`` per
step costs 1-2 us and updates the file's times each step; docs/failures.md, "Hangs"). It keeps
the last ``SLOTS`` reports, enough for the stragglers' window; the longer history (``halo-sched
timeline``) is ``rank-$RANK.history``, the same lines appended at most every ``HISTORY_S``
seconds (one ``write`` per interval, about 230 KB an hour). On its first call it also
registers :mod:`faulthandler` on ``HALO_STACK_SIGNAL``, so that the monitor can read this rank's
Python stack without ending it (written to ``rank-$RANK.stack`` beside the reports). Copy this
file beside a trainer to use it where halo-sched is not installed. Standard library only.
"""
from __future__ import annotations

import os
import time

#: The ring: SLOTS lines of WIDTH bytes each, ``"%13d %17.3f\\n"`` (step, Unix time), one page.
SLOTS = 128
WIDTH = 32
#: At most one history line per this many seconds (``rank-$RANK.history``).
HISTORY_S = 0.5
_ring = None  # the mapped file, or False where it could not be mapped (then one write per report)
_fd: int | None = None
_history: int | None = None
_next_history = 0.0
_count = 0
_stack = None  # the file faulthandler writes to: kept open for the life of the process


def report(step: int) -> None:
    """Say that this rank finished ``step``. Costs about half a microsecond (no system call);
    does nothing outside halo-sched (no ``HALO_PROGRESS_DIR``)."""
    global _count, _next_history
    if _fd is None and not _open():
        return
    now = time.time()
    line = b"%13d %17.3f\n" % (step, now)
    if not _ring:
        os.write(_fd, line)
        return
    at = (_count % SLOTS) * WIDTH
    try:
        _ring[at:at + WIDTH] = line
    except IndexError:  # a step of more than 13 digits: the line would not fit its slot
        return
    _count += 1
    if now >= _next_history:  # _open() opened the history with the ring
        _next_history = now + HISTORY_S
        try:
            os.write(_history, line)
        except OSError:  # a full disk ends the history, never the trainer
            pass


def _open() -> bool:
    """Open this process's report file (a new process starts it afresh: a restarted rank's
    reports are its own). False outside halo-sched."""
    global _fd, _ring, _count, _history, _next_history
    d = os.environ.get("HALO_PROGRESS_DIR")
    if not d:
        return False
    base = os.path.join(d, f"rank-{os.environ.get('RANK', '0')}")
    _fd = os.open(base, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    _count = 0
    try:
        import mmap

        os.ftruncate(_fd, SLOTS * WIDTH)
        _ring = mmap.mmap(_fd, SLOTS * WIDTH)
        _history = os.open(base + ".history", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        _next_history = 0.0
    except (ImportError, OSError, ValueError):  # a file system that cannot map files: lines appended
        os.ftruncate(_fd, 0)
        os.lseek(_fd, 0, os.SEEK_END)
        _ring = False
    _register_stack_dump(base + ".stack")
    return True


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
