"""A run's effective training time (ETTR), measured from the run itself: of the time it held its
nodes, how much trained, and where the rest went, by cause (docs/failures.md, "Effective
training time").

What it reads, per attempt (each a job record, halo_sched/runs.py):

* the scheduler's start and end of the attempt, and when it was submitted (the record);
* the ranks' progress reports (the progress protocol, halo_sched/node/progress.py): local, the
  job directory's ``ranks/node-K/progress/``; SLURM, the hang monitor's copies beside the output
  file (``backends/slurm/progress.py``), where each step of the job that started again (a spare
  swap, a restart in place, a requeue) left its own copy (``progress.N``: node/hang_monitor.py
  ``Mirror``). Nomad keeps them on the nodes: no figures there;
* the restarts inside the attempt: each signed ``halo-sched-swap`` line (``last_state.spares``)
  and each entry of ``last_state.in_place_restarts`` (a dict with the epoch ``time`` the restart
  was decided: a restart in place's, as its signed line says; ``last_state.restarts`` would read
  as SLURM's requeue count, which ``status --json`` calls ``restarts``);
* the failures' times: the signed failure lines (the record's last state, and the output files
  when the attempt restarted inside).

The time is cut into spans, contiguous from the first attempt's start to the last one's end
(or now), each of one cause (:data:`CAUSES`):

``startup``      the first attempt's start to its first step; the last step of a run that
                 completed to its end (the trainer's own start and finish);
``detection``    the last progress report before a failure to the failure being known (the
                 earliest signed failure line after it; else the restart's decision; else the
                 attempt's end);
``restart``      the failure being known to the first step after it, less any queue;
``queue``        a successor's pending time: from the later of its submission and the failed
                 attempt's end to its start;
``rework``       the steps done twice: from the first report after a restart until the step
                 numbers reach the highest step reported before it again;
``maintenance``  a planned swap's gap (a node drained or reserved for maintenance: its signed
                 swap line says ``planned``): the last step before it to the first step after it,
                 in place of detection and restart; not a failure (no MTBF counts it);
``spares_idle``  the hot spares (``slurm.spare_nodes``) held idle: spares / nodes x each
                 attempt's wall time, in seconds of the whole run (a spare never trains).

Everything else is training. ``ettr = train_s / held_s`` with ``held_s = span_s + spares_idle``.
Where the trainer reports each checkpoint's cost (``progress.checkpoint``), the checkpoint interval
that would have lost least given this run's own failures (Young/Daly: sqrt(2 x C x MTBF)) is said.

Everything here is bounded: at most :data:`MAX_NODES` nodes' lowest rank is read (the ranks of a
synchronous job step together), at most :data:`MAX_STEPS` restarts per node; a progress file up to
:data:`WHOLE_BYTES` is read whole, a larger one by binary searches (its lines are in time order).
No torch.
"""
from __future__ import annotations

import math
import os
import re
import stat
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .node.text import MAX_TIME, epoch_time

#: The causes of lost time, in the order they are shown.
CAUSES = ("startup", "detection", "restart", "queue", "rework", "maintenance", "spares_idle")
#: A progress file up to this size is read whole.
WHOLE_BYTES = 1 << 20
#: At most this many nodes' files are read (the lowest rank of each, nodes 0, 1, ...).
MAX_NODES = 16
#: At most this many steps (the current one and the copies of earlier ones) per node.
MAX_STEPS = 65
#: At most this many restarts inside one attempt are taken from its record (of each kind).
MAX_EVENTS = 256
#: A checkpoints file: its last this many bytes are read.
CHECKPOINT_BYTES = 65536
_RANK = re.compile(r"rank-(\d+)")
_NODE = re.compile(r"node-(\d+)")
_STEP_DIR = re.compile(r"progress(?:\.(\d+))?")


# ---- reading a progress file (bounded) ------------------------------------------------------


def _parse(line: bytes) -> tuple[float, int] | None:
    """``STEP UNIX_TIME`` as (time, step); None for anything else."""
    parts = line.split()
    if len(parts) < 2 or len(parts[0]) > 19:
        return None
    try:
        step, t = int(parts[0]), float(parts[1])
    except ValueError:
        return None
    return (t, step) if 0 <= t < MAX_TIME and 0 <= step < 2 ** 63 else None


