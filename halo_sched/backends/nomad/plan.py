"""What halo-sched says before a Nomad job runs (pure): Nomad's plan per task group, the features
the job needs that the server may lack, and the client settings it needs.

``plan`` (``POST /v1/job/:id/plan``) answers per task group: ``trainer`` (count N) and one per
server role. A group that places only partly says how many of its count did not place, and why.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .names import TRAINER_GROUP
from .state import describe_alloc_metric


@dataclass
class GroupPlacement:
    """Whether the scheduler could place one task group in a plan, and if not, why."""

    group: str
    can_place: bool
    place: int = 0  # allocations the plan would create for this group
    unplaced: int = 0  # of those, how many found no node
    nodes_evaluated: int = 0
    nodes_filtered: int = 0
    nodes_exhausted: int = 0
    constraint_filtered: dict[str, int] = field(default_factory=dict)
    class_filtered: dict[str, int] = field(default_factory=dict)
    dimension_exhausted: dict[str, int] = field(default_factory=dict)
    class_exhausted: dict[str, int] = field(default_factory=dict)
    nodes_available: dict[str, int] = field(default_factory=dict)
    reason: str = ""


def _natural_key(name: str) -> tuple:
    """``trainer`` first, then the others by name, ``server-a2`` before ``server-a10``."""
    return (name != TRAINER_GROUP, *(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)))


def plan_summary(plan_response: dict) -> list[GroupPlacement]:
    """Per task group of a plan: can it place now, and why not."""
    plan = plan_response or {}
    updates = ((plan.get("Annotations") or {}).get("DesiredTGUpdates")) or {}
    failed = plan.get("FailedTGAllocs") or {}
    diff_groups = [g.get("Name") for g in ((plan.get("Diff") or {}).get("TaskGroups") or []) if g.get("Name")]
    names = sorted(set(updates) | set(failed) | set(diff_groups), key=_natural_key)
    out = []
    for name in names:
        m = failed.get(name)
        place = int((updates.get(name) or {}).get("Place") or 0)
        if m is None:
            out.append(GroupPlacement(group=name, can_place=True, place=place))
            continue
        out.append(GroupPlacement(
            group=name,
            can_place=False,
            place=place,
            # The scheduler records the first failure and counts the rest as coalesced
            # (scheduler/generic_sched.go computePlacements).
            unplaced=1 + int(m.get("CoalescedFailures") or 0),
            nodes_evaluated=int(m.get("NodesEvaluated") or 0),
            nodes_filtered=int(m.get("NodesFiltered") or 0),
            nodes_exhausted=int(m.get("NodesExhausted") or 0),
            constraint_filtered=dict(m.get("ConstraintFiltered") or {}),
            class_filtered=dict(m.get("ClassFiltered") or {}),
            dimension_exhausted=dict(m.get("DimensionExhausted") or {}),
            class_exhausted=dict(m.get("ClassExhausted") or {}),
            nodes_available=dict(m.get("NodesAvailable") or {}),
            reason=describe_alloc_metric(name, m),
        ))
    return out


def plan_warnings(plan_response: dict) -> list[str]:
    """Nomad's plan/register warnings (one multi-line string, "N warnings:\\n\\n* ...") as a list."""
    text = (plan_response or {}).get("Warnings") or ""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or re.fullmatch(r"\d+ warnings?( occurred)?:", line):
            continue
        lines.append(line[2:] if line.startswith("* ") else line)
    return lines


