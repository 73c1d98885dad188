"""Which of a NODE_FAIL job's nodes SLURM itself declared down, and which ranks they held.

SLURM ends a job NODE_FAIL when slurmctld stops hearing from one of its nodes (``SlurmdTimeout``:
the node is marked DOWN, ``Reason=Not responding``); the job's record names no node, but the
node's own record does, until the node comes back. A host cut off mid-collective writes nothing
the submitter can read, and its peers' failure lines blame nobody (they crashed waiting for it),
so this is the one place the failed node is named. The node's index in the allocation is its
position in the job's node list (``scontrol show hostnames`` order: the node rank), and its ranks
are the ``[rank R]`` lines srun labelled with that index in the job's output file.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ...node.failures import RankFailure
from ...node.text import open_regular

#: scontrol's node states (and flags after '+') that mean slurmctld lost the node.
DOWN_STATES = ("DOWN", "FAIL", "FAILING", "NOT_RESPONDING")
_MAX_RANKS_SHOWN = 16


@dataclass(frozen=True)
class DownNode(RankFailure):
    """A node of the job that SLURM marked down: the cause of its NODE_FAIL. ``verb`` is what
    failure_classes.classify_failure reads (as for Nomad's lost allocations)."""

    verb: str = "down"
    ranks: tuple[int, ...] = ()

    def how(self) -> str:
        return "down (SLURM)"

    def describe(self) -> str:
        return f"{self.error} [{self.where()} {self.how()} at {time.strftime('%H:%M:%S', time.localtime(self.time))}]"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "ranks": list(self.ranks), "source": "slurm"}


@dataclass(frozen=True)
class LeftNode(DownNode):
    """A host SLURM took out of a ``--no-kill`` job's allocation (it stopped answering, and the
    job ran on without it): the cause the attempt's batch script or guardian found and kept in
    the run's marker (halo_sched/node/successor.py). Its node rank is not known there."""

    verb: str = "left"

    def where(self) -> str:
        return f"node {self.node} ({self.host})" if self.node is not None else f"host {self.host}"

    def how(self) -> str:
        return "left the allocation (SLURM)"


def expand_hostlist(text: str) -> list[str]:
    """SLURM's host list syntax as ``scontrol show hostnames`` expands it: ``h[0-1],gpu[01,03-04]``
    -> h0, h1, gpu01, gpu03, gpu04 (zero padding kept)."""
    out: list[str] = []
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in (p.strip() for p in parts):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]*)\](.*)", part)
        if not m:
            if part:
                out.append(part)
            continue
        head, body, tail = m.groups()
        for rng in body.split(","):
            lo, _, hi = rng.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.extend(f"{head}{n:0{width}d}{rest}" for rest in expand_hostlist(tail) or [""])
    return out


def _ranks_of(outputs, index: int) -> tuple[int, ...]:
    """Ranks srun labelled ``INDEX: [rank R]`` in the job's output files."""
    pat = re.compile(rf"^{index}: \[rank (\d+)\]")
    seen = set()
    for path in outputs:
        try:
            with open_regular(path) as f:
                for line in f:
                    m = pat.match(line)
                    if m:
                        seen.add(int(m[1]))
        except OSError:
            continue
    return tuple(sorted(seen))


def held(outputs, index: int) -> tuple[tuple[int, ...], str]:
    """The ranks node ``index`` held (srun's labels in the output files), and that in words."""
    ranks = _ranks_of(outputs, index)
    return ranks, (f"it held ranks {', '.join(map(str, ranks[:_MAX_RANKS_SHOWN]))}"
                   f"{', ...' if len(ranks) > _MAX_RANKS_SHOWN else ''}" if ranks else "none of its ranks had started")


def down_nodes(transport, job_id: str, nodelist: str | None, outputs) -> list[DownNode]:
    """The job's nodes that SLURM reports down or not responding, in node-rank order."""
    if not nodelist:
        try:
            nodelist = transport.job_info(job_id).get("NodeList")
        except Exception:  # noqa: BLE001 - the job may be gone from slurmctld; nothing to name then
            return []
    hosts = expand_hostlist(nodelist or "")
    partitions = getattr(transport, "partitions", None)
    if not hosts or partitions is None:
        return []
    cluster = job_id.rpartition(":")[0] or None
    try:
        _, nodes = partitions(cluster)
    except Exception:  # noqa: BLE001 - no node records: nothing to name
        return []
    by_name = {str(n.get("NodeName")): n for n in nodes if isinstance(n, dict)}
    out = []
    for index, host in enumerate(hosts):
        rec = by_name.get(host)
        if rec is None:
            continue
        state = str(rec.get("State") or "")
        flags = set(re.split(r"[+*]", state.upper()))
        if not flags & set(DOWN_STATES):
            continue
        ranks, words = held(outputs, index)
        reason = str(rec.get("Reason") or "").split("[")[0].strip()
        error = f"SLURM marked node {index} ({host}) {state}{f' ({reason})' if reason else ''}; {words}"
        out.append(DownNode(node=index, rank=None, local_rank=None, host=host, exit_code=None, signal=None,
                            time=time.time(), error=error[:500], node_name=host, ranks=ranks))
    return out
