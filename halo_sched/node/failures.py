"""Which rank failed first, and why: read the ``halo-sched-failure`` lines a job's nodes wrote.

Each node's entry script runs ``failure_collector.py`` after torchrun exits non-zero; it writes one
``halo-sched-failure {json}`` line per failed rank into the node's output. Backends find those
lines where the output lands (local: the job directory; SLURM: the job's output file, every node
with ``--label``; Nomad: each allocation's task log), whatever prefix the line got on the way.

The first failure is the earliest by time, not the lowest rank: in a torchrun world one dead rank
makes its peers fail moments later (a closed connection, a collective timing out), and those
victims are what a reader sees first in interleaved logs.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Iterable

from .failure_collector import TAG

_MARK = TAG + " {"
# What Python prints before its own words when it cannot start a script ("/usr/bin/python3.11: can't
# open file '/x/train.py': [Errno 2] No such file or directory"), and the errno in brackets.
_INTERPRETER = re.compile(r"^\S*python[\d.]*:\s+")
_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")


def headline(error: str) -> str:
    """The words of an error line that say what went wrong, without the interpreter's path and
    the errno: "can't open file '/x/train.py': No such file or directory"."""
    text = " ".join(error.split())
    return _ERRNO.sub("", _INTERPRETER.sub("", text, count=1))


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
                "tail": list(self.tail), "stopped": self.stopped,
                **({"node_name": self.node_name} if self.node_name else {})}


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_line(line: str) -> RankFailure | None:
    """The failure a line carries, or None. Any prefix before the tag is ignored (``[node 1] ``,
    SLURM's ``1: ``); a line that is not a whole, well-formed record is not a failure."""
    i = line.find(_MARK)
    if i < 0:
        return None
    try:
        data = json.loads(line[i + len(TAG) + 1:])
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("time"), (int, float)):
        return None
    node = _int(data.get("node"))
    if node is None:
        return None
    tail = data.get("tail") if isinstance(data.get("tail"), list) else []
    return RankFailure(
        node=node, rank=_int(data.get("rank")), local_rank=_int(data.get("local_rank")),
        host=str(data.get("host") or ""), exit_code=_int(data.get("exit_code")),
        signal=data.get("signal") if isinstance(data.get("signal"), str) else None,
        time=float(data["time"]), error=str(data.get("error") or ""),
        tail=tuple(str(t) for t in tail), stopped=bool(data.get("stopped")),
        node_name=data.get("node_name") if isinstance(data.get("node_name"), str) else "",
    )


def parse_lines(lines: Iterable[str]) -> list[RankFailure]:
    """Every failure in ``lines``, once each (a line read twice, e.g. stdout and stderr, counts once)."""
    seen, out = set(), []
    for line in lines:
        f = parse_line(line)
        if f is not None and f not in seen:
            seen.add(f)
            out.append(f)
    return out


def _order(f: RankFailure) -> tuple:
    # Earliest first; on a tie, a rank that failed on its own before one stopped by the
    # scheduler, a named rank before a whole node, then the lower rank.
    return (f.time, f.stopped, f.rank is None, f.rank if f.rank is not None else f.node or 0)


def first_failure(failures: Iterable[RankFailure]) -> RankFailure | None:
    """The failure that came first: a victim the scheduler stopped never wins over a real one."""
    failures = list(failures)
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
    def first(self) -> RankFailure | None:
        return self.cause if self.cause is not None else first_failure(self.failures)

    def others(self) -> int:
        return len(self.failures) - 1 if self.failures else 0

    def describe(self) -> str:
        first = self.first
        if first is None:
            return ""
        text = first.describe()
        n = self.others()
        if n:
            text += f"; {n} other {'rank' if n == 1 else 'ranks'} ended after it"
        return text

    def to_dict(self) -> dict:
        first = self.first
        return {"first": first.to_dict() if first else None,
                "others": self.others(),
                "failures": [f.to_dict() for f in sorted(self.failures, key=_order)]}


def report_from_lines(lines: Iterable[str]) -> FailureReport | None:
    failures = parse_lines(lines)
    return FailureReport(failures) if failures else None


def report_from_files(paths: Iterable) -> FailureReport | None:
    """The failures found in these files (missing ones skipped); read whole, line by line."""
    def lines():
        for p in paths:
            try:
                with open(p, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if TAG in line:
                            yield line
            except OSError:
                continue
    return report_from_lines(lines())


def classify(report, status=None):
    """Whose fault the failure is: the node's, the job's or unknown (see failure_classes.py)."""
    from .failure_classes import classify as _classify

    return _classify(report, status)