def format_plan(plan_response: dict, job_id: str | None = None) -> str:
    """Human text for a plan: one line per task group, then warnings and a verdict."""
    groups = plan_summary(plan_response)
    blocked = [g for g in groups if not g.can_place]
    total = sum(max(g.place, g.unplaced) for g in groups)
    unplaced = sum(g.unplaced for g in blocked)
    head = f"Plan for job {job_id!r}" if job_id else "Plan"
    lines = [f"{head}: {total - unplaced}/{total} nodes can be placed now"]
    for g in groups:
        if g.can_place:
            lines.append(f"  {g.group}: ok" + (f" (places {g.place})" if g.place else ""))
        else:
            of = f"{g.unplaced} of {max(g.place, g.unplaced)}"
            lines.append(f"  {g.group}: CANNOT place {of}: {g.reason.split(': ', 1)[-1]}")
    warnings = plan_warnings(plan_response)
    if warnings:
        lines.append("Warnings:")
        lines += [f"  - {w}" for w in warnings]
    if blocked:
        names = ", ".join(g.group for g in blocked)
        lines.append(
            "Nomad places allocations independently (no gang scheduling): submitting now would hold GPUs on "
            f"the placeable nodes while {names} {'waits' if len(blocked) == 1 else 'wait'} for capacity."
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- server version


# (feature, the job field that uses it, the first Nomad version that honours it, what an older one does)
FEATURES = (
    ("max_run_duration", "MaxRunDuration", (2, 0, 3),
     "an older server drops it silently (unknown JSON fields are ignored): nothing caps the run time"),
    ("disconnect { replace = false }", "Disconnect", (1, 8, 0),
     "an older server ignores it: a lost node's allocation is replaced and the world never re-forms"),
)


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``"2.0.6"``, ``"2.0.3-beta.1+ent"`` -> ``(2, 0, 3)``; None when unreadable."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def version_warnings(job: dict, server_version: str | None) -> list[str]:
    """One line per feature the job uses that ``server_version`` predates. Unknown version: one
    line saying what could not be checked."""
    used = [(name, need, what) for name, key, need, what in FEATURES
            if any(tg.get(key) is not None for tg in job.get("TaskGroups") or [])]
    if not used:
        return []
    have = parse_version(server_version)
    if have is None:
        return ["could not read the Nomad server version (the token needs node:read or agent:read); not checked: "
                + "; ".join(f"{name} needs Nomad {'.'.join(map(str, need))}+" for name, need, _ in used)]
    return [f"Nomad server {server_version} is older than {'.'.join(map(str, need))}, which {name} needs: {what}"
            for name, need, what in used if have < need]


# --------------------------------------------------------------------------- client settings


def check_clients(needs: list, nodes: list[dict] | None, datacenters: list[str], why_unknown: str = "") -> tuple[bool, list[str]]:
    """Each client setting the job needs (render.client_needs), checked on the nodes that could run
    it: ready, eligible, in the job's datacenters (glob patterns, as Nomad matches them), and among
    those the ones each need applies to. Returns (no verifiable need missing anywhere, lines).
    ``nodes`` None: the node list could not be read (``why_unknown``); everything is unverifiable."""
    import fnmatch

    lines = ["Client settings the job needs:"]
    if nodes is None:
        lines += [f"  unverifiable: {n.line} (could not list the nodes: {why_unknown})" for n in needs]
        return True, lines
    ready = [n for n in nodes if n.get("Status") == "ready" and n.get("SchedulingEligibility", "eligible") == "eligible"
             and any(fnmatch.fnmatchcase(n.get("Datacenter") or "", dc) for dc in datacenters)]
    ok = True
    for need in needs:
        on = [n for n in ready if need.applies(n)]
        if need.check is None:
            lines.append(f"  unverifiable: {need.line} ({need.shown_by})")
            continue
        if not on:
            ok = False
            lines.append(f"  MISSING: {need.line}: no ready node in the job's datacenters could have it "
                         f"({len(ready)} ready; {need.shown_by})")
            continue
        lacking = sorted(n.get("Name") or n.get("ID") or "?" for n in on if not need.check(n))
        if lacking:
            ok = False
            shown = ", ".join(lacking[:10]) + (f" and {len(lacking) - 10} more" if len(lacking) > 10 else "")
            lines.append(f"  MISSING on {len(lacking)} of {len(on)} nodes ({shown}): {need.line} ({need.shown_by}); "
                         "Nomad may place a rank there and its task would fail at start")
        else:
            lines.append(f"  ok on all {len(on)} nodes: {need.line}")
    return ok, lines
