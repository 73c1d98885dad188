"""Who is slow, and why, from the files the submitter can read while a job runs: each rank's
progress reports (``progress.py``), the times it left each step's collective, and each node's
connections as the kernel sees them (``links.py``).

Each rank's file holds a ``STEP UNIX_TIME`` line per reported step (its last ones, read by
``hang_monitor.read_reports``). Per node: the current step (the lowest of its ranks) and the
median step time over the last ``WINDOW`` steps. In a synchronous job every rank steps at the same
pace (each waits for the slowest in the step's collective), so who is slow shows only in *when*
things happen, and three causes look alike by report times alone (measured on the multi-host rig,
docs/failures.md, "Stragglers"): a rank that computes slowly, a rank that waits on a slow peer, and
a host whose network is slow. So:

* **a slow rank** (its compute): where every rank also says when it left each step's collective
  (``rank-R.left``; ``progress.left``), the time it waits there. The rank that computes longest
  arrives last and waits least; it is named when it waits ``THRESHOLD`` of a step time or more
  less than the median rank. A rank waiting on a slow peer waits as long as the others and is
  not named. Without those times: the old rule, when each rank *reports* against the median rank
  (reports made before the step's collective; ranks reporting after it report together and none
  is named).
* **a slow host** (its network): each node's hang monitor writes the round-trip time of its
  ranks' connections to other nodes (``links``). A pair of nodes is slow when its RTT is 4 times
  the fastest pair's or more and exceeds it by ``THRESHOLD`` of a step time (a collective pays a
  few round trips a step; with one pair, the step alone). The node common to two or more slow
  pairs, all of them, is named; one slow pair alone is a slow link, named by both ends. RTT is the
  same seen from either end, so a host needs three nodes or more: with two, a slow link cannot be
  put on either host.

Standard library only.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from . import links as links_file
from .hang_monitor import read_reports

WINDOW = 50
#: A rank is named the straggler when it reports this share of a step time or more behind the median rank.
THRESHOLD = 0.1


def _read_ranks(log_root: Path, suffix: str) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(node, rank) -> the last reports of ``LOGROOT/node-K/progress/rank-R{suffix}``."""
    out = {}
    for p in sorted(Path(log_root).glob(f"node-*/progress/rank-*{suffix}")):
        m = re.fullmatch(r"node-(\d+)", p.parent.parent.name)
        r = re.fullmatch(rf"rank-(\d+){re.escape(suffix)}", p.name)
        if m and r:
            reports = read_reports(str(p), WINDOW + 1)
            if reports:
                out[(int(m[1]), int(r[1]))] = reports
    return out


def read(log_root: Path) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(node, rank) -> its last reports, from ``LOGROOT/node-K/progress/rank-R``."""
    return _read_ranks(log_root, "")


def read_left(log_root: Path) -> dict[tuple[int, int], dict[int, float]]:
    """(node, rank) -> step -> when the rank left that step's collective (``rank-R.left``)."""
    return {key: dict(reports) for key, reports in _read_ranks(log_root, ".left").items()}


def read_links(log_root: Path) -> dict[int, tuple[str, list[tuple[str, str, int, int]]]]:
    """node -> (its host name, its ranks' connections to other hosts), from ``node-K/progress/links``."""
    out = {}
    for p in sorted(Path(log_root).glob("node-*/progress/links")):
        m = re.fullmatch(r"node-(\d+)", p.parent.parent.name)
        if m:
            host, conns = read_links_file(p)
            if host or conns:
                out[int(m[1])] = (host, conns)
    return out


