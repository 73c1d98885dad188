"""The hang monitor: runs on each node beside torchrun, ends the job when its ranks stop progressing.

Started by the entry script (``entry_hang.sh.j2``) right after torchrun, under the Python torchrun
runs under; standard library only (halo-sched need not be installed on the node). It polls once a
second; every 5 s it samples the ranks' links (``links.py``) and copies the progress files where asked.

When is a node hung? Every live rank of the node (torchrun's children that carry ``RANK``) is
stalled at once:

* a rank that reports progress (``$HALO_PROGRESS_DIR/rank-R`` exists, see ``progress.py``) is
  stalled after ``timeout_s`` without a report;
* a rank that has not reported yet (still importing, loading, before its first step, or a trainer
  without the protocol) is stalled after ``first_step_s`` with no new output on its stdout/stderr
  (torchrun's ``--tee`` files), counted from when the monitor first saw it.

In a synchronous job one stuck rank stops every rank within a step, so every node's monitor
fires within about a poll and a step of the others. Then, on each node:

1. every rank that registered ``faulthandler`` on ``HALO_STACK_SIGNAL`` (the helper in
   ``progress.py`` does) dumps its stack without ending (SigCgt in ``/proc/PID/status`` says who);
2. the monitor waits ``SETTLE_S`` so that the other nodes' monitors take theirs before anything
   here ends (ending a rank makes its peers fail in their collective, losing their stacks);
3. the ranks whose stack is still unknown are stopped (``SIGSTOP``), and ``STOP_SYNC_S`` later, when
   every node of the stall has stopped its own, get ``SIGABRT`` and ``SIGCONT``: with
   ``PYTHONFAULTHANDLER`` (set by the entry script) Python prints every thread's stack to the rank's
   stderr as it dies. A stopped rank cannot see its peers on other nodes die, so no node's aborts
   break another node's ranks before their dumps;
4. one ``halo-sched-failure`` line of kind ``HUNG`` per local rank goes to the node's output (step,
   last progress, top of stack, the collective it waits in, or why its stack could not be read),
   every stack to ``DIR/hang-stacks.txt`` and the node's output;
5. the monitor stays until ``LINGER_S`` after the aborts, so that this node's end (which ends the
   whole job: srun's ``--kill-on-bad-exit``) cannot kill another node's monitor mid-report; then
   torchrun gets SIGTERM (SIGKILL 10 s later): the node exits non-zero and the scheduler ends the job.

Which rank is the culprit is decided where all nodes' lines meet (``failures.FailureReport``).
"""
from __future__ import annotations

import glob
import linecache
import os
import re
import signal
import socket
import struct
import sys
import time

from . import links
from .progress import _WHOLE_BYTES, last_report, read_reports  # noqa: F401  (the protocol's readers: progress.py)
from .failure_collector import record_line, scrub, secret_values  # on the node: a package of the two files (entry_hang.sh.j2)

POLL_S = 1.0
SETTLE_S = 10.0
#: From stopping the ranks to aborting them: longer than any node's lag behind the others (its
#: poll of the settle wait, a loaded node's scheduling).
STOP_SYNC_S = 2.0
ABORT_WAIT_S = 5.0
#: After the aborted ranks are gone: how long their dumps may take to reach their log files.
FLUSH_WAIT_S = 5.0
#: After the aborts, how long every node stays: another node's monitor may still be reading its
#: dumps (FLUSH_WAIT_S at most) when this node's end makes srun end the step.
LINGER_S = FLUSH_WAIT_S + 1.0
STACK_WAIT_S = 3.0

