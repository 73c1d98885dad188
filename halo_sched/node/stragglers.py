"""Who is slow, from the progress files (``progress.py``) the submitter can read while a job runs.

Each rank's file holds a ``STEP UNIX_TIME`` line per reported step (its last ones, read by
``hang_monitor.read_reports``). Per node: the current step (the lowest of its ranks) and the
median step time over the last ``WINDOW`` steps. The slowest rank:
in a synchronous job every rank steps at the same pace (each waits for the slowest in the step's
collective), so a straggler shows only in *when* it reports a step against the others, and only
when ranks report before the step's collective (after their own compute): its median delay behind
the median rank, over the last ``WINDOW`` steps every rank reported. Ranks that report after the
collective report together: no straggler can be seen (``describe`` says so). Standard library only.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from .hang_monitor import read_reports

WINDOW = 50
#: A rank is named the straggler when it reports this share of a step time or more behind the median rank.
THRESHOLD = 0.1


def read(log_root: Path) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(node, rank) -> its last reports, from ``LOGROOT/node-K/progress/rank-R``."""
    out = {}
    for p in sorted(Path(log_root).glob("node-*/progress/rank-*")):
        m = re.fullmatch(r"node-(\d+)", p.parent.parent.name)
        r = re.fullmatch(r"rank-(\d+)", p.name)
        if m and r:
            reports = read_reports(str(p), WINDOW + 1)
            if reports:
                out[(int(m[1]), int(r[1]))] = reports
    return out


def _step_time(reports: list[tuple[int, float]]) -> float | None:
    gaps = [(t2 - t1) / (s2 - s1) for (s1, t1), (s2, t2) in zip(reports, reports[1:]) if s2 > s1]
    return statistics.median(gaps) if gaps else None


def summary(progress: dict[tuple[int, int], list[tuple[int, float]]]) -> dict:
    """Per node: step and step time; the slowest rank (or None) and its delay."""
    nodes: dict[int, dict] = {}
    for (node, rank), reports in progress.items():
        n = nodes.setdefault(node, {"step": reports[-1][0], "times": []})
        n["step"] = min(n["step"], reports[-1][0])
        t = _step_time(reports)
        if t is not None:
            n["times"].append(t)
    per_node = {k: {"step": v["step"], "step_time": statistics.median(v["times"]) if v["times"] else None}
                for k, v in sorted(nodes.items())}
    times = [t for v in per_node.values() if (t := v["step_time"]) is not None]
    step_time = statistics.median(times) if times else None
    by_rank = {key: dict(reports) for key, reports in progress.items()}
    common = set.intersection(*(set(r) for r in by_rank.values())) if by_rank else set()
    steps = sorted(common)[-WINDOW:]
    slowest = None
    if len(by_rank) > 1 and steps and step_time:
        delays = {}
        for key, rep in by_rank.items():
            delays[key] = statistics.median(rep[s] - statistics.median(r[s] for r in by_rank.values()) for s in steps)
        key = max(delays, key=lambda k: (delays[k], -k[1]))
        if delays[key] >= THRESHOLD * step_time:
            slowest = {"node": key[0], "rank": key[1], "delay": delays[key], "steps": len(steps)}
    return {"nodes": per_node, "step_time": step_time, "slowest": slowest}


def describe(s: dict) -> str:
    """``node 0: step 63, 0.60 s/step; node 1: ...; slowest: rank 1 (node 0), 0.50 s behind the median
    rank each step (83% of the 0.60 s step), over the last 50 steps``."""
    if not s["nodes"]:
        return ""
    parts = [f"node {k}: step {v['step']}" + (f", {v['step_time']:.2f} s/step" if v["step_time"] else "")
             for k, v in s["nodes"].items()]
    text = "; ".join(parts)
    sl = s["slowest"]
    if sl:
        text += (f"; slowest: rank {sl['rank']} (node {sl['node']}), {sl['delay']:.2f} s behind the median rank each "
                 f"step ({100 * sl['delay'] / s['step_time']:.0f}% of the {s['step_time']:.2f} s step), "
                 f"over the last {sl['steps']} steps")
    return text
