"""``halo-sched timeline ID``: each rank's progress, stall, failure or hang over the job's wall time.

Where it comes from:

* progress: each rank's ``STEP UNIX_TIME`` lines (the progress protocol,
  ``halo_sched/node/progress.py``), under the job's log root as ``node-K/progress/rank-R``: lines
  the trainer appended (the whole history), or the helper's ring of the last 128 reports and its
  ``rank-R.history`` (a line every 0.5 s at most), read together. A file is read boundedly: up to :data:`WHOLE_BYTES` whole,
  a larger one only where a column starts (a binary search on time per column edge, a few hundred
  small reads), which says exactly whether a rank reported within each column however long the job.
  Reachable where the log root is: local, the job directory; SLURM, the copies each node's hang
  monitor keeps beside the job's output file (``OUTPUT_DIR/.halo-progress/JOB_ID``, the same layout;
  ``backends/slurm/progress.py``); Nomad keeps it on the nodes (a temporary directory unless
  ``HALO_LOG_DIR`` is on a shared filesystem), so there (and on SLURM without a copy) the rows show
  what the nodes' failure lines say (the last step and when it was reported) and no step history;
* failures and hangs: the ``halo-sched-failure`` lines the nodes wrote into the job's output
  (``node/failures.py``), with the culprit as ``FailureReport.first`` names it;
* the job's start and end: the scheduler's times (``JobState.started_at``/``ended_at``), else the
  record's submit time and the last thing seen.

:func:`layout` turns the parsed records (:class:`Timeline`) into rows of cells, :func:`render_text`
and :func:`render_svg` draw them; both are pure. :func:`gather` does the reading. For a run's
first attempt, the run's attempts come first (:func:`run_layout`, :func:`render_run_text`,
:func:`run_svg`): one row each over the run's time, the time lost by cause (halo_sched/ettr.py).
No torch.
"""
from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

# The latest time a report may carry, and the check every time read from a job passes.
from .node.text import MAX_TIME, epoch_time as _time

#: A progress file up to this size is read whole; a larger one only at the columns' edges.
WHOLE_BYTES = 1 << 20
#: A gap between two reports of at most this many step times is still stepping (a step longer
#: than a column must not draw as a stall).
BRIDGE = 3.0

# Cell kinds.
NONE, STEP, QUIET, UNSEEN, HUNG, EXIT, STOPPED = " ", "P", "Q", "U", "H", "X", "S"

GLYPHS_UNICODE = {NONE: " ", STEP: "█", QUIET: "·", UNSEEN: "░", HUNG: "H", EXIT: "X", STOPPED: "s"}
GLYPHS_ASCII = {NONE: " ", STEP: "#", QUIET: ".", UNSEEN: "~", HUNG: "H", EXIT: "X", STOPPED: "s"}
LEGEND = [(STEP, "progress reported"), (QUIET, "no progress"), (UNSEEN, "running, steps not recorded here"),
          (HUNG, "hung (monitor fired)"), (EXIT, "failed"), (STOPPED, "stopped (after another failed, or by a cancel)")]


@dataclass
class Timeline:
    """What a job's timeline is drawn from (parsed already)."""

    job_id: str
    name: str = ""
    backend: str = ""
    #: The job's state in words (``FAILED: HUNG after step 4 ...``).
    state: str = ""
    start: float | None = None
    #: None: the job still runs (the timeline ends at ``now``).
    end: float | None = None
    now: float = 0.0
    #: (node, rank) -> its reports (step, unix time), oldest first; may be the reports found at
    #: the columns' edges only (see :func:`read_rank`).
    progress: dict[tuple[int, int], list[tuple[int, float]]] = field(default_factory=dict)
    #: A FailureReport (halo_sched/node/failures.py) or None.
    report: object = None
    #: node -> host, where known.
    hosts: dict[int, str] = field(default_factory=dict)
    #: Every (node, rank) the job has (from its size), reported or not.
    ranks: set[tuple[int, int]] = field(default_factory=set)
    #: Whether the ranks' step history could be read (False: Nomad, SLURM without the nodes' copy).
    history: bool = True
    #: Why not, in words.
    note: str = ""
    #: The job was cancelled: its ranks' ends are the cancel's (SIGTERM), not a failure with a culprit.
    cancelled: bool = False


@dataclass
class Row:
    node: int
    rank: int
    cells: list[str]
    note: str
    culprit: bool = False