#: Functions of torch.distributed in which a rank waits for its peers.
COLLECTIVES = frozenset("""
all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all all_to_all_single barrier
monitored_barrier broadcast broadcast_object_list gather gather_object reduce reduce_scatter
reduce_scatter_tensor scatter scatter_object_list send recv isend irecv batch_isend_irecv wait
_all_gather_base _reduce_scatter_base all_reduce_coalesced
""".split())
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+?)\s*$')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+|^Stack \(most recent call first\)")
#: A frame of a Python traceback (most recent call last), as a rank that ended with an exception prints it.
_TB_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    out = {}
    for item in items:
        k, sep, v = item.partition(b"=")
        if sep and k in (b"RANK", b"LOCAL_RANK"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _handles(pid: int, signum: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool((int(line.split()[1], 16) >> (signum - 1)) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def parse_stacks(text: str) -> list[list[tuple[str, int, str]]]:
    """The threads of the last faulthandler dump in ``text``: each a list of (file, line,
    function), most recent call first. Lines may carry torchrun's ``[rank N] `` prefix."""
    threads: list[list[tuple[str, int, str]]] = []
    cur = None
    for raw in text.splitlines():
        line = re.sub(r"^\[(?:rank\d+|rank \d+)\]:?\s?", "", raw)
        if "Fatal Python error" in line:
            threads, cur = [], None  # a later dump replaces an earlier one
            continue
        if _THREAD.match(line.strip()):
            cur = []
            threads.append(cur)
            continue
        m = _FRAME.match(line)
        if m and cur is not None:
            cur.append((m["file"], int(m["line"]), m["func"]))
        elif cur is not None and cur and not line.strip():
            cur = None
    return [t for t in threads if t]


def parse_traceback(text: str) -> list[tuple[str, int, str]]:
    """The frames of the last Python traceback in ``text``, most recent call first (as a dump's):
    where a rank was when it ended with an exception, e.g. a peer's end breaking the collective
    it waited in. Empty when there is none."""
    frames: list[tuple[str, int, str]] = []
    for raw in text.splitlines():
        line = re.sub(r"^\[(?:rank\d+|rank \d+)\]:?\s?", "", raw)
        if line.startswith("Traceback (most recent call last):"):
            frames = []
            continue
        m = _TB_FRAME.match(line)
        if m:
            frames.append((m["file"], int(m["line"]), m["func"]))
    return frames[::-1]


def main_thread(threads: list[list[tuple[str, int, str]]]) -> list[tuple[str, int, str]]:
    """The main thread: the one whose outermost frame is a module's top level."""
    for t in threads:
        if t and t[-1][2] == "<module>":
            return t
    return threads[-1] if threads else []


def _library(path: str) -> bool:
    return ("site-packages" in path or "dist-packages" in path or "/lib/python" in path
            or path.startswith("<"))


def classify_stack(frames: list[tuple[str, int, str]], cwd: str | None = None) -> dict:
    """Where a rank is: ``waiting_in`` (a collective, or None), the top user frame and its code."""
    waiting = None
    for path, _, func in frames:
        if "torch/distributed/" in path.replace("\\", "/") and func in COLLECTIVES:
            waiting = func
            break
        if "torch/autograd/" in path and func in ("backward", "_engine_run_backward"):
            waiting = "backward"
            break
    user = next((f for f in frames if not _library(f[0])), frames[0] if frames else None)
    where = code = ""
    if user:
        path, line, func = user
        where = f"{os.path.basename(path)}:{line}"
        full = path if os.path.isabs(path) or not cwd else os.path.join(cwd, path)
        code = linecache.getline(full, line).split("  #", 1)[0].strip()[:80]
        if not code:
            code = func
    return {"waiting_in": waiting, "where": where, "code": code}


#: How often the progress files are copied into the mirror directory (``Mirror``).
MIRROR_S = 5.0
#: The most bytes of a long file read per copy (a history grows about 640 bytes in ``MIRROR_S``).
MIRROR_CHUNK = 65536
_MIRRORED = re.compile(r"rank-\d+(?:\.history|\.left|\.checkpoints)?|links")
_RANK_FILE = re.compile(r"rank-\d+")
#: A node's copies of this many earlier steps of the job are kept (``progress.1``, ...): what
#: ``status RUN`` measures a restart inside the job from (halo_sched/ettr.py).
MIRROR_KEPT = 64


class Mirror:
    """Copies a node's progress files (each rank's ring ``rank-R`` and its ``rank-R.history``)
    into a directory the submitter can read, as ``DST/node-K/progress/``: the layout of a local
    job's log root, so that ``stragglers.read`` and ``timeline.progress_files`` read it as they
    read that. SLURM keeps the node's own progress directory in a temporary directory on the
    node; the mirror goes beside the job's output file (docs/failures.md, "Stragglers").

    Bounded, every ``MIRROR_S`` seconds at most: a file of ``_WHOLE_BYTES`` or less (the ring, one
    page; a history's first minutes) is copied whole when its bytes changed, by a write to a
    temporary name and a rename (a reader sees the old copy or the new, never half of one); of a
    longer ``rank-R`` (lines a trainer appends, one a step) its last ``_WHOLE_BYTES`` of whole lines
    the same way (the stragglers' window); of a longer history only the newest whole line is
    appended at each copy, reading ``MIRROR_CHUNK`` bytes at most, so the copy grows a line every
    ``MIRROR_S`` (about 23 KB an hour), not the node's two a second; a trainer's own long
    ``rank-R`` without a history gets such a history too. A copy that cannot be written is said
    once on stderr and tried again later: the mirror never ends or slows the job.

    Each step of the job has a monitor of its own: when the job starts its ranks again in the
    same allocation (a spare swap, a restart in place, a requeue), the new step's first copy moves
    the earlier step's copy aside, to ``progress.1`` (the next free number, at most
    :data:`MIRROR_KEPT`), so that the reports before the restart stay readable (``status RUN``'s
    effective training time: halo_sched/ettr.py); the readers of the current step read
    ``progress/`` as before."""

    def __init__(self, src: str, dst: str, node: int):
        self.src, self.node = src, node
        self.dst = os.path.join(dst, f"node-{node}", "progress")
        # copy's name -> (its source's inode, source bytes taken, the bytes of a whole copy or None)
        self.sent: dict[str, tuple[int, int, bytes | None]] = {}
        self.next = 0.0
        self.said = False
        self.moved = False  # whether an earlier step's copy was looked for (once, at the first copy)

    def maybe(self, now: float) -> None:
        if now >= self.next:
            self.next = now + MIRROR_S
            self.copy()

    def copy(self) -> None:
        """Copy what changed since the last copy."""
        try:
            names = sorted(n for n in os.listdir(self.src) if _MIRRORED.fullmatch(n))
        except OSError:
            return  # no rank has reported yet
        try:
            if names and not self.moved:
                self.moved = True
                self._keep_earlier()
            if names:
                os.makedirs(self.dst, exist_ok=True)
            for name in names:
                self._one(name, names)
        except OSError as e:
            if not self.said:
                self.said = True
                sys.stderr.write(f"halo-sched: node {self.node}: cannot copy the ranks' progress into {self.dst} "
                                 f"({e.strerror or e}); `halo-sched status` and `timeline` will not show it; "
                                 "the job goes on\n")
                sys.stderr.flush()

    def _keep_earlier(self) -> None:
        """An earlier step's copy (another monitor's: this one has written nothing yet) moved to
        ``progress.N``, N the first free number; left in place when all are taken."""
        if not os.path.isdir(self.dst):
            return
        for n in range(1, MIRROR_KEPT + 1):
            aside = f"{self.dst}.{n}"
            if not os.path.lexists(aside):
                os.rename(self.dst, aside)
                return

    def _one(self, name: str, names: list[str]) -> None:
        try:
            f = open(os.path.join(self.src, name), "rb")
        except OSError:
            return  # gone meanwhile (a restarting rank)
        with f:
            st = os.fstat(f.fileno())
            if st.st_size <= _WHOLE_BYTES or not name.endswith(".history"):
                f.seek(max(0, st.st_size - _WHOLE_BYTES))
                data = f.read(_WHOLE_BYTES)
                if st.st_size > _WHOLE_BYTES:
                    data = data[data.find(b"\n") + 1:]  # the first line may be cut
                data = data[:data.rfind(b"\n") + 1]  # whole lines only (a slot not written yet is nothing)
                if self.sent.get(name, (None, 0, None))[::2] != (st.st_ino, data):
                    self._replace(name, data)
                self.sent[name] = (st.st_ino, st.st_size if st.st_size > _WHOLE_BYTES else len(data), data)
                if st.st_size <= _WHOLE_BYTES or name + ".history" in names or not _RANK_FILE.fullmatch(name):
                    return
                name += ".history"  # a trainer's own lines, one a step: a history of them as well
            self._thin(f, st, name)

    def _thin(self, f, st: os.stat_result, name: str) -> None:
        """Append the newest whole line of ``f`` past what was taken (its first one too when the
        copy starts afresh: a new file, or one that was started again)."""
        ino, done, _ = self.sent.get(name, (-1, 0, None))
        fresh = ino != st.st_ino or st.st_size < done
        if fresh:
            done = 0
        if st.st_size - done > MIRROR_CHUNK:  # far behind: the newest lines are what matters
            head = b""
            if fresh:
                f.seek(0)
                head = f.read(256).split(b"\n", 1)[0] + b"\n"
            done = st.st_size - MIRROR_CHUNK
            f.seek(done)
            data = f.read(MIRROR_CHUNK)
            data = data[data.find(b"\n") + 1:]
            done += MIRROR_CHUNK - len(data)
        else:
            f.seek(done)
            data = f.read(MIRROR_CHUNK)
            head = b""
        cut = data.rfind(b"\n") + 1
        lines = data[:cut].splitlines(keepends=True)
        keep = (lines[:1] if fresh and not head else [head] if head else []) + lines[-1:]
        keep = list(dict.fromkeys(keep))
        if fresh:
            self._replace(name, b"".join(keep))
        elif keep:
            with open(os.path.join(self.dst, name), "ab") as out:
                out.write(b"".join(keep))
        self.sent[name] = (st.st_ino, done + cut, None)

    def _replace(self, name: str, data: bytes) -> None:
        tmp = os.path.join(self.dst, f".{name}.{os.getpid()}.tmp")  # never read as a rank's file
        try:
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, os.path.join(self.dst, name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


class Monitor:
    def __init__(self, node: int, torchrun: int, progress_dir: str, log_dir: str, nproc: int,
                 timeout_s: float, first_step_s: float, stack_signal: int, host: str | None = None,
                 mirror: str | None = None, key: str = ""):
        self.node, self.torchrun, self.progress_dir, self.log_dir = node, torchrun, progress_dir, log_dir
        self.mirror = Mirror(progress_dir, mirror, node) if mirror else None
        self.nproc, self.timeout_s, self.first_step_s = nproc, timeout_s, first_step_s
        self.stack_signal, self.host = stack_signal, host or socket.gethostname()
        self.ranks: dict[int, dict] = {}  # pid -> {rank, local_rank, seen, out, cwd}
        self.key = key  # the job's failure key, which signs this node's HUNG lines
        self.next_links = 0.0

    # ---- watching -------------------------------------------------------------------------
    def _discover(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.ranks:
                continue
            s = _stat(int(entry))
            if not s or int(s[1]) != self.torchrun:
                continue
            env = _environ(int(entry))
            if "RANK" not in env:
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                cwd = None
            self.ranks[int(entry)] = {"rank": int(env["RANK"]), "local_rank": int(env.get("LOCAL_RANK", -1)),
                                      "seen": time.time(), "out": [], "cwd": cwd}

    def _outputs(self, info: dict) -> list[str]:
        if not info["out"]:
            info["out"] = sorted(glob.glob(os.path.join(self.log_dir, "*", "attempt_*", str(info["local_rank"]),
                                                        "std*.log")))
        return info["out"]

    def activity(self, info: dict) -> tuple[float, float, bool]:
        """(last activity, its limit, reports progress)."""
        last = last_report(os.path.join(self.progress_dir, f"rank-{info['rank']}"))
        if last is not None:  # the time the rank wrote: a ring rewritten in memory leaves no mtime
            return last[1], self.timeout_s, True
        times = [info["seen"]] + [m for m in map(_mtime, self._outputs(info)) if m is not None]
        return max(times), self.first_step_s, False

    def live(self) -> dict[int, dict]:
        return {pid: i for pid, i in self.ranks.items() if _alive(pid)}

    def hung(self, now: float) -> bool:
        live = self.live()
        if not live:
            return False
        return all(now - last >= limit for last, limit, _ in (self.activity(i) for i in live.values()))

    def sample_links(self, now: float) -> None:
        if now < self.next_links or not self.ranks:
            return
        self.next_links = now + links.LINKS_S
        try:
            links.write(os.path.join(self.progress_dir, "links"), self.host, links.sample(list(self.live())))
        except (OSError, ValueError, struct.error):
            pass

    def watch(self) -> bool:
        """Poll until the node hangs (True) or torchrun ends (False)."""
        while _alive(self.torchrun):
            if len(self.live()) < self.nproc:
                self._discover()
            if self.hung(time.time()):
                return True
            self.sample_links(time.monotonic())
            if self.mirror is not None:
                self.mirror.maybe(time.monotonic())
            time.sleep(POLL_S)
        return False

    # ---- on a hang --------------------------------------------------------------------------
    def _sleep_while_running(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and _alive(self.torchrun):
            time.sleep(min(0.2, left))  # wakes at the end, not up to 0.2 s after: the nodes act together

    def _wait_until(self, when: float, most: float) -> None:
        """Until the wall-clock time ``when`` (one instant for every node of a stall, as each
        node reckons it from its ranks' last activity), ``most`` seconds at most, while torchrun runs."""
        self._sleep_while_running(min(most, max(0.0, when - time.time())))

    def _stack_file(self, rank: int) -> str:
        return os.path.join(self.progress_dir, f"rank-{rank}.stack")

    def _stderr_text(self, info: dict) -> str:
        for p in self._outputs(info):
            if p.endswith("stderr.log"):
                try:
                    with open(p, "rb") as f:
                        f.seek(0, os.SEEK_END)
                        f.seek(max(0, f.tell() - 65536))
                        return f.read().decode(errors="replace")
                except OSError:
                    return ""
        return ""

    def fire(self) -> bool:
        """Take the stacks, write the report and end torchrun; False when the hang went away."""
        detected = time.time()
        state = {}
        stalled = 0.0  # when the last of this node's ranks went past its limit: the hang's start
        for pid, info in self.live().items():
            last, limit, reports = self.activity(info)
            stalled = max(stalled, last + limit)
            got = last_report(os.path.join(self.progress_dir, f"rank-{info['rank']}")) if reports else None
            step = got[0] if got else None
            state[pid] = {"last": last, "reports": reports, "step": step, "threads": None, "how": None, "why": None}
        sys.stderr.write(f"halo-sched: node {self.node}: no rank made progress for {self.timeout_s:g} s; "
                         "taking their stacks\n")
        sys.stderr.flush()
        # 1. Stacks without ending the ranks, where the rank registered faulthandler.
        sizes = {}
        for pid, info in self.live().items():
            if self.stack_signal and _handles(pid, self.stack_signal):
                sizes[pid] = os.path.getsize(self._stack_file(info["rank"])) if os.path.exists(
                    self._stack_file(info["rank"])) else 0
                try:
                    os.kill(pid, self.stack_signal)
                except OSError:
                    sizes.pop(pid)
        end = time.monotonic() + STACK_WAIT_S
        while sizes and time.monotonic() < end:
            time.sleep(0.2)
            for pid in list(sizes):
                path = self._stack_file(self.ranks[pid]["rank"])
                try:
                    with open(path, errors="replace") as f:
                        f.seek(sizes[pid])
                        text = f.read()
                except OSError:
                    continue
                threads = parse_stacks(text)
                # Complete once the main thread's outermost frame (<module>) is in.
                if threads and any(t[-1][2] == "<module>" for t in threads):
                    state[pid]["threads"], state[pid]["how"] = threads, f"signal {self.stack_signal} (SIGRTMIN+{self.stack_signal - signal.SIGRTMIN}), rank kept running"
                    del sizes[pid]
        # 2. Let the other nodes' monitors take theirs before anything here ends. A hang must
        # last through this: a rank that progressed meanwhile, or torchrun's end, calls it off.
        # torchrun ending meanwhile does not call it off: every rank here had stalled, so another
        # node's monitor ended its ranks and this node's collectives broke; what this node saw is
        # still its part of the report (its ranks' last tracebacks say where they waited).
        # Until SETTLE_S after the stall began (the same on every node of it), not after this
        # node's poll saw it: the nodes then abort together (docs/failures.md, "Hangs").
        self._wait_until(stalled + SETTLE_S, SETTLE_S)
        if any(self.activity(self.ranks[pid])[0] > st["last"] for pid, st in state.items() if _alive(pid)):
            sys.stderr.write(f"halo-sched: node {self.node}: progress again within "
                             f"{SETTLE_S:g} s: not a hang\n")
            sys.stderr.flush()
            return False
        # 3. The rest: SIGABRT, which PYTHONFAULTHANDLER turns into a dump on the rank's stderr.
        # Each node's wake can lag the others' by its poll and its load, and a rank whose peer died
        # first leaves its collective at once (a CI run: node 0's aborts came 0.1 s before node
        # 1's, and rank 3 was dumped inside torch's excepthook, its traceback held in a StringIO).
        # So: stop them, wait until every node has stopped its own, then abort. A stopped rank
        # cannot see its peers' sockets close; the SIGABRT sent while it is stopped is pending and
        # is taken as it resumes, before a broken collective can unwind to Python.
        abort_at = stalled + SETTLE_S + STOP_SYNC_S
        aborted, stopped = [], []
        try:
            for pid in state:
                if state[pid]["threads"] is None and _alive(pid):
                    try:
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
                    except OSError:
                        pass
            if stopped:
                self._wait_until(abort_at, STOP_SYNC_S)
            for pid in state:
                if state[pid]["threads"] is None:
                    if not _alive(pid):
                        # Ended before this node's turn (a peer's end broke its collective): where it
                        # was is in the traceback it printed as it ended, if it printed one.
                        frames = parse_traceback(self._stderr_text(self.ranks[pid]))
                        if frames:
                            state[pid]["threads"], state[pid]["how"] = [frames], "its traceback as it ended"
                        else:
                            state[pid]["why"] = "the rank had already ended"
                        continue
                    try:
                        os.kill(pid, signal.SIGABRT)
                        aborted.append(pid)
                    except OSError as e:
                        state[pid]["why"] = f"SIGABRT failed: {e.strerror}"
        finally:
            for pid in stopped:  # never leave a rank stopped
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        end = time.monotonic() + ABORT_WAIT_S
        while any(_alive(p) for p in aborted) and time.monotonic() < end:
            time.sleep(0.2)
        # torchrun's tee thread copies the dump into the rank's log file after the rank is gone:
        # look again until every dump is in or FLUSH_WAIT_S passes (on a loaded node this takes
        # seconds, not the 0.3 s it takes on an idle one).
        got: dict[int, list] = {}
        end = time.monotonic() + FLUSH_WAIT_S
        while True:
            for pid in aborted:
                if pid not in got:
                    threads = parse_stacks(self._stderr_text(self.ranks[pid]))
                    if threads and any(t[-1][2] == "<module>" for t in threads):
                        got[pid] = threads
            if len(got) == len(aborted) or time.monotonic() >= end:
                break
            time.sleep(0.2)
        for pid in aborted:
            threads = got.get(pid) or parse_stacks(self._stderr_text(self.ranks[pid]))
            if threads:
                state[pid]["threads"], state[pid]["how"] = threads, "SIGABRT with PYTHONFAULTHANDLER"
            elif parse_traceback(self._stderr_text(self.ranks[pid])):
                # It ended with an exception before the signal's dump (a peer ended first).
                state[pid]["threads"] = [parse_traceback(self._stderr_text(self.ranks[pid]))]
                state[pid]["how"] = "its traceback as it ended"
            elif _alive(pid):
                state[pid]["why"] = "the rank did not react to SIGABRT (uninterruptible sleep? faulthandler disabled?)"
            else:
                state[pid]["why"] = "no stack on its stderr after SIGABRT (PYTHONFAULTHANDLER unset or disabled?)"
        # 4. The report: one line per rank, every stack kept.
        dump = []
        for pid, st in sorted(state.items(), key=lambda kv: self.ranks[kv[0]]["rank"]):
            info = self.ranks[pid]
            frames = main_thread(st["threads"]) if st["threads"] else []
            where = classify_stack(frames, info["cwd"]) if frames else {"waiting_in": None, "where": "", "code": ""}
            if where["waiting_in"] is None:
                # Another node's monitor ended its ranks first: this rank's collective failed
                # ("Connection closed by peer") and its dump caught it handling that. The traceback
                # it printed says which collective it had been waiting in.
                tb = parse_traceback(self._stderr_text(info))
                was = classify_stack(tb, info["cwd"]) if tb else None
                if was is not None and was["waiting_in"] is not None:
                    where = was
            rec = {
                "kind": "HUNG", "node": self.node, "rank": info["rank"], "local_rank": info["local_rank"],
                "host": self.host, "exit_code": None, "signal": None, "time": detected,
                "step": st["step"], "last_progress": st["last"], "reports": st["reports"],
                "stalled_s": round(detected - st["last"], 1), "stack_read": bool(frames),
                "error": st["why"] or "", **where, "tail": [f"{os.path.basename(f)}:{n} in {fn}" for f, n, fn in frames[:8]],
            }
            sys.stderr.write(record_line(rec, self.key))
            dump.append(f"==== rank {info['rank']} (node {self.node}, host {self.host}, local rank "
                        f"{info['local_rank']}, pid {pid}): "
                        + (f"stack by {st['how']}" if st["threads"] else f"no stack: {st['why']}"))
            for t in st["threads"] or []:
                dump.append("  thread" + (" (main)" if t is frames else "") + ":")
                dump.extend(f"    File \"{f}\", line {n} in {fn}" for f, n, fn in t)
        sys.stderr.flush()
        secrets = secret_values()
        dump = [scrub(line, secrets) for line in dump]
        text = "\n".join(dump) + "\n"
        try:
            with open(os.path.join(os.path.dirname(self.progress_dir), "hang-stacks.txt"), "a") as f:
                f.write(text)
        except OSError:
            pass
        sys.stderr.write("".join(f"halo-sched: node {self.node}: {line}\n" for line in dump))
        sys.stderr.flush()
        # 5. Stay until every node's report is written (this node's end ends the step), then end
        # the node: torchrun stops its ranks and exits non-zero.
        time.sleep(max(0.0, min(abort_at + LINGER_S - time.time(), STOP_SYNC_S + LINGER_S)))
        try:
            os.kill(self.torchrun, signal.SIGTERM)
        except OSError:
            return True
        end = time.monotonic() + 10
        while _alive(self.torchrun) and time.monotonic() < end:
            time.sleep(0.2)
        for pid in [self.torchrun] + list(self.live()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return True


def _read_key() -> str:
    try:
        return (sys.stdin.readline() if sys.stdin is not None else "").strip()
    except (OSError, ValueError):
        return ""


def main(argv: list[str]) -> int:
    """``NODE TORCHRUN_PID PROGRESS_DIR LOG_DIR NPROC TIMEOUT_S FIRST_STEP_S SIGNAL [MIRROR_DIR]``
    (an empty MIRROR_DIR: no mirror); the job's failure key on stdin (its first line), never in
    the environment, where a rank of the same user could read it (/proc/PID/environ)."""
    node, torchrun, progress_dir, log_dir, nproc, timeout_s, first_step_s, sig = argv[:8]
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # torchrun ended: nothing to watch
    m = Monitor(int(node), int(torchrun), progress_dir, log_dir, int(nproc), float(timeout_s),
                float(first_step_s), int(sig) if sig.isdigit() else 0, mirror=argv[8] if len(argv) > 8 else None,
                key=_read_key())
    try:
        while m.watch():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the report, bounded by its own waits
            if m.fire():
                break
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    finally:
        if m.mirror is not None:  # the ranks' last reports, as the job ends
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            m.mirror.copy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
