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

:func:`report` below writes the same lines without a system call per step: a ring of ``SLOTS``
fixed-width lines (one page) mapped into memory and rewritten in place, never touching the file
system's metadata (docs/failures.md, "Hangs"). Of consecutive steps it writes about one per
``GAP_S`` (a power-of-two stride of steps when they are faster: the same steps on every rank),
and every report that is not the step after the last: the first Python a rank runs after its
collective runs cold, and a written line costs 10-15 us there (issue 28). A thread makes the next
report a written one when the last written is ``LOOK_S`` old, so a rank that slows down is seen
within a step and a second. :func:`left`, called after the step's collective, writes when the
rank left it to ``rank-$RANK.left``, a ring as the reports' (the stragglers' rule: how long a rank
waits there tells slow compute from a slow peer). The longer history (``halo-sched timeline``) is
``rank-$RANK.history``, the same lines appended at most every ``HISTORY_S`` (about 230 KB an
hour). On its first call it registers :mod:`faulthandler` on ``HALO_STACK_SIGNAL``, so that the
monitor can read this rank's stack without ending it (``rank-$RANK.stack``). Copy this file beside
a trainer to use it where halo-sched is not installed. Standard library only.

A checkpoint's cost is the protocol's other line: after saving one, a rank (rank 0 is enough)
appends ``STEP UNIX_TIME SECONDS`` (the step saved, when the save ended, how long it took) to
``$HALO_PROGRESS_DIR/rank-$RANK.checkpoints``, as :func:`checkpoint` does; ``status RUN`` then says
the checkpoint interval that would have lost least given the run's own failures (docs/failures.md,
"Effective training time").
"""
from __future__ import annotations

import os
import time

#: The ring: SLOTS lines of WIDTH bytes each, ``"%13d %17.3f\\n"`` (step, Unix time), one page.
SLOTS = 128
WIDTH = 32
#: At most one history line per this many seconds (``rank-$RANK.history``).
HISTORY_S = 0.5
#: Consecutive steps are written about once per this many seconds (see above).
GAP_S = 0.01
#: The most consecutive steps one written report stands for.
MAX_STRIDE = 1024
#: The thread's look: a written report this old makes the next report a written one.
LOOK_S = 1.0
_ring = None  # the mapped file, or False where it could not be mapped (then one write per report)
_fd: int | None = None
_history: int | None = None
_next_history = 0.0
_count = 0
_stack = None  # the file faulthandler writes to: kept open for the life of the process
_mask = 0  # a consecutive step with any of these bits set is not written (stride - 1)
_prev = -2  # the last step reported
_written = (-2, 0.0)  # the last step written, and when
_looking = False
_left = None  # the ``.left`` ring, mapped; False where it could not be
_left_count = 0


#: A report file this large or smaller is read whole (progress.py's ring is one 4 KiB page);
#: a larger one holds appended lines, and only its tail is read.
_WHOLE_BYTES = 8192


def read_reports(path: str, n: int = 1) -> list[tuple[int, float]]:
    """A rank's last ``n`` progress reports, ``(step, unix_time)``, oldest first: every line of
    its file that reads as a step and a time (progress.py's ring of lines rewritten in place, or
    lines a trainer appended), ordered by time. A line being rewritten as it is read, or a slot
    not written yet, reads as nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(0 if size <= _WHOLE_BYTES else size - 64 * (n + 2))
            lines = f.read().split(b"\n")
    except OSError:
        return []
    if size > _WHOLE_BYTES:
        lines = lines[1:]  # the first may be cut
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            out.append((int(parts[0]), float(parts[1])))
        except ValueError:
            continue
    out.sort(key=lambda r: (r[1], r[0]))
    return out[-n:]


def last_report(path: str) -> tuple[int, float] | None:
    """A rank's last progress report, ``(step, unix_time)``; None before its first."""
    got = read_reports(path)
    return got[-1] if got else None


def report(step: int) -> None:
    """Say that this rank finished ``step``. Costs the call, or about a microsecond when the
    line is written (no system call); does nothing outside halo-sched (no ``HALO_PROGRESS_DIR``)."""
    global _prev
    if step & _mask and step == _prev + 1:
        _prev = step
        return
    _prev = step
    _write(step)


def checkpoint(step: int, seconds: float) -> None:
    """Say that this rank saved a checkpoint of ``step``, which took ``seconds``: one line appended
    to ``rank-$RANK.checkpoints`` (a system call per checkpoint); nothing outside halo-sched."""
    d = os.environ.get("HALO_PROGRESS_DIR")
    if not d:
        return
    try:
        fd = os.open(f"{d}/rank-{os.environ.get('RANK', '0')}.checkpoints", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                     0o644)
        try:
            os.write(fd, b"%d %.3f %.3f\n" % (step, time.time(), seconds))
        finally:
            os.close(fd)
    except (OSError, ValueError, TypeError):  # never ends the trainer
        pass


def left(step: int) -> None:
    """Say that this rank left ``step``'s collective (:func:`report` it before, after the compute)."""
    global _left, _left_count
    if step != _written[0] or not _ring:
        return
    try:
        if _left is None:
            import mmap

            _left = False  # opened once: a ``.left`` that cannot be mapped is not tried every step
            fd = os.open(f"{os.environ['HALO_PROGRESS_DIR']}/rank-{os.environ.get('RANK', '0')}.left",
                         os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, SLOTS * WIDTH)
                _left = mmap.mmap(fd, SLOTS * WIDTH)
            finally:
                os.close(fd)  # the mapping holds the file
        if _left:
            at = (_left_count % SLOTS) * WIDTH
            _left[at:at + WIDTH] = b"%13d %17.3f\n" % (step, time.time())
            _left_count += 1
    except (OSError, ValueError, KeyError, IndexError):  # never ends the trainer
        pass


def _write(step: int) -> None:
    global _count, _next_history, _mask, _written
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
    last, then = _written
    _written = (step, now)
    if step > last and now > then:  # the stride: the smallest power of two of steps that take GAP_S
        stride = 1
        per_step = (now - then) / (step - last)
        while stride < MAX_STRIDE and stride * per_step < GAP_S:
            stride *= 2
        _mask = stride - 1
        if stride > 1 and not _looking:
            _look_start()
    if now >= _next_history:  # _open() opened the history with the ring
        _next_history = now + HISTORY_S
        try:
            os.write(_history, line)
        except OSError:  # a full disk ends the history, never the trainer
            pass


def _look_start() -> None:
    global _looking
    import threading

    _looking = True
    threading.Thread(target=_look, name="halo-progress", daemon=True).start()


def _look() -> None:
    while True:
        time.sleep(LOOK_S)
        look(time.time())


def look(now: float) -> None:
    """The thread's look (once a second): a rank whose steps slowed down, its stride still
    skipping them, has its next report written."""
    global _mask
    if _prev != _written[0] and now - _written[1] >= LOOK_S:
        _mask = 0


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