@dataclass
class Layout:
    title: str
    state: str
    t0: float
    t1: float
    running: bool
    columns: int
    rows: list[Row]
    hosts: dict[int, str]
    failure: str
    note: str

    @property
    def col_s(self) -> float:
        return (self.t1 - self.t0) / self.columns

    def kinds(self) -> list[str]:
        seen = {c for r in self.rows for c in r.cells}
        return [k for k, _ in LEGEND if k in seen]


# ---- reading ------------------------------------------------------------------------------------


def _parse(line: bytes) -> tuple[int, float] | None:
    parts = line.split()
    if len(parts) < 2:
        return None
    if len(parts[0]) > 19:  # a step beyond 2**63 is no step
        return None
    try:
        step, t = int(parts[0]), float(parts[1])
    except ValueError:
        return None
    # The rank wrote it: a time outside [0, 2**34) s (1e300 overflows every clock) is no report.
    return (step, t) if 0 <= t < MAX_TIME else None




def _parse_all(data: bytes) -> list[tuple[int, float]]:
    """The reports of whole lines in ``data`` (what follows the last new line may be a line the
    rank is still writing: ``12 17961`` would read as a time in 1975)."""
    return [p for line in data.split(b"\n")[:-1] if (p := _parse(line)) is not None]


def _first_at(f, size: int, edge: float) -> tuple[int, float] | None:
    """The first report at or after ``edge`` in a file of reports in time order: a binary search
    on byte offsets, then a short scan."""
    def line_at(off: int) -> tuple[int, float] | None:
        f.seek(off)
        chunk = f.read(512)
        if off > 0:
            nl = chunk.find(b"\n")
            if nl < 0:
                return None
            chunk = chunk[nl + 1:]
        for line in chunk.split(b"\n")[:-1]:
            p = _parse(line)
            if p is not None:
                return p
        return None

    lo, hi = 0, size
    while hi - lo > 1024:
        mid = (lo + hi) // 2
        p = line_at(mid)
        if p is None or p[1] >= edge:
            hi = mid
        else:
            lo = mid
    f.seek(lo)
    data = f.read(hi - lo + 1024)
    lines = data.split(b"\n")
    if lo > 0:
        lines = lines[1:]
    for line in lines[:-1]:
        p = _parse(line)
        if p is not None and p[1] >= edge:
            return p
    return None