def _open(path: Path):
    """A regular file opened for reading in binary, never blocking on a FIFO a job put there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Points:
    """A rank's reports held in memory (a small file: the ring, a short history), time order."""

    def __init__(self, points: list[tuple[float, int]]):
        self.points = sorted(set(points))

    def first_where(self, lo: float, hi: float, min_step: int | None = None) -> tuple[float, int] | None:
        for t, s in self.points:
            if lo <= t < hi and (min_step is None or s >= min_step):
                return t, s
        return None

    def last_before(self, lo: float, hi: float) -> tuple[float, int] | None:
        found = None
        for t, s in self.points:
            if lo <= t < hi:
                found = (t, s)
        return found

    def max_step(self, lo: float, hi: float) -> int | None:
        steps = [s for t, s in self.points if lo <= t < hi]
        return max(steps) if steps else None

    def cuts(self) -> list[float]:
        """Where the steps go back (a restart no line announced): the time of the first report
        after each such fall."""
        out, top = [], None
        for t, s in self.points:
            if top is not None and s < top:
                out.append(t)
                top = s
            top = s if top is None else max(top, s)
        return out


class BigFile:
    """A long history (appended lines, time order) read by binary searches on byte offsets:
    O(log size) reads of 512 bytes for each question."""

    def __init__(self, path: Path, size: int):
        self.path, self.size = path, size

    def _line_at(self, f, off: int) -> tuple[int, tuple[float, int]] | None:
        """(offset of the next whole line at or after ``off``, its report)."""
        f.seek(off)
        chunk = f.read(512)
        start = off
        if off > 0:
            nl = chunk.find(b"\n")
            if nl < 0:
                return None
            chunk, start = chunk[nl + 1:], off + nl + 1
        for line in chunk.split(b"\n")[:-1]:
            p = _parse(line)
            if p is not None:
                return start, p
            start += len(line) + 1
        return None

    def _first_at(self, f, pred) -> tuple[int, tuple[float, int] | None]:
        """(where its line starts, the report) of the first report for which ``pred`` holds,
        ``pred`` false then true along the file; (the file's size, None) when none does."""
        lo, hi = 0, self.size
        while hi - lo > 4096:
            mid = (lo + hi) // 2
            got = self._line_at(f, mid)
            if got is None or pred(got[1]):
                hi = mid
            else:
                lo = mid
        f.seek(lo)
        data = f.read(hi - lo + 4096)
        at = lo
        lines = data.split(b"\n")
        if lo > 0:  # the first piece may be the end of a line begun before lo
            at += len(lines[0]) + 1
            lines = lines[1:]
        for line in lines[:-1]:
            p = _parse(line)
            if p is not None and pred(p):
                return at, p
            at += len(line) + 1
        if hi >= self.size:
            return self.size, None
        got = self._line_at(f, hi)  # the search's window ended on a line the scan did not finish
        return (got[0], got[1]) if got is not None and pred(got[1]) else (self.size, None)

    def _first(self, f, pred) -> tuple[float, int] | None:
        return self._first_at(f, pred)[1]

    def _ask(self, fn):
        try:
            with _open(self.path) as f:
                return fn(f)
        except OSError:
            return None

    def first_where(self, lo: float, hi: float, min_step: int | None = None) -> tuple[float, int] | None:
        if min_step is None:
            p = self._ask(lambda f: self._first(f, lambda q: q[0] >= lo))
        else:  # between two restarts the steps only grow; past ``hi`` (a later restart) anything goes
            p = self._ask(lambda f: self._first(f, lambda q: q[0] >= hi or (q[0] >= lo and q[1] >= min_step)))
        return p if p is not None and lo <= p[0] < hi else None

    def last_before(self, lo: float, hi: float) -> tuple[float, int] | None:
        """The last report before ``hi`` (and at or after ``lo``): the whole lines just before the
        first line at or after ``hi``."""
        def find(f):
            end, _ = self._first_at(f, lambda q: q[0] >= hi)
            start = max(0, end - 4096)
            f.seek(start)
            lines = f.read(end - start).split(b"\n")
            if start > 0:
                lines = lines[1:]  # begun before the window
            for line in reversed(lines):
                p = _parse(line)
                if p is not None and lo <= p[0] < hi:
                    return p
            return None

        return self._ask(find)

    def max_step(self, lo: float, hi: float) -> int | None:
        p = self.last_before(lo, hi)
        return p[1] if p is not None else None

    def cuts(self) -> list[float]:
        return []  # a long file's falls are not searched for: restarts come from their lines


