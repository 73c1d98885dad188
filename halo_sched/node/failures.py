"""Which rank failed first, and why: read the ``halo-sched-failure`` lines a job's nodes wrote.

Each node's entry script runs ``failure_collector.py`` after torchrun exits non-zero; it writes one
``halo-sched-failure {json}`` line per failed rank into the node's output. Backends find those
lines where the output lands (local: the job directory; SLURM: the job's output file, every node
with ``--label``; Nomad: each allocation's task log), whatever prefix the line got on the way.

The first failure is the earliest by time, not the lowest rank: in a torchrun world one dead rank
makes its peers fail moments later (a closed connection, a collective timing out), and those
victims are what a reader sees first in interleaved logs.

Any rank can print a line that looks like one of these (issue 28: a forged line dated earlier
became the first failure and put a host of its choosing in the node ledger). A line is
``trusted`` only when its ``mac`` verifies under the job's failure key (failure_collector.sign):
only trusted lines pick the first failure, the culprit of a hang and what the ledger gets; the
others are kept as what they are, text from the job's output, shown as unverified.
"""
from __future__ import annotations

import hmac
import json
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

from .failure_collector import TAG, sign
from .text import epoch_time, escape_controls, open_regular, valid_data

_MARK = TAG + " {"
# What Python prints before its own words when it cannot start a script ("/usr/bin/python3.11: can't
# open file '/x/train.py': [Errno 2] No such file or directory"), and the errno in brackets.
# A signed line's JSON ends with its mac (failure_collector.record_line).
_MAC = re.compile(r',"mac":"([0-9a-f]{64})"\}\s*$')
_INTERPRETER = re.compile(r"^\S*python[\d.]*:\s+")
_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")


def headline(error: str) -> str:
    """The words of an error line that say what went wrong, without the interpreter's path and
    the errno: "can't open file '/x/train.py': No such file or directory"."""
    text = " ".join(error.split())
    return escape_controls(_ERRNO.sub("", _INTERPRETER.sub("", text, count=1)))


@dataclass(frozen=True)
class RankFailure:
    """One rank that ended badly (``rank`` None: the node's torchrun failed without naming one)."""

    node: int | None
    rank: int | None
    local_rank: int | None
    host: str
    exit_code: int | None
    signal: str | None
    time: float
    error: str = ""
    tail: tuple[str, ...] = ()
    #: Stopped by the scheduler or its agent after something else failed (a victim, never the cause).
    stopped: bool = False
    #: The scheduler's name for the node (SLURM's SLURMD_NODENAME, Nomad's NodeName), where known:
    #: what the node ledger records and ``--exclude`` takes (``host`` is torchrun's FQDN).
    node_name: str = ""
    #: "EXIT" (the rank ended badly) or "HUNG" (the node's hang monitor found it without progress).
    kind: str = "EXIT"
    #: The last step it reported (None: never, or no progress protocol; an EXIT line carries it
    #: where the rank reported one). HUNG only: when it last progressed, where its main thread was ("train.py:57" and that line's code), the collective it waited in (None: none),
    #: and whether its stack could be read at all (``error`` says why not).
    step: int | None = None
    last_progress: float | None = None
    where_in: str = ""
    code: str = ""
    waiting_in: str | None = None
    stack_read: bool = False
    #: halo-sched's own word: built by its code, or read from a line whose mac verified under the
    #: job's key (parse_line). False: a line any rank could have printed, never a verdict.
    trusted: bool = True
    #: The node's side (failure_collector.node_evidence, the preflight gate): lines this node's own
    #: code read of the node (the kernel's Xid log, nvidia-smi, the cgroup's OOM kills, a failed
    #: preflight check), each naming its source. ``error`` and ``tail`` are the rank's own words:
    #: they label a failure, they never make it a node's fault (failure_classes.py).
    evidence: tuple[str, ...] = ()

    def where(self) -> str:
        host = f"host {self.host}" if self.host else ""
        if self.rank is None:
            return f"node {self.node}" + (f" ({host})" if host else "")
        inner = ", ".join(p for p in (f"node {self.node}", host, f"local rank {self.local_rank}") if p)
        return f"rank {self.rank} ({inner})"

    def how(self) -> str:
        if self.signal:
            return f"killed by {self.signal}" + (f" (exit {self.exit_code})" if self.exit_code is not None else "")
        return f"exit {self.exit_code}" if self.exit_code is not None else "failed"

    def describe(self) -> str:
        """The rank's own words first (the one line a reader needs), then where and how:
        ``can't open file '/x/train.py': No such file or directory [rank 0 (node 0, ...) exit 2 at
        12:44:28]``."""
        at = time.strftime("%H:%M:%S", time.localtime(self.time))
        text = f"{self.where()} {'torchrun ' if self.rank is None else ''}{self.how()} at {at}"
        error = headline(self.error)
        return f"{error} [{text}]" if error else text

    def to_dict(self) -> dict:
        return {"node": self.node, "rank": self.rank, "local_rank": self.local_rank, "host": self.host,
                "exit_code": self.exit_code, "signal": self.signal, "time": self.time, "error": self.error,
                "tail": list(self.tail), "stopped": self.stopped, "trusted": self.trusted,
                **({"node_name": self.node_name} if self.node_name else {}),
                **({"evidence": list(self.evidence)} if self.evidence else {}),
                **({"step": self.step} if self.step is not None and self.kind != "HUNG" else {}),
                **({"kind": self.kind, "step": self.step, "last_progress": self.last_progress, "where_in": self.where_in,
                    "code": self.code, "waiting_in": self.waiting_in, "stack_read": self.stack_read}
                   if self.kind == "HUNG" else {})}

    def stalled_for(self) -> float:
        return self.time - self.last_progress if self.last_progress is not None else 0.0

    def in_code(self) -> str:
        """``train.py:57 (time.sleep(600))``, or why the stack is unknown."""
        if not self.stack_read:
            return f"stack not read ({self.error})" if self.error else "stack not read"
        return f"in {self.where_in}" + (f" ({self.code})" if self.code else "")