def read_rank(path: Path, edges: list[float] | None = None) -> list[tuple[int, float]]:
    """A rank's reports: every one when the file is small (or no edges are given, then only its
    last :data:`WHOLE_BYTES`), else its first and last report and the first report at or after each
    edge: enough to tell in which columns the rank reported, in O(columns x log(size)) reads."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= WHOLE_BYTES or not edges:
                f.seek(max(0, size - WHOLE_BYTES))
                data = f.read(WHOLE_BYTES)
                if size > WHOLE_BYTES:
                    data = data[data.find(b"\n") + 1:]
                return _parse_all(data)
            f.seek(0)
            head = _parse_all(f.read(512))
            f.seek(max(0, size - 512))
            tail = _parse_all(f.read(512).split(b"\n", 1)[-1])
            found = {p for e in edges if (p := _first_at(f, size, e)) is not None}
    except OSError:
        return []
    found.update(head[:1] + tail[-1:])
    return sorted(found, key=lambda p: (p[1], p[0]))


def progress_files(root: Path) -> dict[tuple[int, int], Path]:
    """(node, rank) -> ``ROOT/node-K/progress/rank-R``."""
    out = {}
    for p in sorted(Path(root).glob("node-*/progress/rank-*")):
        m = re.fullmatch(r"node-(\d+)", p.parent.parent.name)
        r = re.fullmatch(r"rank-(\d+)", p.name)
        if m and r:
            out[(int(m[1]), int(r[1]))] = p
    return out


def edges_of(t0: float, t1: float, columns: int) -> list[float]:
    step = (t1 - t0) / columns
    return [t0 + i * step for i in range(columns + 1)]


# ---- layout (pure) ------------------------------------------------------------------------------


def _pace(points: list[tuple[int, float]]) -> float | None:
    """The median time of one step between consecutive reports."""
    gaps = [(t2 - t1) / (s2 - s1) for (s1, t1), (s2, t2) in zip(points, points[1:]) if s2 > s1 and t2 >= t1]
    return statistics.median(gaps) if gaps else None


def _col(t: float, t0: float, col_s: float, columns: int) -> int:
    return min(columns - 1, max(0, int((t - t0) / col_s)))


def span(tl: Timeline) -> tuple[float, float, bool]:
    """(start, end, still running) of the timeline."""
    times = [t for pts in tl.progress.values() for _, t in pts]
    fails = list(getattr(tl.report, "failures", None) or [])
    times += [f.time for f in fails] + [f.last_progress for f in fails if getattr(f, "last_progress", None)]
    running = tl.end is None
    t0 = tl.start if tl.start is not None else (min(times) if times else tl.now)
    t1 = tl.end if tl.end is not None else tl.now
    if times:
        t0 = min(t0, min(times)) if tl.start is None else t0
        if not running:
            t1 = max(t1, max(times))
    if t1 <= t0:
        t1 = t0 + 1.0
    return t0, t1, running


def _failures_by_rank(report) -> tuple[dict[tuple[int, int], object], dict[int, object], object]:
    """(node, rank) -> its failure (a HUNG line wins over an exit line for the same rank: the
    monitor's end of it is what the exit reports); node -> a failure of the node's torchrun that
    names no rank (the earliest); and the culprit."""
    if report is None:
        return {}, {}, None
    out: dict[tuple[int, int], object] = {}
    nodes: dict[int, object] = {}
    for f in report.trusted:  # a line a rank printed marks no rank
        if f.node is None:
            continue
        if f.rank is None:
            if f.node not in nodes or f.time < nodes[f.node].time:
                nodes[f.node] = f
            continue
        key = (f.node, f.rank)
        old = out.get(key)
        if old is None or (f.kind == "HUNG" and old.kind != "HUNG") or (f.kind == old.kind and f.time < old.time):
            out[key] = f
    return out, nodes, report.first


def _note(f, last: tuple[int, float] | None, culprit: bool, history: bool, cancelled: bool = False) -> str:
    step = f.step if f is not None and f.kind == "HUNG" else (last[0] if last else None)
    where = f"step {step}" if step is not None else ("no reports" if history else "")
    if f is None:
        return where
    if f.kind == "HUNG":
        what = "HUNG" + (f" in {f.waiting_in}" if f.waiting_in and not culprit else "")
    elif cancelled:
        what = "stopped by the cancel"
    elif f.stopped:
        what = "stopped"
    else:
        what = f.how()
    # What matters first: a narrow terminal cuts the end.
    return ("CULPRIT: " if culprit else "") + ", ".join(p for p in (what, where) if p)


def layout(tl: Timeline, columns: int) -> Layout:
    """The rows of cells: one per rank, ``columns`` cells over the job's wall time."""
    columns = max(1, columns)
    t0, t1, running = span(tl)
    col_s = (t1 - t0) / columns
    fails, node_fails, first = _failures_by_rank(tl.report)
    if tl.cancelled:
        first = None  # a cancel is not a failure: no rank is its culprit
    hosts = dict(tl.hosts)
    for f in getattr(tl.report, "failures", None) or []:
        if f.node is not None and f.host and f.node not in hosts:
            hosts[f.node] = f.host
    seen = {rank for _, rank in set(tl.progress) | set(fails)}
    # The job's size places rank R on node R // nproc (static node ranks); a report says where it ran.
    expected = {k for k in tl.ranks if k[1] not in seen}
    keys = sorted(expected | set(tl.progress) | set(fails))
    rows = []
    for key in keys:
        pts = sorted(tl.progress.get(key, []), key=lambda p: (p[1], p[0]))
        f = fails.get(key) or node_fails.get(key[0])  # a rank of a node whose torchrun failed as a whole
        culprit = first is not None and f is not None and (
            (first.node, first.rank) == key if first.rank is not None else f is first)
        end = f.time if f is not None else t1
        cells = [NONE] * columns
        end_col = _col(end, t0, col_s, columns) if end < t1 else columns
        fill = QUIET if tl.history else UNSEEN
        for c in range(end_col):
            cells[c] = fill
        if tl.history:
            pace = _pace(pts)
            for (sa, ta), (sb, tb) in zip(pts, pts[1:]):
                # Steps made over the gap at no worse than BRIDGE x the rank's pace: progress (the
                # helper's history has a line every 0.5 s, many steps apart).
                if pace is not None and tb - ta <= BRIDGE * pace * max(1, sb - sa):
                    for c in range(_col(ta, t0, col_s, columns), _col(tb, t0, col_s, columns) + 1):
                        if c < end_col:
                            cells[c] = STEP
            for _, t in pts:
                c = _col(t, t0, col_s, columns)
                if c < end_col or (f is None and c < columns):
                    cells[c] = STEP
        else:
            last = f.last_progress if f is not None and f.kind == "HUNG" else None
            if last is not None:
                for c in range(_col(last, t0, col_s, columns) + 1, end_col):
                    cells[c] = QUIET
        if f is not None:
            stopped = f.stopped or tl.cancelled
            cells[min(end_col, columns - 1)] = HUNG if f.kind == "HUNG" else (STOPPED if stopped else EXIT)
        rows.append(Row(key[0], key[1], cells, _note(f, pts[-1] if pts else None, culprit, tl.history, tl.cancelled),
                        culprit))
    failure = tl.report.describe() if tl.report is not None and tl.report.first is not None and not tl.cancelled else ""
    title = f"job {tl.job_id}" + (f" ({tl.name})" if tl.name and tl.name not in tl.job_id else "") + (
        f" on {tl.backend}" if tl.backend else "")
    return Layout(title, tl.state, t0, t1, running, columns, rows, hosts, failure, tl.note)


# ---- drawing --------------------------------------------------------------------------------------


def printable(text: str, limit: int = 200) -> str:
    """User-given text for a terminal: what cannot be printed (escape sequences, new lines) as ?."""
    text = "".join(c if c.isprintable() else "?" for c in str(text))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _clock(t: float, with_date: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(t))


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def label_width(rows: list[Row]) -> int:
    return max([len(f"  rank {r.rank} ") + 1 for r in rows] + [10])


def note_width(rows: list[Row]) -> int:
    return min(40, max([len(r.note) for r in rows] + [0]))


def columns_for(width: int, rows: list[Row]) -> int:
    """How many cells fit a line of ``width`` characters beside the labels and notes (a narrow
    line keeps at least 10 cells and cuts the notes)."""
    return max(10, width - label_width(rows) - min(note_width(rows), max(12, width // 3)) - 2)


def _axis(lay: Layout, glyphs_unicode: bool) -> tuple[str, str]:
    """The time labels line and the tick line, over the cells."""
    n = lay.columns
    ticks = [0] + [round(i * (n - 1) / k) for k in [max(1, n // 25)] for i in range(1, k)] + [n - 1]
    ticks = sorted(set(ticks))
    tick = list(("─" if glyphs_unicode else "-") * n)
    for i in ticks:
        tick[i] = "┼" if glyphs_unicode else "+"
    tick[0] = "├" if glyphs_unicode else "|"
    tick[-1] = "┤" if glyphs_unicode else "|"
    labels = [" "] * (n + 10)
    for i in ticks:
        text = "now" if (i == n - 1 and lay.running) else _clock(lay.t0 + (i + (1 if i == n - 1 else 0)) * lay.col_s)
        at = max(0, min(i - len(text) // 2, n - len(text))) if 0 < i < n - 1 else (0 if i == 0 else n - len(text))
        if at < 0 or any(c != " " for c in labels[max(0, at - 1):at + len(text) + 1]):
            continue
        labels[at:at + len(text)] = text
    return "".join(labels).rstrip(), "".join(tick)


def render_text(lay: Layout, unicode: bool = True, width: int | None = None) -> str:
    """The timeline for a terminal: plain characters, no colour; each rank's row within ``width``
    characters where the cells leave room (its note is cut to fit)."""
    g = GLYPHS_UNICODE if unicode else GLYPHS_ASCII
    lw, nw = label_width(lay.rows), note_width(lay.rows)
    if width is not None:
        nw = max(8, min(nw, width - lw - lay.columns - 2))
    # The state's words name the failure that the last lines spell out: its head only, then.
    state = lay.state.split(":", 1)[0] if lay.failure and lay.failure in lay.state else lay.state
    out = [printable(lay.title) + (f": {printable(state, 300)}" if state else "")]
    span_s = lay.t1 - lay.t0
    day = time.localtime(lay.t0)[:3] != time.localtime(lay.t1)[:3]
    out.append(f"from {_clock(lay.t0, True)} to {'now, ' if lay.running else ''}{_clock(lay.t1, day)} "
               f"({_duration(span_s)}); one column = {_duration(lay.col_s)}")
    labels, ticks = _axis(lay, unicode)
    out.append(" " * lw + labels)
    out.append(" " * lw + ticks + (" job running" if lay.running else " job end"))
    node = None
    for r in lay.rows:
        if r.node != node:
            node = r.node
            host = lay.hosts.get(node)
            out.append(f"node {node}" + (f" (host {printable(host, 60)})" if host else ""))
        mark = ("▶" if unicode else ">") if r.culprit else " "
        label = f" {mark}rank {r.rank}".ljust(lw)
        out.append(label + "".join(g[c] for c in r.cells) + "  " + printable(r.note, nw))
    kinds = lay.kinds()
    out.append("legend: " + ", ".join(f"{g[k]} {w}" for k, w in LEGEND if k in kinds)
               + (f", {'▶' if unicode else '>'} culprit" if any(r.culprit for r in lay.rows) else ""))
    if lay.failure:
        out.append(f"culprit: {printable(lay.failure, 600)}" if any(r.culprit for r in lay.rows)
                   else f"failure: {printable(lay.failure, 600)}")
    if lay.note:
        out.append(f"note: {printable(lay.note, 600)}")
    return "\n".join(out) + "\n"


# ---- SVG ------------------------------------------------------------------------------------------

#: What XML 1.0 cannot carry at all (escaping does not help): shown as U+FFFD.
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
_SPACES = str.maketrans("\t\n\r", "   ")
COLOURS = {STEP: "#2e7d32", QUIET: "#d9d9d9", UNSEEN: "#9ecae1", HUNG: "#ef6c00", EXIT: "#c62828", STOPPED: "#8d6e63"}


def xml_text(text: object) -> str:
    """Text (or an attribute value) for XML: markup characters escaped, what XML cannot hold
    replaced, line breaks and tabs as spaces (every text is one line; a parser would turn a
    carriage return into a line feed)."""
    s = _XML_BAD.sub("\ufffd", str(text)).translate(_SPACES)
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def render_svg(lay: Layout, run: RunLayout | None = None) -> str:
    """The timeline as one self-contained SVG document (no scripts, links or external resources);
    a run's attempts (``run``) first, with the lost time coloured by cause."""
    cw, rh, lw = max(2, min(12, 900 // lay.columns)), 16, 110
    bar_w = cw * lay.columns
    nw = 9 * max([len(r.note) for r in lay.rows] + [10])
    width = lay.columns * cw + lw + nw + 20
    y = 20
    body: list[str] = []
    if run is not None:
        part, y = run_svg(run, y, lw, bar_w)
        body += part
        width = max(width, lw + bar_w + 8 + 9 * 60)
    body.append(f'<text x="10" y="{y}" font-weight="bold">{xml_text(lay.title)}</text>')
    y += 18
    if lay.state:
        body.append(f'<text x="10" y="{y}">{xml_text(lay.state)}</text>')
        y += 18
    when = f"from {_clock(lay.t0, True)} to {_clock(lay.t1)} ({_duration(lay.t1 - lay.t0)})"
    body.append(f'<text x="10" y="{y}">{xml_text(when)}</text>')
    y += 22
    ticks = sorted({0, lay.columns} | {round(i * lay.columns / 4) for i in range(1, 4)})
    for i in ticks:
        x = lw + i * cw
        text = "now" if i == lay.columns and lay.running else _clock(lay.t0 + i * lay.col_s)
        anchor = "start" if i == 0 else ("end" if i == lay.columns else "middle")
        body.append(f'<text x="{x}" y="{y}" text-anchor="{anchor}" font-size="10">{xml_text(text)}</text>')
        body.append(f'<line x1="{x}" y1="{y + 3}" x2="{x}" y2="{y + 8}" stroke="#555"/>')
    y += 10
    top = y
    node = None
    for r in lay.rows:
        if r.node != node:
            node = r.node
            host = lay.hosts.get(node)
            y += rh
            head = f"node {node}" + (f" (host {host})" if host else "")
            body.append(f'<text x="10" y="{y - 4}" font-weight="bold">{xml_text(head)}</text>')
        y += rh
        label = ("\u25b6 " if r.culprit else "") + f"rank {r.rank}"
        red = ' fill="#c62828" font-weight="bold"' if r.culprit else ""
        body.append(f'<text x="20" y="{y - 4}"{red}>{xml_text(label)}</text>')
        c = 0
        while c < lay.columns:
            k = r.cells[c]
            e = c
            while e < lay.columns and r.cells[e] == k:
                e += 1
            if k != NONE:
                body.append(f'<rect x="{lw + c * cw}" y="{y - rh + 2}" width="{(e - c) * cw}" height="{rh - 4}" '
                            f'fill="{COLOURS[k]}"><title>{xml_text(dict(LEGEND)[k])}</title></rect>')
            c = e
        body.append(f'<text x="{lw + bar_w + 8}" y="{y - 4}"{red}>{xml_text(r.note)}</text>')
    body.append(f'<line x1="{lw}" y1="{top}" x2="{lw}" y2="{y}" stroke="#000"/>')
    if not lay.running:
        body.append(f'<line x1="{lw + bar_w}" y1="{top}" x2="{lw + bar_w}" y2="{y}" stroke="#000"/>')
    y += 22
    x = 10
    for k, words in LEGEND:
        if k in lay.kinds():
            body.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{COLOURS[k]}"/>')
            body.append(f'<text x="{x + 14}" y="{y}">{xml_text(words)}</text>')
            x += 24 + 7 * len(words)
    for text in ([f"culprit: {lay.failure}" if any(r.culprit for r in lay.rows) else f"failure: {lay.failure}"]
                 if lay.failure else []) + ([f"note: {lay.note}"] if lay.note else []):
        y += 18
        body.append(f'<text x="10" y="{y}">{xml_text(text)}</text>')
    width = max(width, x + 10)
    height = y + 12
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">\n'
            f'<title>{xml_text(lay.title)}</title>\n'
            f'<rect width="100%" height="100%" fill="#fff"/>\n' + "\n".join(body) + "\n</svg>\n")


# ---- a run's attempts (``timeline RUN``): the time by cause -------------------------------------

#: What each span of a run's time is (halo_sched/ettr.py CAUSES, and training).
RUN_KINDS = ("train", "startup", "detection", "restart", "queue", "rework", "maintenance")
RUN_GLYPHS_UNICODE = {"train": "█", "startup": "s", "detection": "d", "restart": "r", "queue": "q", "rework": "w",
                      "maintenance": "m", NONE: " "}
RUN_GLYPHS_ASCII = {**RUN_GLYPHS_UNICODE, "train": "#"}
RUN_WORDS = {"train": "training", "startup": "start-up and finish", "detection": "last step to the failure known",
             "restart": "failure known to the first step after", "queue": "successor pending",
             "rework": "steps done twice", "maintenance": "planned swap: last step to the first after"}
RUN_COLOURS = {"train": "#2e7d32", "startup": "#90a4ae", "detection": "#ef6c00", "restart": "#c62828",
               "queue": "#6a1b9a", "rework": "#f9a825", "maintenance": "#1565c0"}
#: At most this many spans are drawn (a run has at most 20 attempts and a bounded number of restarts).
MAX_SPANS = 4000


@dataclass
class RunLayout:
    """A run's attempts as rows of cells over its time: each cell the cause of most of its time."""

    run_id: str
    t0: float
    t1: float
    running: bool
    columns: int
    ids: list[str]
    rows: list[list[str]]
    #: (attempt index, from, to, kind): the spans, drawn exactly in the SVG.
    spans: list[tuple[int, float, float, str]]
    figures: dict

    @property
    def col_s(self) -> float:
        return (self.t1 - self.t0) / self.columns


def run_layout(run_id: str, acc, columns: int) -> RunLayout:
    """The run's rows (pure): ``acc`` is halo_sched/ettr.py's Accounting."""
    columns = max(1, columns)
    t0, t1 = acc.start, max(acc.end, acc.start + 1.0)
    col_s = (t1 - t0) / columns
    spans = [s for s in acc.spans if s[3] in RUN_KINDS][:MAX_SPANS]
    rows = []
    for i in range(len(acc.attempts)):
        share = [dict() for _ in range(columns)]
        for j, lo, hi, kind in spans:
            if j != i:
                continue
            for c in range(_col(lo, t0, col_s, columns), _col(min(hi, t1), t0, col_s, columns) + 1):
                a, b = max(lo, t0 + c * col_s), min(hi, t0 + (c + 1) * col_s)
                if b > a:
                    share[c][kind] = share[c].get(kind, 0.0) + (b - a)
        # A lost cause in a column wins over training there: seconds lost in an hour stay visible.
        rows.append([max(sh, key=lambda k: (k != "train", sh[k])) if sh else NONE for sh in share])
    return RunLayout(run_id, t0, t1, acc.running, columns, list(acc.attempts), rows, spans, acc.to_dict())


def render_run_text(lay: RunLayout, unicode: bool = True) -> str:
    """The run's attempts for a terminal, with the lost time by cause."""
    from .ettr import describe

    g = RUN_GLYPHS_UNICODE if unicode else RUN_GLYPHS_ASCII
    out = [f"run {printable(lay.run_id)}: {len(lay.ids)} attempt{'s' if len(lay.ids) != 1 else ''}, from "
           f"{_clock(lay.t0, True)} to {'now, ' if lay.running else ''}{_clock(lay.t1)} ({_duration(lay.t1 - lay.t0)}); "
           f"one column = {_duration(lay.col_s)}"]
    width = max([len(f"attempt {i + 1} ") for i in range(len(lay.ids))] + [10])
    for i, (job, cells) in enumerate(zip(lay.ids, lay.rows)):
        out.append(f"attempt {i + 1} ".ljust(width) + "".join(g[c] for c in cells) + "  " + printable(job, 60))
    kinds = {c for r in lay.rows for c in r}
    out.append("legend: " + ", ".join(f"{g[k]} {RUN_WORDS[k]}" for k in RUN_KINDS if k in kinds))
    out += [printable(line, 600) for line in describe(lay.figures)]
    return "\n".join(out) + "\n"


def run_svg(lay: RunLayout, y: int, lw: int, bar_w: int) -> tuple[list[str], int]:
    """The run's attempts as SVG elements from ``y`` down: each span a rectangle at its exact time
    (at least a pixel wide), coloured by cause; the figures under them. Every text is escaped."""
    from .ettr import describe

    span_s = lay.t1 - lay.t0
    body = [f'<text x="10" y="{y}" font-weight="bold">{xml_text(f"run {lay.run_id}: time by cause")}</text>']
    y += 8
    for i, job in enumerate(lay.ids):
        y += 16
        body.append(f'<text x="20" y="{y - 4}">{xml_text(f"attempt {i + 1}")}</text>')
        for j, lo, hi, kind in lay.spans:
            if j != i:
                continue
            x = lw + (lo - lay.t0) / span_s * bar_w
            w = max(1.0, (hi - lo) / span_s * bar_w)
            body.append(f'<rect x="{x:.2f}" y="{y - 14}" width="{w:.2f}" height="12" fill="{RUN_COLOURS[kind]}">'
                        f'<title>{xml_text(f"{RUN_WORDS[kind]}: {_duration(hi - lo)}")}</title></rect>')
        body.append(f'<text x="{lw + bar_w + 8}" y="{y - 4}">{xml_text(job[:60])}</text>')
    y += 20
    x = 10
    for k in RUN_KINDS:
        if any(s[3] == k for s in lay.spans):
            body.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{RUN_COLOURS[k]}"/>')
            body.append(f'<text x="{x + 14}" y="{y}">{xml_text(RUN_WORDS[k])}</text>')
            x += 24 + 7 * len(RUN_WORDS[k])
    for line in describe(lay.figures):
        y += 18
        body.append(f'<text x="10" y="{y}">{xml_text(line[:600])}</text>')
    return body, y + 24


# ---- gathering (reads the job's files) -----------------------------------------------------------


def gather(job_id: str, backend: str, sched, now: float | None = None) -> tuple[Timeline, dict]:
    """The job's timeline input, and its ranks' progress files where this host can read them
    (:func:`load_progress` reads them): its state from the scheduler, failures from its output."""
    from . import records
    from .node.failures import report_from_files

    now = time.time() if now is None else now
    state = sched.query([job_id]).get(job_id)
    rec = (records.find(job_id, backend) or [{}])[0]
    report = state.failure if state is not None and state.failure is not None else None
    if report is None and rec.get("outputs"):
        report = report_from_files(rec["outputs"], rec.get("failure_key") or "")
    tl = Timeline(job_id, name=str(rec.get("name") or ""), backend=backend, now=now, report=report)
    if state is not None:
        from .jobstate import JobStatus

        tl.state = state.describe()
        tl.cancelled = state.status is JobStatus.CANCELLED
        tl.start = _time(state.started_at)
        if state.status.terminal:
            ends = [f.time for f in getattr(report, "failures", None) or []]
            end = _time(state.ended_at)
            tl.end = end if end is not None else (max(ends) if ends else now)
    if tl.start is None:
        tl.start = _time(rec.get("submitted"))
    nodes, per = rec.get("nodes"), rec.get("nproc_per_node")
    if isinstance(nodes, int) and isinstance(per, int) and 0 < nodes * per <= 100000:
        tl.ranks = {(r // per, r) for r in range(nodes * per)}
    root = getattr(sched, "root", None) if backend == "local" else None
    files: dict[tuple[int, int], Path] = {}
    if root is not None:
        import socket

        files = progress_files(Path(root) / job_id / "ranks")
        # Local: every node ran on this host.
        tl.hosts = {n: socket.gethostname() for n, _ in set(tl.ranks) | set(files)}
        load_progress(tl, files, None)
    elif backend == "slurm" and (files := _slurm_mirror(rec, job_id)):
        # The copies each node's hang monitor keeps beside the job's output file.
        load_progress(tl, files, None)
    elif backend == "nomad" and (files := _nomad_copy(sched, job_id)):
        # The allocations' files, read through the clients' fs API (backends/nomad/progress.py).
        load_progress(tl, files, None)
    else:
        tl.history = False
        tl.note = (f"the ranks' step history stays on the nodes with {backend} (under each node's log directory, "
                   "a temporary one unless HALO_LOG_DIR is on a shared filesystem"
                   + ("; the hang monitor's copy beside the job's output file was not found" if backend == "slurm"
                      else "") + "); each row shows what the nodes' failure lines say")
    return tl, files


def _slurm_mirror(rec: dict, job_id: str) -> dict[tuple[int, int], Path]:
    """The progress files SLURM's nodes copied beside the job's output file (``backends/slurm/progress.py``)."""
    from .backends.slurm.progress import mirror_root

    outputs = rec.get("outputs")
    root = mirror_root([str(o) for o in outputs], job_id) if isinstance(outputs, list) else None
    return progress_files(root) if root is not None else {}


def _nomad_copy(sched, job_id: str) -> dict[tuple[int, int], Path]:
    """The progress files of the job's allocations, copied through Nomad's fs API; {} when the
    client cannot read files or none could be read."""
    from .backends.nomad.capabilities import ReadsAllocFiles
    from .backends.nomad.progress import timeline_root
    from .errors import HaloError

    split = getattr(sched, "_split", None)
    try:
        c, name = split(job_id) if split is not None else (None, "")
        if not isinstance(c, ReadsAllocFiles):
            return {}
        allocs, _ = c.job_allocations(name)
    except HaloError:
        return {}
    root = timeline_root(c, allocs)
    return progress_files(root) if root is not None else {}


def load_progress(tl: Timeline, files: dict[tuple[int, int], Path], columns: int | None) -> None:
    """Read the ranks' reports for ``columns`` columns (None: their first and last only, which is
    enough to know the timeline's span)."""
    if columns is None:
        edges = [float("inf")]
    else:
        t0, t1, _ = span(tl)
        edges = edges_of(t0, t1, columns)
    tl.progress = {k: _reports(p, edges) for k, p in files.items()}


def _reports(path: Path, edges: list[float]) -> list[tuple[int, float]]:
    """A rank's reports: those of its file (progress.py's ring of its last steps, or lines a
    trainer appended) and of ``rank-R.history`` beside it (the helper's reports every
    ``HISTORY_S`` seconds), in time order."""
    got = set(read_rank(path, edges)) | set(read_rank(path.with_name(path.name + ".history"), edges))
    return sorted(got, key=lambda p: (p[1], p[0]))


def run_of(job_id: str, backend: str):
    """The run's accounting (halo_sched/ettr.py) when ``job_id`` is a run's first attempt."""
    from . import records
    from .ettr import of_records, run_records

    rec = (records.find(job_id, backend, on_bad=None) or [{}])[0]
    run = rec.get("run")
    if not (isinstance(run, dict) and run.get("id") == job_id):
        return None
    return of_records(run_records(job_id, backend))


def has_anything(tl: Timeline) -> bool:
    return any(tl.progress.values()) or bool(getattr(tl.report, "failures", None))


def _unicode_ok(stream) -> bool:
    try:
        "█·░▶├┼┤─".encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def main(job_id: str, backend: str, sched, svg: str | None = None, width: int | None = None) -> int:
    """``halo-sched timeline``: the text on stdout, the SVG into ``svg``; exit 0."""
    import shutil
    import sys

    from .errors import UsageError, shown

    # $COLUMNS sets the terminal's width too: bounded as --width is (cells are built ranks x width).
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 1000)
    tl, files = gather(job_id, backend, sched)
    acc = run_of(job_id, backend)
    if acc is not None:  # a run's first attempt: its attempts, the time by cause
        run_cols = max(10, width - max(len(f"attempt {len(acc.attempts)} "), 10) - 2 - 62)
        sys.stdout.write(render_run_text(run_layout(job_id, acc, run_cols), unicode=_unicode_ok(sys.stdout)))
    if not has_anything(tl):
        what = "no progress reports or failures to draw" if tl.end is not None else "no progress reported yet"
        print(f"job {job_id}: {what}" + (f" ({printable(tl.state, 300)})" if tl.state else "")
              + (f"; {tl.note}" if tl.note else ""))
        if not (svg and acc is not None):
            return 0
    cols = columns_for(width, layout(tl, 10).rows)
    if has_anything(tl):
        load_progress(tl, files, cols)
        sys.stdout.write(render_text(layout(tl, cols), unicode=_unicode_ok(sys.stdout), width=width))
    if svg:
        svg_cols = max(cols, 200)
        load_progress(tl, files, svg_cols)
        lay = layout(tl, svg_cols)
        text = render_svg(lay, run_layout(job_id, acc, lay.columns) if acc is not None else None)
        try:
            with open(svg, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            raise UsageError(f"--svg {shown(svg)}: {err.strerror or err}") from err
        print(f"halo-sched: wrote the timeline to {svg}", file=sys.stderr)
    return 0