def source(path: Path):
    """A progress file as :class:`Points` (small) or :class:`BigFile`; None if unreadable."""
    try:
        with _open(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > WHOLE_BYTES:
                return BigFile(path, size)
            data = f.read(WHOLE_BYTES)
    except OSError:
        return None
    return Points([p for line in data.split(b"\n")[:-1] if (p := _parse(line)) is not None])


# ---- an attempt's facts -----------------------------------------------------------------------


@dataclass
class Segment:
    """The ranks' reports between two restarts of one attempt (one process per rank)."""

    first: tuple[float, int]
    last: tuple[float, int]
    max_step: int
    #: M -> the first time a report of step >= M came in this segment (None: never).
    reach: Callable[[int], float | None]


@dataclass
class Attempt:
    id: str
    status: str
    submitted: float | None
    start: float | None
    end: float | None  # None: still running (or not known)
    segments: list[Segment] = field(default_factory=list)
    #: When the failures were known: the signed failure lines' times, sorted.
    failures: list[float] = field(default_factory=list)
    #: Restarts inside the attempt (a spare swap, a restart in place): when each was decided.
    restarts: list[float] = field(default_factory=list)
    #: Those of them that were planned swaps (maintenance, node/maintenance.py): no failure.
    planned: list[float] = field(default_factory=list)
    world: int = 0
    spares: int = 0
    #: (time, step, seconds) of each checkpoint a rank reported.
    checkpoints: list[tuple[float, int, float]] = field(default_factory=list)
    #: Whether any progress file of the attempt was found.
    reported: bool = False


def _segments(sources: list[list], restarts: list[float]) -> list[Segment]:
    """The segments of an attempt from its ranks' progress (each rank: the sources of every copy
    of it), cut at the restarts and where a rank's steps fall back: the ranks' stretches between
    two cuts that overlap in time are one segment (the ranks of one step report side by side)."""
    lives: list[tuple[tuple[float, int], tuple[float, int], int, object, float, float]] = []
    cuts = sorted(set(restarts) | {c for rank_sources in sources for s in rank_sources for c in s.cuts()})
    bounds = [0.0] + cuts + [MAX_TIME]
    for rank_sources in sources:
        for lo, hi in zip(bounds, bounds[1:]):
            for s in rank_sources:
                first = s.first_where(lo, hi)
                if first is None:
                    continue
                last = s.last_before(lo, hi) or first
                top = s.max_step(lo, hi)
                lives.append((first, last, max(top if top is not None else first[1], first[1]), s, lo, hi))
    lives.sort(key=lambda x: x[0])
    groups: list[list] = []
    for life in lives:
        if groups:
            g = groups[-1]
            end = max(x[1][0] for x in g)
            if life[4] == g[0][4] and life[0][0] <= end:  # between the same cuts, overlapping
                g.append(life)
                continue
        groups.append([life])
    out = []
    for g in groups:
        def reach(m: int, g=g) -> float | None:
            times = [p[0] for _, _, _, s, lo, hi in g if (p := s.first_where(lo, hi, m)) is not None]
            return min(times) if times else None

        out.append(Segment(min(x[0] for x in g), max((x[1] for x in g), key=lambda p: (p[0], p[1])),
                           max(x[2] for x in g), reach))
    return out


def _rank_files(root: Path) -> tuple[list[list[Path]], list[Path]]:
    """Each read rank's progress files (its ring or own lines, its history; every copy of an
    earlier step too), and the checkpoint files: the lowest rank of each of the first
    :data:`MAX_NODES` nodes."""
    ranks: list[list[Path]] = []
    checkpoints: list[Path] = []
    try:
        nodes = sorted((int(m[1]), d) for d in root.iterdir() if (m := _NODE.fullmatch(d.name)))
    except OSError:
        return [], []
    for _, node_dir in nodes[:MAX_NODES]:
        try:
            steps = sorted(((int(m[1] or 0), d) for d in node_dir.iterdir() if (m := _STEP_DIR.fullmatch(d.name))),
                           key=lambda x: x[0])[:MAX_STEPS]
        except OSError:
            continue
        files: list[Path] = []
        for _, d in steps:
            try:
                found = sorted((int(m[1]), p) for p in d.iterdir() if (m := _RANK.fullmatch(p.name)))
            except OSError:
                continue
            if not found:
                continue
            rank_file = found[0][1]
            files += [rank_file, rank_file.with_name(rank_file.name + ".history")]
            checkpoints.append(rank_file.with_name(rank_file.name + ".checkpoints"))
        if files:
            ranks.append(files)
    return ranks, checkpoints


def read_checkpoints(path: Path) -> list[tuple[float, int, float]]:
    """``STEP UNIX_TIME SECONDS`` lines (the last :data:`CHECKPOINT_BYTES`): (time, step, seconds)."""
    try:
        with _open(path) as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - CHECKPOINT_BYTES))
            data = f.read(CHECKPOINT_BYTES)
    except OSError:
        return []
    if size > CHECKPOINT_BYTES:
        data = data[data.find(b"\n") + 1:]
    out = []
    for line in data.split(b"\n")[:-1]:
        parts = line.split()
        p = _parse(line)
        if p is None or len(parts) < 3:
            continue
        try:
            cost = float(parts[2])
        except ValueError:
            continue
        if 0 <= cost < 1e7:
            out.append((p[0], p[1], cost))
    return out


