"""Planned maintenance on SLURM (docs/recovery.md): beside a batch script's trainer step, asks
slurmctld every EVERY s whether a host of the step is drained or in a MAINT reservation that
begins before the job ends; then prints ``HOST SPARE WHY`` lines (exit 0), or, with no spare
left, says so (exit 1). Standard library only.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from .spares import ask, expand, hosts, job_fields, parse_words
from .text import escape_controls

# What scontrol prints (src/api/node_info.c and reservation_info.c, slurm-22-05-11-1 to
# slurm-26-05-3-1): a node's ``State=BASE+FLAG+FLAG`` (node_state_string_complete in
# src/common/slurm_protocol_defs.c; the drain flag is "DRAIN" there, whatever the base:
# IDLE+DRAIN is sinfo's "drained", ALLOCATED+DRAIN / MIXED+DRAIN its "draining"), and its
# ``Reason=TEXT [USER@TIME]``; a reservation's ``StartTime= EndTime= Nodes= Flags=A,B``
# (reservation_flags_string: "MAINT"). Times in SLURM_TIME_FORMAT=standard: %Y-%m-%dT%H:%M:%S,
# local time; "Unknown" or "None" where there is none.
DRAIN = "DRAIN"
MAINT = "MAINT"
#: At most this many records of each kind are read (a site's reservations, the job's nodes).
MOST = 4096


def when(text: str | None) -> float | None:
    """A standard SLURM time as epoch seconds; None for anything else ("Unknown", "None")."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def records(text: str, head: str) -> list[dict[str, str]]:
    """``scontrol -o show node|reservation``'s records (one a line, starting ``head=``)."""
    return [parse_words(line, {}) for line in text.splitlines()[:MOST] if line.startswith(head + "=")]


def drained(nodes: list[dict[str, str]]) -> dict[str, str]:
    """HOST -> why, for the nodes whose State carries the DRAIN flag."""
    out = {}
    for n in nodes:
        if DRAIN in (n.get("State") or "").split("+")[1:]:
            reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", n.get("Reason") or "")
            out[n.get("NodeName", "")] = f"drained: {reason}" if reason and reason != "(null)" else "drained"
    return out


def reserved(resvs: list[dict[str, str]], end: float | None, now: float, expand_nodes=expand) -> dict[str, str]:
    """HOST -> why, for the hosts of each MAINT reservation not yet over that begins before
    ``end`` (the job's EndTime; None: unknown, so any)."""
    out: dict[str, str] = {}
    for r in resvs:
        if MAINT not in (r.get("Flags") or "").split(","):
            continue
        start, stop = when(r.get("StartTime")), when(r.get("EndTime"))
        if (stop is not None and stop <= now) or (start is not None and end is not None and start >= end):
            continue
        nodes = r.get("Nodes") or ""
        for h in expand_nodes(nodes) if nodes and nodes != "(null)" else []:
            out.setdefault(h, f"maintenance reservation {r.get('ReservationName', '?')} from {r.get('StartTime', '?')}")
    return out


def leaving(ranks: list[str], allocation: list[str], used: list[str], away: dict[str, str]) -> list[tuple[str, str, str]]:
    """(host, spare, why) for each host of ``ranks`` in ``away``, in rank order; spare "" once
    the free ones (the allocation's hosts off the rank map, not ``used``, not ``away``) ran out."""
    free = [h for h in allocation if h not in ranks and h not in used and h not in away]
    out = []
    for h in ranks:
        if h in away:
            out.append((h, free.pop(0) if free else "", " ".join(escape_controls(away[h]).split())[:200]))
    return out


def check(job: str, ranks: list[str], used: list[str]) -> list[tuple[str, str, str]]:
    """:func:`leaving` for job ``job`` now: three scontrol calls (the job, its nodes, the reservations)."""
    fields = job_fields(job)
    allocation = expand(fields.get("NodeList", ""))
    away = drained(records(ask(["scontrol", "-o", "show", "node", ",".join(allocation)]), "NodeName")) \
        if allocation else {}
    resvs = records(ask(["scontrol", "-o", "show", "reservation"]), "ReservationName")
    if any(MAINT in (r.get("Flags") or "").split(",") for r in resvs):
        away = {**reserved(resvs, when(fields.get("EndTime")), time.time()), **away}
    return leaving(ranks, allocation, used, away)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m halo_sched.node.maintenance")
    for name in ("job", "ranks", "used"):
        p.add_argument("--" + name, default="")
    p.add_argument("--every", type=float, default=30.0)
    a = p.parse_args(argv)
    os.environ["SLURM_TIME_FORMAT"] = "standard"
    ranks, used = hosts(a.ranks), hosts(a.used)
    parent = os.getppid()  # the batch script's watcher: gone (the step ended), so is this
    while os.getppid() == parent:
        try:
            found = check(a.job, ranks, used)
        except (OSError, subprocess.SubprocessError, ValueError):
            found = []
        if any(spare for _, spare, _ in found):
            print("".join(f"{h} {s or '-'} {why}\n" for h, s, why in found), end="", flush=True)
            return 0
        if found:
            print(f"halo-sched: job {a.job}: {', '.join(f'{h} ({why})' for h, _, why in found)} to leave for "
                  "maintenance, and no spare left: the job runs on until the maintenance stops it", file=sys.stderr, flush=True)
            return 1
        until = time.monotonic() + max(a.every, 0.5)
        while time.monotonic() < until and os.getppid() == parent:
            time.sleep(0.5)
    return 1


if __name__ == "__main__":
    sys.exit(main())
