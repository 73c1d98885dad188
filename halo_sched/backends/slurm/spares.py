"""Restarts inside the allocation as the submitter sees them: the ``halo-sched-swap`` lines (hot
spares) and ``halo-sched-restart`` lines (restarts in place, a crash loop) a job's batch script
wrote (halo_sched/node/restart.py, spares.py) beside its output file (and into it), read back for
``status`` (how many spares are left, which node each replaced, the restarts in place) and for
the node ledger (each swapped-out host, once per job).

A line counts only when its ``mac`` verifies under the job's failure key: any rank can print a
line that looks like one, and a forged one must not put a host of its choosing in the ledger.
"""
from __future__ import annotations

import json

from ...node.failures import verified
from ...node.restart import IN_PLACE, STOP, TAG as RESTART_TAG
from ...node.spares import HOST_RE, SIDE_FILE, TAG
from ...node.text import epoch_time, escape_controls, open_regular

#: At most this many swaps are read (a job has at most 64 spares: models.py).
MAX_SWAPS = 64
#: At most this many restart lines are read (a run has at most 20 attempts, and one crash loop).
MAX_RESTARTS = 32


def _signed(line: str, tag: str, key: str) -> dict | None:
    """The JSON object of a ``TAG {json}`` line when it is whole and signed with ``key``."""
    i = line.find(tag + " {")
    if i < 0 or not key:
        return None
    raw = line[i + len(tag) + 1:].strip()
    if not verified(raw, key):
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _count(v, most: int) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= most else None


def parse_swap(line: str, key: str) -> dict | None:
    """The swap a line carries when it is whole, well formed and signed with ``key``; else None."""
    data = _signed(line, TAG, key)
    if data is None:
        return None
    bad, spare, rank = data.get("bad"), data.get("spare"), data.get("rank")
    if not (isinstance(bad, str) and HOST_RE.fullmatch(bad) and isinstance(spare, str) and HOST_RE.fullmatch(spare)
            and isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 4096):
        return None
    left = data.get("spares_left")
    planned = data.get("planned") is True  # maintenance (node/restart.py planned): no fault, never ledgered
    return {"rank": rank, "bad": bad, "spare": spare,
            "reason": escape_controls(str(data.get("reason") or ""))[:200], "by": str(data.get("by") or "")[:60],
            "time": epoch_time(data.get("time")),
            "spares_left": left if isinstance(left, int) and not isinstance(left, bool) and 0 <= left <= 64 else None,
            "planned": planned, "warned": epoch_time(data.get("warned")) if planned else None}


def parse_restart(line: str, key: str) -> dict | None:
    """The restart in place (``action`` inplace) or crash loop (``action`` stop) a line carries
    when it is whole, well formed and signed with ``key``; else None."""
    data = _signed(line, RESTART_TAG, key)
    if data is None or data.get("action") not in (IN_PLACE, STOP):
        return None
    return {"action": data["action"], "restart": _count(data.get("restart"), 100000),
            "attempt": _count(data.get("attempt"), 1000),
            "class": escape_controls(str(data.get("class") or ""))[:40],
            "reason": escape_controls(str(data.get("reason") or ""))[:200],
            "step": _count(data.get("step"), 2 ** 53), "time": epoch_time(data.get("time"))}


def _lines_in(paths, tag: str, parse, key: str, most: int) -> list[dict]:
    out: list[dict] = []
    for p in paths:
        try:
            with open_regular(p) as f:  # a FIFO at the side file's path is no file: never waited on
                for line in f:
                    if tag in line:
                        s = parse(line, key)
                        if s is not None and s not in out:
                            out.append(s)
                            if len(out) >= most:
                                return out
        except OSError:
            continue
    return out


def swaps_in(paths, key: str) -> list[dict]:
    """Every signed swap in these files, in order (each once)."""
    return _lines_in(paths, TAG, parse_swap, key, MAX_SWAPS)


def restarts_in(paths, key: str) -> list[dict]:
    """Every signed restart line in these files, in order (each once)."""
    return _lines_in(paths, RESTART_TAG, parse_restart, key, MAX_RESTARTS)


def swaps_of(outputs, key: str, ended: bool) -> list[dict]:
    """The job's swaps: from the small file beside each output (node/spares.py SIDE_FILE) while
    it runs; once it has ended, from the output files themselves when no such file holds any (the
    batch host could not write it)."""
    side = swaps_in([str(p) + SIDE_FILE for p in outputs], key)
    return side if side or not ended else swaps_in(outputs, key)


def restarts_of(outputs, key: str, ended: bool) -> list[dict]:
    """The job's restarts in place (and a crash loop), read as :func:`swaps_of` reads swaps."""
    side = restarts_in([str(p) + SIDE_FILE for p in outputs], key)
    return side if side or not ended else restarts_in(outputs, key)


def last_step(report, swaps: list[dict], restarts: list[dict] = ()):
    """The failures of the job's last step, after ``swaps`` and ``restarts`` (in place): a failure
    line of a host on the node rank it was swapped out of is an earlier step's (the host runs no
    rank since), and where the job's signed lines include some dated after the last swap or
    restart, those alone (the steps before it left their victims' lines too). The job's failure, the culprit the node ledger and the run's
    next attempt are given, is then the last step's: a fault of the spare itself is the spare's."""
    from ...node.failures import FailureReport

    gone = {(s["rank"], s["bad"]) for s in swaps}
    kept = [f for f in report.failures if not (f.trusted and (f.node, f.node_name) in gone)]
    times = [s["time"] for s in [*swaps, *(r for r in restarts if r["action"] == IN_PLACE)] if s.get("time") is not None]
    if times:
        later = [f for f in kept if f.trusted and f.time >= max(times)]
        if later:
            kept = later + [f for f in kept if not f.trusted]
    cause = report.cause if report.cause is not None and (report.cause.node, report.cause.node_name) not in gone else None
    if cause is not None and cause not in kept:  # SLURM's own word on a lost node stays the cause
        kept.insert(0, cause)
    return FailureReport(kept, cause)


def with_costs(swaps: list[dict], firsts) -> list[dict]:
    """Each swap with ``cost_s``: from its warning (a planned swap's) or its decision (a fault's)
    to training again, the first progress report of every node rank after the swap (before the
    next swap). ``firsts(lo, hi)``: each node rank's first report time in [lo, hi) (None where
    none; core.py reads the hang monitors' copies); no node rank, or one with none: None."""
    out = []
    for i, sw in enumerate(swaps):
        t, start = sw.get("time"), sw.get("warned") or sw.get("time")
        hi = min([x["time"] for x in swaps[i + 1:] if x.get("time") and t and x["time"] > t], default=float(2 ** 34))
        got = firsts(t, hi) if t else []
        back = max(got) if got and None not in got else None
        out.append({**sw, "cost_s": round(back - start, 2) if back is not None and start else None})
    return out


def spares_state(total: int, swaps: list[dict]) -> dict:
    """``status``'s view: ``{"total", "left", "swaps"}``."""
    return {"total": total, "left": max(0, total - len(swaps)), "swaps": swaps}


__all__ = ["last_step", "parse_restart", "parse_swap", "restarts_in", "restarts_of", "spares_state", "swaps_in",
           "swaps_of", "with_costs"]