def _times(items, limit: int = MAX_EVENTS) -> list[float]:
    out = []
    for item in items if isinstance(items, list) else []:
        t = epoch_time(item.get("time")) if isinstance(item, dict) else None
        if t is not None:
            out.append(t)
        if len(out) >= limit:
            break
    return sorted(set(out))


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31 else 0


def progress_root(rec: dict) -> Path | None:
    """Where this attempt's ranks' progress is readable from here (None: nowhere)."""
    backend = rec.get("backend")
    if backend == "local":
        d = (rec.get("scheduler") or {}).get("job_dir") if isinstance(rec.get("scheduler"), dict) else None
        return Path(d) / "ranks" if isinstance(d, str) and d else None
    if backend == "slurm":
        from .backends.slurm.progress import mirror_root

        outputs = rec.get("outputs")
        if isinstance(outputs, list) and all(isinstance(o, str) for o in outputs):
            return mirror_root(outputs, str(rec.get("id")))
    return None


def attempt_of(rec: dict) -> Attempt:
    """One attempt's facts, from its record and the files it names."""
    last = rec.get("last_state") if isinstance(rec.get("last_state"), dict) else {}
    run = rec.get("run") if isinstance(rec.get("run"), dict) else {}
    start, end = epoch_time(last.get("started_at")), epoch_time(last.get("ended_at"))
    if start is None:
        start = epoch_time(run.get("observed_start"))
    if end is None:
        end = epoch_time(run.get("observed_end"))
    status = last.get("status") if isinstance(last.get("status"), str) else "UNKNOWN"
    from .jobstate import JobStatus

    try:
        terminal = JobStatus(status).terminal
    except ValueError:
        terminal = False
    if not terminal:
        end = None
    spec = rec.get("spec") if isinstance(rec.get("spec"), dict) else {}
    servers = spec.get("servers") if isinstance(spec.get("servers"), list) else []
    world = _count(rec.get("nodes") or spec.get("nodes")) + sum(_count(s.get("nodes")) for s in servers
                                                                 if isinstance(s, dict))
    slurm = spec.get("slurm") if isinstance(spec.get("slurm"), dict) else {}
    spares_state = last.get("spares") if isinstance(last.get("spares"), dict) else {}
    restarts = sorted(set(_times(spares_state.get("swaps")) + _times(last.get("in_place_restarts"))))
    a = Attempt(str(rec.get("id")), status, epoch_time(rec.get("submitted")), start, end, restarts=restarts,
                world=world, spares=_count(slurm.get("spare_nodes")))
    failure = last.get("failure") if isinstance(last.get("failure"), dict) else {}
    fails = [f for f in failure.get("failures") or [] if isinstance(f, dict) and f.get("trusted") is not False]
    a.failures = _times(fails)
    a.planned = _times([s for s in spares_state.get("swaps") or [] if isinstance(s, dict) and s.get("planned") is True])
    root = progress_root(rec)
    if root is None:
        return a
    ranks, cps = _rank_files(root)
    sources = [[s for p in files if (s := source(p)) is not None] for files in ranks]
    sources = [s for s in sources if s]
    a.reported = bool(sources)
    a.segments = _segments(sources, restarts)
    if len(a.segments) > 1 or restarts:  # failures before each restart: the output's signed lines
        a.failures = sorted(set(a.failures) | set(_output_failures(rec)))
    a.checkpoints = sorted({c for p in cps for c in read_checkpoints(p)})
    return a