def read_links_file(path) -> tuple[str, list[tuple[str, str, int, int]]]:
    """(host, connections) of one node's ``links`` file (``links.write``), bounded: it is a node's."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read(1 << 16).splitlines()
    except OSError:
        return "", []
    host, out = "", []
    for text in lines[:links_file.MAX_LINKS + 1]:
        parts = text.split()
        if len(parts) == 2 and parts[0] == "host":
            host = links_file.host_name(parts[1])
        elif len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            out.append((parts[0][:64], parts[1][:64], int(parts[2]), int(parts[3])))
    return host, out


def line(log_root: Path) -> str:
    """``describe`` of everything under a job's log root (or its nodes' mirrored copies)."""
    return describe(summary(read(log_root), read_left(log_root), read_links(log_root)))


def _step_time(reports: list[tuple[int, float]]) -> float | None:
    gaps = [(t2 - t1) / (s2 - s1) for (s1, t1), (s2, t2) in zip(reports, reports[1:]) if s2 > s1]
    return statistics.median(gaps) if gaps else None


def summary(progress: dict[tuple[int, int], list[tuple[int, float]]],
            left: dict[tuple[int, int], dict[int, float]] | None = None,
            links: dict[int, tuple[str, list[tuple[str, str, int, int]]]] | None = None) -> dict:
    """Per node: step and step time; the slowest rank (or None) and why; the slow host (or None)."""
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
    waits = _waits(by_rank, left or {})
    hosts = {node: host for node, (host, _) in (links or {}).items() if host}
    network = _network(links or {}, step_time)
    if network:
        network["ranks"] = sorted(r for n, r in progress if n == network["node"])
        network["host"] = hosts.get(network["node"], "")
    slowest = None
    collective = None
    if len(by_rank) > 1 and step_time and waits:
        collective = min(w for w, _ in waits.values())
        median_wait = statistics.median(w for w, _ in waits.values())
        key = min(waits, key=lambda k: (waits[k][0], k[1]))
        extra = median_wait - waits[key][0]
        if extra >= THRESHOLD * step_time:
            slowest = {"node": key[0], "rank": key[1], "delay": extra, "steps": waits[key][1], "kind": "compute",
                       "wait": waits[key][0], "median_wait": median_wait}
    elif len(by_rank) > 1 and steps and step_time and not network:
        # Report times only: a slow rank and a rank behind a slow link look alike (the docstring);
        # with a slow host named, a rank behind it is not named as well.
        delays = {}
        for key, rep in by_rank.items():
            delays[key] = statistics.median(rep[s] - statistics.median(r[s] for r in by_rank.values()) for s in steps)
        key = max(delays, key=lambda k: (delays[k], -k[1]))
        if delays[key] >= THRESHOLD * step_time:
            slowest = {"node": key[0], "rank": key[1], "delay": delays[key], "steps": len(steps), "kind": None}
    return {"nodes": per_node, "step_time": step_time, "slowest": slowest, "network": network,
            "collective": collective, "hosts": hosts}


def _waits(by_rank: dict, left: dict) -> dict[tuple[int, int], tuple[float, int]]:
    """(node, rank) -> (its median wait in the step's collective, over how many steps), over the
    last ``WINDOW`` steps every rank reported both times for; empty unless every rank has them."""
    if not by_rank or set(left) != set(by_rank):
        return {}
    both = set.intersection(*({s for s, t in rep.items() if s in left[k] and left[k][s] >= t}
                              for k, rep in by_rank.items()))
    steps = sorted(both)[-WINDOW:]
    if not steps:
        return {}
    return {k: (statistics.median(left[k][s] - rep[s] for s in steps), len(steps)) for k, rep in by_rank.items()}


#: A pair of nodes is slow when its round trip is this many times the fastest pair's or more.
RTT_RATIO = 4


def _network(links: dict, step_time: float | None) -> dict | None:
    """The slow host (``kind`` "host"), or the slow link between two nodes ("link"), from each
    node's connections; None when no pair of nodes is slow."""
    owner = {src: node for node, (_, conns) in links.items() for src, _, _, _ in conns}
    rtts: dict[tuple[int, int], list[int]] = {}
    for node, (_, conns) in links.items():
        for src, dst, rtt, _ in conns:
            peer = owner.get(dst)
            if peer is not None and peer != node and rtt > 0:
                rtts.setdefault((min(node, peer), max(node, peer)), []).append(rtt)
    pair = {p: statistics.median(v) / 1e6 for p, v in rtts.items()}
    if not pair:
        return None
    base = min(pair.values()) if len(pair) > 1 else 0.0  # one pair: against the step alone
    floor = THRESHOLD * step_time if step_time else 0.001
    slow = {p: r for p, r in pair.items() if r >= RTT_RATIO * base and r - base >= floor}
    if not slow:
        return None
    others = [r for p, r in pair.items() if p not in slow]
    out = {"others": statistics.median(others) if others else None}
    shared = set.intersection(*(set(p) for p in slow))
    if len(slow) >= 2 and len(shared) == 1:
        node = shared.pop()
        out.update(kind="host", node=node, peers={(p[0] if p[1] == node else p[1]): r for p, r in sorted(slow.items())})
    elif len(slow) == 1:
        (a, b), r = next(iter(slow.items()))
        out.update(kind="link", node=a, peer=b, rtt=r)
    else:
        return None  # slow pairs with no one host in common: nothing to name honestly
    return out


def describe(s: dict) -> str:
    """``node 0: step 63, 0.60 s/step; node 1: ...; slowest: rank 1 (node 0), 0.50 s behind the
    median rank each step (83% of the 0.60 s step), over the last 50 steps: a slow rank (...)``,
    or ``...; slowest: node 1 (h1; ranks 2, 3), a slow host's network: ...``."""
    if not s["nodes"]:
        return ""
    parts = [f"node {k}: step {v['step']}" + (f", {v['step_time']:.2f} s/step" if v["step_time"] else "")
             for k, v in s["nodes"].items()]
    text = "; ".join(parts)
    hosts = s.get("hosts") or {}

    def name(node: int) -> str:
        return f"node {node} ({hosts[node]})" if node in hosts else f"node {node}"

    net = s.get("network")
    if net and net["kind"] == "host":
        ranks = ", ".join(map(str, net["ranks"]))
        node = f"node {net['node']} ({net['host'] + '; ' if net['host'] else ''}ranks {ranks})"
        text += (f"; slowest: {node}, a slow host's network: round trip "
                 + ", ".join(f"{1e3 * r:.1f} ms to {name(p)}" for p, r in net["peers"].items()))
        if net["others"] is not None:
            text += f", {1e3 * net['others']:.2f} ms between the others"
    elif net:
        text += (f"; slow link: {name(net['node'])} <-> {name(net['peer'])}, round trip {1e3 * net['rtt']:.1f} ms"
                 + (f", {1e3 * net['others']:.2f} ms between the others" if net["others"] is not None
                    else " (two nodes: which end is slow cannot be told)"))
    if net and s.get("collective") and s["step_time"]:
        text += (f"; every rank waits {s['collective']:.2f} s or more in each step's collective "
                 f"({100 * s['collective'] / s['step_time']:.0f}% of the {s['step_time']:.2f} s step)")
    sl = s["slowest"]
    if sl:
        text += (f"; slowest: rank {sl['rank']} (node {sl['node']}), {sl['delay']:.2f} s behind the median rank each "
                 f"step ({100 * sl['delay'] / s['step_time']:.0f}% of the {s['step_time']:.2f} s step), "
                 f"over the last {sl['steps']} steps")
        if sl.get("kind") == "compute":
            text += (f": a slow rank (it computes {sl['delay']:.2f} s longer: it waits {sl['wait']:.2f} s in each "
                     f"step's collective, the median rank {sl['median_wait']:.2f} s)")
    return text
