"""Linux process helpers of the local backend, shared by its supervisor (``local_supervisor``)
and the submitter's side (``halo_sched/backends/local.py``): find a job's processes by the tag in
their environment, tell a live process from a reused pid, stop them all, wait on an exit. Standard
library only (``/proc``, pidfd).
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
from pathlib import Path

from .contract import NAMES

GRACE_S = 10.0


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def wait_exit(pid: int | None, timeout: float) -> None:
    """Sleep until process ``pid`` exits or ``timeout`` passes, woken by the exit itself (pidfd,
    Linux 5.3+); a short sleep where that is not available."""
    try:
        fd = os.pidfd_open(pid) if pid else None
    except (AttributeError, OSError):
        fd = None
    if fd is None:
        time.sleep(min(timeout, 0.1))
        return
    try:
        select.select([fd], [], [], timeout)
    finally:
        os.close(fd)


def wait_any(pids: list[int], wake_fd: int | None, timeout: float) -> None:
    """Sleep until one of ``pids`` exits, a signal arrives (``wake_fd``, signal.set_wakeup_fd),
    or ``timeout`` passes: the supervisor sees a node's end as it happens, not at its next poll."""
    fds = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        for fd in fds:
            os.close(fd)
        time.sleep(min(timeout, 0.1))
        return
    try:
        ready, _, _ = select.select(fds + ([wake_fd] if wake_fd is not None else []), [], [], timeout)
        if wake_fd in ready:
            try:
                os.read(wake_fd, 512)
            except BlockingIOError:
                pass
    finally:
        for fd in fds:
            os.close(fd)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def same_process(pid: int, start: int | None) -> bool:
    """Whether ``pid`` still runs and is the process recorded then (not a reused pid, not a zombie)."""
    fields = _stat(pid)
    if fields is None:
        return False
    if fields[0] == "Z":
        return False
    return start is None or int(fields[19]) == start


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[1]) == pid:
                out.append(int(entry))
    return out


def tagged(tag: str) -> list[int]:
    """Live processes (other than this one) whose environment carries ``NAMES.local_job=tag``."""
    want = f"{NAMES.local_job}={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env and same_process(int(entry), None):
            out.append(int(entry))
    return out


def stop_tagged(tag: str, grace: float = GRACE_S, also=None) -> None:
    """SIGTERM every process of the job, SIGKILL what is left after ``grace``, and repeat until
    none is left (a process reparented meanwhile is caught on the next round). ``also`` (the
    supervisor only) adds its own children, which the tag may miss (a scrubbed env), and reaps
    them: nowhere else may this wait for arbitrary children."""
    term_until = time.monotonic() + grace
    give_up = term_until + 10.0
    signalled: set[int] = set()
    while time.monotonic() < give_up:
        while also is not None:  # collect children that already ended (we are their subreaper)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        procs = set(tagged(tag)) | {p for p in (also() if also else []) if same_process(p, None)}
        if not procs:
            return
        late = time.monotonic() >= term_until
        for pid in procs:
            if late or pid not in signalled:
                try:
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                except ProcessLookupError:
                    pass
                signalled.add(pid)
        time.sleep(0.1)


def become_subreaper() -> None:
    """Orphaned descendants (torchrun's workers run in sessions of their own) become our children,
    so none outlives the job. Linux only; elsewhere the node process groups are all we stop."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