def _output_failures(rec: dict) -> list[float]:
    from . import records
    from .node.failures import report_from_files

    outputs = rec.get("outputs")
    if not isinstance(outputs, list):
        return []
    report = report_from_files([o for o in outputs if isinstance(o, str)],
                               records.failure_key(str(rec.get("id")), str(rec.get("backend"))))
    return [f.time for f in (report.trusted if report is not None else [])
            if epoch_time(f.time) is not None][:MAX_EVENTS]


# ---- the accounting (pure) --------------------------------------------------------------------


@dataclass
class Accounting:
    span_s: float
    held_s: float
    train_s: float
    lost_s: dict[str, float]
    failures: int
    #: (attempt index, from, to, cause or "train"), in time order: what the timeline draws.
    spans: list[tuple[int, float, float, str]]
    start: float
    end: float
    running: bool
    attempts: list[str]
    reported: bool
    checkpoint: dict | None = None

    @property
    def ettr(self) -> float | None:
        return self.train_s / self.held_s if self.held_s > 0 and self.reported else None

    def to_dict(self) -> dict:
        return {"ettr": None if self.ettr is None else round(self.ettr, 6),
                "lost_s": {k: round(v, 3) for k, v in self.lost_s.items()},
                "span_s": round(self.span_s, 3), "held_s": round(self.held_s, 3),
                "train_s": round(self.train_s, 3), "failures": self.failures,
                **({"checkpoint": self.checkpoint} if self.checkpoint else {}),
                **({} if self.reported else {"note": "no progress reports found"})}


_ENDS_WELL = ("COMPLETED", "CANCELLED")


def _known(a: Attempt, first: float, last: float, hi: float, otherwise: float) -> float:
    """When the failure that ended a segment (first report ``first``, last ``last``) was known, at
    most ``hi``: the earliest signed failure line after its first report (a crash is dated by the
    rank's death, often just before a peer's last report: then at ``last``), else the first
    restart decided after its last report, else ``otherwise``."""
    for t in a.failures:
        if first < t <= hi:
            return min(hi, max(t, last))
    for t in a.restarts:
        if last <= t <= hi:
            return t
    return otherwise