#: Bounds of what a failure line may say (a line is a rank's output: anything can be in it). A time
#: outside [0, 2**34) s (year 2514) is no time of a job's (``localtime`` overflows on 1e300), a whole
#: number outside +-2**53 no exit code, rank or step; texts are cut (the collector writes 400
#: characters of an error, 12 lines of tail).
MAX_INT = 2 ** 53
MAX_TEXT = 2000
MAX_TAIL = 50
MAX_EVIDENCE = 8


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -MAX_INT < v < MAX_INT else None


_time = epoch_time  # a time of the job's, or None


def _text(v, limit: int = MAX_TEXT) -> str:
    return str(v or "")[:limit]


def verified(raw: str, key: str) -> bool:
    """Whether the JSON text ``raw`` of a failure line carries a mac that verifies under ``key``."""
    m = _MAC.search(raw)
    if not key or not m:
        return False
    body = raw[:m.start()] + "}"
    return hmac.compare_digest(sign(body, key), m[1])


def parse_line(line: str, key: str = "") -> RankFailure | None:
    """The failure a line carries, or None. Any prefix before the tag is ignored (``[node 1] ``,
    SLURM's ``1: ``); a line that is not a whole, well-formed record is not a failure. It is
    ``trusted`` when its mac verifies under ``key``, the job's failure key."""
    i = line.find(_MARK)
    if i < 0:
        return None
    raw = line[i + len(TAG) + 1:].strip()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    # A lone surrogate ("\ud800" in the JSON) becomes U+FFFD here, before the text can reach a
    # record, a terminal, JSON output or a webhook (none of which can carry it).
    data = valid_data(data)
    if not isinstance(data, dict) or _time(data.get("time")) is None:
        return None
    node = _int(data.get("node"))
    if node is None:
        return None
    tail = data.get("tail") if isinstance(data.get("tail"), list) else []
    evidence = data.get("evidence") if isinstance(data.get("evidence"), list) else []
    hung = data.get("kind") == "HUNG"
    hang = {} if not hung else {
        "kind": "HUNG", "step": _int(data.get("step")),
        "last_progress": _time(data.get("last_progress")),
        "where_in": _text(data.get("where"), 400), "code": _text(data.get("code"), 400),
        "waiting_in": data.get("waiting_in")[:200] if isinstance(data.get("waiting_in"), str) else None,
        "stack_read": bool(data.get("stack_read")),
    }
    return RankFailure(**(hang or {"step": _int(data.get("step"))}),
        node=node, rank=_int(data.get("rank")), local_rank=_int(data.get("local_rank")),
        host=_text(data.get("host"), 253), exit_code=_int(data.get("exit_code")),
        signal=data.get("signal")[:40] if isinstance(data.get("signal"), str) else None,
        time=_time(data["time"]), error=_text(data.get("error")),
        tail=tuple(_text(t) for t in tail[-MAX_TAIL:]), stopped=bool(data.get("stopped")),
        node_name=data.get("node_name")[:253] if isinstance(data.get("node_name"), str) else "",
        trusted=verified(raw, key),
        evidence=tuple(_text(e, 400) for e in evidence[:MAX_EVIDENCE] if isinstance(e, str)),
    )