def account(attempts: list[Attempt], now: float) -> Accounting | None:
    """The run's time, cut into spans by cause (module docstring); None before it started."""
    if not attempts or attempts[0].start is None:
        return None
    spans: list[tuple[int, float, float, str]] = []

    def add(i: int, cause: str, lo: float, hi: float) -> None:
        if hi > lo:
            spans.append((i, lo, hi, cause))

    cursor, pending = attempts[0].start, "startup"
    top: int | None = None  # the highest step reported so far
    failures = 0
    running = False
    for i, a in enumerate(attempts):
        if i > 0:
            prev_end = attempts[i - 1].end if attempts[i - 1].end is not None else cursor
            if a.start is None:
                if a.end is not None:
                    break  # ended without ever starting (cancelled while pending)
                q_from = max(cursor, prev_end, a.submitted or cursor)
                add(i - 1, pending, cursor, min(q_from, prev_end, now))
                add(i, pending, max(cursor, prev_end), min(q_from, now))
                add(i, "queue", q_from, now)
                cursor, running = max(cursor, now), True
                break
            q_from = min(max(cursor, prev_end, a.submitted or cursor), max(a.start, cursor))
            add(i - 1, pending, cursor, min(q_from, prev_end))  # the failed attempt's own end
            add(i, pending, max(cursor, prev_end), q_from)
            add(i, "queue", q_from, a.start)
            cursor = max(cursor, a.start)
        stop = max(cursor, a.end if a.end is not None else now)

        def at(t: float) -> float:
            return min(max(t, cursor), stop)

        failures += max(0, max(len(a.restarts), len(a.segments) - 1) - len(a.planned))
        for k, seg in enumerate(a.segments):
            first_t = at(seg.first[0])
            add(i, pending, cursor, first_t)
            train_from = first_t
            if top is not None and seg.first[1] < top:  # the steps go back: redone up to the top
                reach = seg.reach(top)
                train_from = max(first_t, at(reach if reach is not None else seg.last[0]))
                add(i, "rework", first_t, train_from)
            last_t = max(at(seg.last[0]), train_from)
            add(i, "train", train_from, last_t)
            top = seg.max_step if top is None else max(top, seg.max_step)
            cursor = last_t
            if k + 1 < len(a.segments):
                nxt = at(a.segments[k + 1].first[0])
                if any(seg.first[0] <= t <= nxt for t in a.planned):  # a planned swap: nothing failed
                    cursor, pending = last_t, "maintenance"
                    continue
                known = _known(a, seg.first[0], last_t, nxt, last_t)
                add(i, "detection", last_t, known)
                cursor, pending = known, "restart"
        stepping = bool(a.segments)  # the last thing the attempt did was a step (else: it was starting)
        if a.end is None:  # running: the step under way trains, unless a failure came after it
            if stepping:
                known = _known(a, a.segments[-1].first[0], cursor, now, now)
                if known < now:
                    add(i, "detection", cursor, known)
                    cursor, pending, stepping = known, "restart", False
            add(i, "train" if stepping else pending, cursor, now)
            cursor, running = max(cursor, now), True
            break
        if a.status in _ENDS_WELL:
            add(i, "startup" if stepping else pending, cursor, a.end)
            cursor = max(cursor, a.end)
            break
        failures += 1
        if stepping:
            known = _known(a, a.segments[-1].first[0], cursor, a.end, a.end)
            add(i, "detection", cursor, known)
            cursor, pending = max(cursor, known), "restart"
        if i == len(attempts) - 1 or attempts[i + 1].start is None and attempts[i + 1].end is not None:
            add(i, pending, cursor, a.end)  # nothing followed: the rest of it is lost to the failure
            cursor = max(cursor, a.end)
    lost = dict.fromkeys(CAUSES, 0.0)
    train = 0.0
    for _, lo, hi, cause in spans:
        if cause == "train":
            train += hi - lo
        else:
            lost[cause] += hi - lo
    start = attempts[0].start
    for a in attempts:
        if a.start is not None and a.world > 0 and a.spares:
            lost["spares_idle"] += a.spares / a.world * max(0.0, (a.end if a.end is not None else now) - a.start)
    span = float(max(0.0, cursor - start))
    acc = Accounting(span, span + lost["spares_idle"], train, lost, failures, spans, start, max(cursor, start),
                     running, [a.id for a in attempts], any(a.reported or a.segments for a in attempts))
    acc.checkpoint = checkpoint_advice(attempts, failures)
    return acc


def checkpoint_advice(attempts: list[Attempt], failures: int) -> dict | None:
    """From the checkpoints the trainer reported: their median cost, the interval between them,
    and (after a failure) the interval that would have lost least: Young/Daly's sqrt(2 x C x MTBF),
    MTBF the attempts' wall time over this run's failures."""
    costs = [c for a in attempts for _, _, c in a.checkpoints]
    if not costs:
        return None
    out: dict = {"cost_s": round(statistics.median(costs), 3), "reported": len(costs)}
    gaps = [t2 - t1 for a in attempts for (t1, _, _), (t2, _, _) in zip(a.checkpoints, a.checkpoints[1:]) if t2 > t1]
    if gaps:
        out["interval_s"] = round(statistics.median(gaps), 3)
    up = sum(max(0.0, a.end - a.start) for a in attempts if a.start is not None and a.end is not None)
    if failures and up > 0:
        mtbf = up / failures
        out["mtbf_s"] = round(mtbf, 3)
        out["best_interval_s"] = round(math.sqrt(2 * out["cost_s"] * mtbf), 3)
    return out


# ---- a run, from the history store ------------------------------------------------------------


def of_records(recs: list[dict], now: float | None = None) -> Accounting | None:
    """The accounting of the attempts these records are (in order)."""
    return account([attempt_of(r) for r in recs], time.time() if now is None else now)


def run_records(run_id: str, backend: str | None) -> list[dict]:
    """The run's attempts' records in order (a job without ``retry:``: its own record)."""
    from . import records

    recs = [r for r in records.of_run(run_id, backend)
            if isinstance(r.get("run"), dict) and r["run"].get("id") == run_id]
    return recs or records.find(run_id, backend)[:1]