def parse_lines(lines: Iterable[str], key: str = "") -> list[RankFailure]:
    """Every failure in ``lines``, once each (a line read twice, e.g. stdout and stderr, counts once)."""
    seen, out = set(), []
    for line in lines:
        f = parse_line(line, key)
        if f is not None and f not in seen:
            seen.add(f)
            out.append(f)
    return out


def _order(f: RankFailure) -> tuple:
    # Earliest first; on a tie, a rank that failed on its own before one stopped by the
    # scheduler, a named rank before a whole node, then the lower rank.
    return (f.time, f.stopped, f.rank is None, f.rank if f.rank is not None else f.node or 0)


def first_failure(failures: Iterable[RankFailure]) -> RankFailure | None:
    """The failure that came first: a victim the scheduler stopped never wins over a real one;
    only trusted lines count (one a rank printed is no verdict)."""
    failures = [f for f in failures if f.trusted]
    real = [f for f in failures if not f.stopped] or failures
    return min(real, key=_order) if real else None


@dataclass
class FailureReport:
    """Every failure of a job, and the one that came first."""

    failures: list[RankFailure] = field(default_factory=list)
    #: A failure known to be the cause whatever the times say (one of ``failures``): a node the
    #: scheduler declared lost is noticed only after its peers crashed waiting for it.
    cause: RankFailure | None = None

    @property
    def trusted(self) -> list[RankFailure]:
        """The failures halo-sched's node-side code reported (a scheduler's own word, such as a
        lost node, is trusted too): the only ones that decide anything."""
        return [f for f in self.failures if f.trusted]

    @property
    def unverified(self) -> list[RankFailure]:
        return [f for f in self.failures if not f.trusted]

    @property
    def hung(self) -> list[RankFailure]:
        """The ranks the nodes' hang monitors reported, one each (a later line for a rank wins)."""
        out: dict[tuple, RankFailure] = {}
        for f in self.trusted:
            if f.kind == "HUNG":
                out[(f.node, f.rank)] = f
        return list(out.values())

    @property
    def kind(self) -> str:
        return "HUNG" if self.hung and self.cause is None else "EXIT"

    @property
    def first(self) -> RankFailure | None:
        if self.cause is None and self.hung:
            return culprit(self.hung)[0]
        return self.cause if self.cause is not None else first_failure(self.failures)

    def others(self) -> int:
        if self.kind == "HUNG":
            return len(self.hung) - 1
        return len(self.trusted) - 1 if self.trusted else 0

    def describe(self) -> str:
        first = self.first
        if first is None:
            odd = self.unverified
            if not odd:
                return ""
            # Text from the job's output, shown as such: it names no rank and no host as the cause.
            said = headline(odd[0].error)[:200]
            return (f"{len(odd)} unverified failure {'line' if len(odd) == 1 else 'lines'} in the job's output "
                    f"(not written by halo-sched's node code){': ' + repr(said) if said else ''}")
        if self.kind == "HUNG":
            return describe_hang(self.hung)
        text = first.describe()
        n = self.others()
        if n:
            text += f"; {n} other {'rank' if n == 1 else 'ranks'} ended after it"
        return text

    def to_dict(self) -> dict:
        first = self.first
        return {"first": first.to_dict() if first else None,
                "kind": self.kind,
                **({"why": culprit(self.hung)[1]} if self.kind == "HUNG" else {}),
                "others": self.others(),
                **({"unverified": len(self.unverified)} if self.unverified else {}),
                "failures": [f.to_dict() for f in sorted(self.failures, key=_order)]}


def culprit(hung: list[RankFailure]) -> tuple[RankFailure, str]:
    """The rank that stopped first among every node's HUNG lines, and why it looks guilty.

    In a synchronous job every rank stops within one step of the culprit, often with the same
    step and the same last report (they all left the previous step's collective together): the
    stacks decide first. The ranks not inside a collective (whose stack was read) are the
    suspects; among the suspects, or among all when there are none, the lowest step (never
    reported counts lowest), then the oldest last progress, then the lowest rank."""
    free = [f for f in hung if f.stack_read and f.waiting_in is None]
    pool = free or hung

    def order(f: RankFailure) -> tuple:
        return (f.step if f.step is not None else -1, f.last_progress or 0.0, f.rank if f.rank is not None else -1)

    pick = min(pool, key=order)
    if len(free) == 1:
        return pick, "the only rank not inside a collective"
    steps = {f.step for f in pool}
    if free:
        why = "not inside a collective"
    else:
        why = "no stack showed a rank outside a collective"
    if len(steps) > 1:
        return pick, f"{why}; the lowest step"
    return pick, f"{why}; the oldest last progress"