def of_run(run_id: str, backend: str | None, now: float | None = None, keep: bool = True) -> dict | None:
    """``status RUN``'s figures (:meth:`Accounting.to_dict`), measured now; once every attempt has
    ended they are kept in the run's first record (``ettr``: what ``export`` carries), and read
    from there when the files they came from are gone."""
    recs = run_records(run_id, backend)
    if not recs:
        return None
    acc = of_records(recs, now)
    kept = recs[0].get("ettr") if isinstance(recs[0].get("ettr"), dict) else None
    ids = [str(r.get("id")) for r in recs]
    if acc is None or not acc.reported:
        if kept is not None and kept.get("attempts") == ids and _well_formed(kept):
            out = {k: v for k, v in kept.items() if k not in ("attempts", "at")}
            return {**out, "lost_s": {**dict.fromkeys(CAUSES, 0.0), **out["lost_s"]}}  # kept before a cause was
        return acc.to_dict() if acc is not None else None
    out = acc.to_dict()
    if keep and not acc.running and all(a.end is not None for a in map(attempt_of, recs[-1:])):
        _keep(recs[0], {**out, "attempts": ids})
    return out


def _number(v, lo: float = 0.0, hi: float = MAX_TIME) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi


def _well_formed(kept: dict) -> bool:
    """Whether figures kept in a record (a file anyone may have edited) are figures this module
    wrote: numbers in range where numbers go."""
    lost = kept.get("lost_s")
    cp = kept.get("checkpoint")
    return (isinstance(lost, dict) and set(CAUSES) - {"maintenance"} <= set(lost) <= set(CAUSES)  # an earlier release's
            and all(_number(v) for v in lost.values())
            and all(_number(kept.get(k)) for k in ("span_s", "held_s", "train_s"))
            and (kept.get("ettr") is None or _number(kept.get("ettr"), 0.0, 1.0))
            and isinstance(kept.get("failures"), int) and not isinstance(kept.get("failures"), bool)
            and (cp is None or isinstance(cp, dict) and _number(cp.get("cost_s"), 0.0, 1e7)
                 and isinstance(cp.get("reported"), int) and all(_number(cp[k]) for k in
                                                                 ("interval_s", "mtbf_s", "best_interval_s") if k in cp)))


def _keep(first: dict, value: dict) -> None:
    from . import db, records

    value = db.clean(value)
    old = first.get("ettr") if isinstance(first.get("ettr"), dict) else None
    if old is not None and {k: v for k, v in old.items() if k != "at"} == value:
        return

    def change(rec: dict) -> bool:
        if {k: v for k, v in (rec.get("ettr") or {}).items() if k != "at"} == value:
            return False
        rec["ettr"] = {**value, "at": time.time()}
        return True

    records.update(str(first["id"]), str(first["backend"]), change)


# ---- words ----------------------------------------------------------------------------------


def seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def describe(figures: dict | None) -> list[str]:
    """``status RUN``'s lines on the run's effective training time."""
    if not figures:
        return []
    if figures.get("ettr") is None:
        return ["effective training time: unknown (no progress reports found: the trainer reports none "
                "(halo_sched/node/progress.py), or its files are not readable here)"]
    lost = figures.get("lost_s") or {}
    out = [f"effective training time {figures['ettr']:.1%}: {seconds(figures['train_s'])} trained of "
           f"{seconds(figures['held_s'])} held; lost: "
           + ", ".join(f"{k.replace('_', ' ')} {seconds(lost.get(k, 0.0))}" for k in CAUSES
                       if k != "maintenance" or lost.get(k))]  # said where a planned swap was
    cp = figures.get("checkpoint")
    if cp:
        line = f"checkpoints: {seconds(cp['cost_s'])} each (median of {cp['reported']})"
        if "interval_s" in cp:
            line += f", every {seconds(cp['interval_s'])}"
        if "best_interval_s" in cp:
            line += (f"; with this run's {figures['failures']} failure{'s' if figures['failures'] != 1 else ''} "
                     f"(one per {seconds(cp['mtbf_s'])} up), every {seconds(cp['best_interval_s'])} would have "
                     f"lost least (Young/Daly: sqrt(2 x cost x MTBF))")
        else:
            line += "; no failure yet to size the interval by"
        out.append(line)
    return out


__all__ = ["Accounting", "Attempt", "CAUSES", "Segment", "account", "attempt_of", "checkpoint_advice", "describe",
           "of_records", "of_run", "progress_root", "read_checkpoints", "run_records", "seconds", "source"]