def describe_hang(hung: list[RankFailure]) -> str:
    """``HUNG after step 118: rank 3 (node 1, host h2) made no progress for 300 s, in train.py:57
    (time.sleep(600)); 15 ranks waiting in all_reduce``."""
    c, why = culprit(hung)
    step = f" after step {c.step}" if c.step is not None else " before its first progress report"
    text = f"HUNG{step}: {c.where()} made no progress for {c.stalled_for():.0f} s, {c.in_code()} [{why}]"
    waiting: dict[str, int] = {}
    unread = 0
    busy = 0
    for f in hung:
        if f is c:
            continue
        if f.waiting_in:
            waiting[f.waiting_in] = waiting.get(f.waiting_in, 0) + 1
        elif not f.stack_read:
            unread += 1
        else:
            busy += 1
    parts = []
    for i, (what, n) in enumerate(sorted(waiting.items(), key=lambda kv: -kv[1])):
        parts.append(f"{n} {'rank' if n == 1 else 'ranks'} waiting in {what}" if i == 0 else f"{n} in {what}")
    if busy:
        parts.append(f"{busy} more {'rank' if busy == 1 else 'ranks'} outside a collective")
    if unread:
        parts.append(f"{unread} {'rank' if unread == 1 else 'ranks'} whose stack was not read")
    return text + ("; " + ", ".join(parts) if parts else "")


#: The line a node's entry script ends on when it gives up before or around torchrun (templates'
#: ``halo_fail``: "halo-sched: node 1: torchrun not found on PATH (after setup); ..."), and the
#: label the line may have got on the way ("[node 1] ", SLURM's "1: ").
_ENTRY_FAIL = re.compile(r"^halo-sched: node (\d+): (.+)$")
_LABEL = re.compile(r"^(?:\[node (\d+)\] |(\d+): )?(.*)$", re.S)
#: How much of a node's output is read for it: its end only.
ENTRY_TAIL_BYTES = 16384


def entry_failure(lines: Iterable[str], node: int | None = None) -> str | None:
    """Why a node's entry script gave up, in its own words, as ``node K: WHY``: the ``halo_fail``
    line a node's output ends on (each label's last line: a node's own output has none, SLURM's
    is labelled by node), of node ``node`` when given, escaped and cut. For a node that failed
    without a failure line (nothing of torchrun's ran to report), so that the job's last line says
    why ("torchrun not found on PATH") rather than an exit code. A label for the reader, never a
    verdict: it picks no culprit and reaches no ledger."""
    last: dict[str | None, str] = {}
    for line in lines:
        text = line.rstrip("\r\n")
        if text.strip():
            m = _LABEL.match(text)
            last[m.group(1) or m.group(2)] = m.group(3)
    found: list[tuple[int, str]] = []
    for label, text in last.items():
        m = _ENTRY_FAIL.match(text)
        if not m:
            continue
        said = int(m.group(1))
        if (label is not None and int(label) != said) or (node is not None and said != node):
            continue
        found.append((said, f"node {said}: {escape_controls(' '.join(m.group(2).split()))[:400]}"))
    return min(found)[1] if found else None


def entry_failure_in(paths: Iterable, node: int | None = None) -> str | None:
    """:func:`entry_failure` of the last ``ENTRY_TAIL_BYTES`` of each file (missing ones
    skipped); the last file's that says one wins."""
    found = None
    for p in paths:
        try:
            with open(p, "rb") as f:
                size = f.seek(0, 2)
                f.seek(max(0, size - ENTRY_TAIL_BYTES))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        lines = text.splitlines()
        if size > ENTRY_TAIL_BYTES:
            lines = lines[1:]  # the first may be cut
        found = entry_failure(lines, node) or found
    return found


def report_from_lines(lines: Iterable[str], key: str = "") -> FailureReport | None:
    failures = parse_lines(lines, key)
    return FailureReport(failures) if failures else None


def report_from_files(paths: Iterable, key: str = "") -> FailureReport | None:
    """The failures found in these files (missing ones skipped); read whole, line by line."""
    def lines():
        for p in paths:
            try:
                with open_regular(p) as f:  # never waits on a FIFO put at the output's path
                    for line in f:
                        if TAG in line:
                            yield line
            except OSError:
                continue
    return report_from_lines(lines(), key)
